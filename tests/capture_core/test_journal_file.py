"""The facts journal's file: opened only inside the capture directory, whole entries after an
earlier writer's torn one."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from capture_core.journal_file import JOURNAL_DIR, JournalFile


def test_a_torn_last_entry_is_closed_so_the_next_reads_whole(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_DIR).mkdir()
    path = tmp_path / JOURNAL_DIR / "t.jsonl"
    path.write_bytes(b'{"file": "a.capture.jsonl"}\n{"file": "b.cap')  # its writer died here
    journal = JournalFile(tmp_path, "t")
    journal.write(b'{"file": "c.capture.jsonl"}\n')
    journal.close()
    assert path.read_bytes().splitlines() == [
        b'{"file": "a.capture.jsonl"}',
        b'{"file": "b.cap',
        b'{"file": "c.capture.jsonl"}',
    ]


def test_a_facts_symlink_is_not_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "calls"
    root.mkdir()
    (root / JOURNAL_DIR).symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING):
        journal = JournalFile(root, "t")
        journal.write(b'{"file": "a.capture.jsonl"}\n')
        journal.close()
    assert list(elsewhere.iterdir()) == []
    assert "no facts journal" in caplog.text
