"""The capture server's facts journal, end to end: a real server process, the official SDKs.

Every line the server appends gets one journal entry that says where the line is and what its
facts are; a reader then builds that rollout's rows from the journal alone, and they equal the
rows its lines give (issue 19).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import astuple, replace
from pathlib import Path

import httpx
import orjson
import pytest
from polars.testing import assert_frame_equal

from capture_core.facts import FACTS_KEY
from capture_core.facts_journal import JOURNAL_DIR, FactsJournalEntry
from capture_core.testing import request_body
from capture_core.testing._worker_faults import FAULT_HEADER
from ngcapture_viz.load import _scan
from tests.e2e.conftest import Stack
from tests.e2e.test_sdk_capture import CASES
from tests.ngcapture_viz import _reference_scan as reference


def _entries(root: Path, name: str) -> list[FactsJournalEntry]:
    found = []
    for journal in (root / JOURNAL_DIR).iterdir():
        for line in journal.read_bytes().splitlines():
            entry = FactsJournalEntry.model_validate_json(line)
            if entry.file == name:
                found.append(entry)
    return sorted(found, key=lambda entry: entry.offset)


def test_the_server_journals_every_line_and_a_reader_needs_nothing_else(
    stack: Stack, rollout_id: str
) -> None:
    for call, _dialect, _streamed, anthropic_style in CASES.values():
        call(stack.base(rollout_id, v1=not anthropic_style))
    for fault in ("500", "inband_error"):
        httpx.post(f"{stack.base(rollout_id)}/chat/completions", headers={FAULT_HEADER: fault},
                   json=request_body("chat"), timeout=30)  # fmt: skip
    path = stack.store.path_for(rollout_id)
    data = path.read_bytes()
    lines = data.splitlines()
    assert len(lines) == len(CASES) + 2
    # Noted before the answer was released: there when the client has it.
    entries = _entries(stack.store.root, path.name)
    assert len(entries) == len(lines)
    offset = 0
    for entry, line in zip(entries, lines, strict=True):
        assert (entry.offset, entry.length) == (offset, len(line))
        record = orjson.loads(line)
        assert record[FACTS_KEY] == entry.ngcapture_facts
        assert entry.model_call_id == record["model_call_id"]
        assert entry.error_category == record["error_category"]
        offset += len(line) + 1
    stat = os.stat(path)
    assert (entries[-1].size, entries[-1].mtime_ns, entries[-1].inode) == (
        stat.st_size, stat.st_mtime_ns, stat.st_ino,
    )  # fmt: skip
    categories = [entry.error_category for entry in entries]
    assert (categories.count(None), categories.count("upstream_error")) == (len(CASES), 2)

    later = time.time_ns() + 60 * 1_000_000_000  # not within the racy window
    task = _scan.FileTask(str(path), path.name, rollout_id, scan_ns=later)
    mine = _scan.scan_files([task])
    assert mine.decoded == {"facts": 0, "bodies": 0, "exact": 0, "journal": len(lines)}
    theirs = reference.scan_files([reference.FileTask(str(path), path.name, rollout_id,
                                                      scan_ns=later)])  # fmt: skip
    assert_frame_equal(mine.calls, theirs.calls, check_exact=True)
    assert_frame_equal(mine.tool_calls, theirs.tool_calls, check_exact=True)
    # Nothing of the file was read, so nothing hashed; else the state the lines give.
    (state,), (their_state,) = mine.states, theirs.states
    assert (state.head_hash, state.tail_hash) == (None, None)
    assert replace(state, head_hash=their_state.head_hash, tail_hash=their_state.tail_hash) == (
        _scan.FileState(*astuple(their_state))
    )


@pytest.mark.parametrize("case", ["chat-stream-tools"])
def test_a_file_appended_to_by_hand_is_read_from_its_lines(
    stack: Stack, rollout_id: str, case: str
) -> None:
    call, _dialect, _streamed, anthropic_style = CASES[case]
    call(stack.base(rollout_id, v1=not anthropic_style))
    path = stack.store.path_for(rollout_id)
    with open(path, "ab") as file:
        file.write(path.read_bytes())  # the same line again, by another writer
    later = time.time_ns() + 60 * 1_000_000_000
    mine = _scan.scan_files([_scan.FileTask(str(path), path.name, rollout_id, scan_ns=later)])
    assert "journal" not in mine.decoded and mine.calls.height == 2


def test_lines_appended_together_are_journaled_so_a_reader_needs_nothing_else(
    stack: Stack, rollout_id: str
) -> None:
    """64 calls in flight over 4 rollouts: the appender may write several lines of a file
    under one lock and fsync (``tests/capture_core/appender`` makes sure it does); their
    entries still chain, and each file reads from the journal alone."""
    ids = [f"{rollout_id}-{index}" for index in range(4)]
    body = request_body("chat")

    async def calls() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as client:
            answers = await asyncio.gather(*(
                client.post(f"{stack.base(ids[index % 4])}/chat/completions", json=body)
                for index in range(64)
            ))  # fmt: skip
        return [answer.status_code for answer in answers]

    assert asyncio.run(calls()) == [200] * 64
    later = time.time_ns() + 60 * 1_000_000_000
    for rid in ids:
        path = stack.store.path_for(rid)
        lines = path.read_bytes().splitlines()
        assert len(lines) == 16
        mine = _scan.scan_files([_scan.FileTask(str(path), path.name, rid, scan_ns=later)])
        assert mine.decoded == {"facts": 0, "bodies": 0, "exact": 0, "journal": 16}
        theirs = reference.scan_files([reference.FileTask(str(path), path.name, rid,
                                                          scan_ns=later)])  # fmt: skip
        assert_frame_equal(mine.calls, theirs.calls, check_exact=True)
