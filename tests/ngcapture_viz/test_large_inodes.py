"""Stores on file systems whose inode numbers use all 64 bits (``st_ino`` ≥ 2**63: some network
and parallel file systems hash their file ids into the whole range).

A signed 64-bit column cannot hold such a number: opening a store there used to fail in Polars
with a ``TypeError``. No local file system hands out such numbers, so every ``stat`` of the
test (the capture writer's and the reader's alike) reports the real inode with its top bit set:
the numbers stay distinct and stable, as a real file system's are. The store written and read
that way must give the same frames as the same store read without the shift, cold, from its
journal's columnar segments, warm and after appends.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import ngcapture_viz as ngv
from ngcapture_viz.load import _file_state
from ngcapture_viz.load import _plan as plan_module
from ngcapture_viz.load.journal_segments import journal_files, write_segments
from tests.ngcapture_viz.test_facts_journal import _lines, _store, _writer_appends
from tests.ngcapture_viz.test_journal_segments import _assert_same

TOP_BIT = 1 << 63
_REAL = {name: getattr(os, name) for name in ("stat", "fstat", "lstat")}


class _TopBitInode:
    """A ``stat`` result whose ``st_ino`` has its top bit set; everything else as it was."""

    __slots__ = ("_stat",)

    def __init__(self, stat: os.stat_result) -> None:
        self._stat = stat

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stat, name)

    @property
    def st_ino(self) -> int:
        return self._stat.st_ino | TOP_BIT


@pytest.fixture
def wide_inodes(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, real in _REAL.items():

        def shifted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            return _TopBitInode(_real(*args, **kwargs))

        monkeypatch.setattr(os, name, shifted)
    for module in (_file_state, plan_module):
        monkeypatch.setattr(module, "RACY_NS", 0)  # files written a moment ago count as old


def _plain(root: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The same store read line by line with the real inode numbers, no index."""
    with monkeypatch.context() as plain:
        for name, real in _REAL.items():
            plain.setattr(os, name, real)
        assert os.stat(root).st_ino < TOP_BIT
        return ngv.open_run(root, progress=False, index=False)


@pytest.mark.usefixtures("wide_inodes")
def test_a_store_whose_inodes_use_the_top_bit_opens_cold_warm_and_after_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "calls"
    index_dir = tmp_path / "index"
    counts = _store(root, files=12)
    assert os.stat(root / "0-0.capture.jsonl").st_ino >= TOP_BIT

    cold = ngv.open_run(root, progress=False, index_dir=index_dir)
    assert cold.index_stats is not None
    assert cold.index_stats.decoded.get("journal") == sum(counts.values())
    _assert_same(cold, _plain(root, monkeypatch))
    files = pl.read_parquet(next(index_dir.glob("files-*.parquet")))
    assert files["inode"].dtype == pl.UInt64()
    assert files["inode"].min() >= TOP_BIT

    warm = ngv.open_run(root, progress=False, index_dir=index_dir)
    assert warm.index_stats is not None
    assert warm.index_stats.reused == len(counts) and warm.index_stats.bytes_parsed == 0
    _assert_same(warm, cold)

    # Appends through the journaling writer: read from the journal, from where it ended.
    store = _writer_appends(root, 7, ("0-0", "1-0", "new-0"))
    again = ngv.open_run(root, progress=False, index_dir=index_dir)
    assert again.index_stats is not None
    assert (again.index_stats.appended, again.index_stats.new) == (2, 1)
    assert again.index_stats.decoded.get("journal") == 3
    _assert_same(again, _plain(root, monkeypatch))

    # Another writer's append: no journal entry, so the file is read from its lines.
    store.record("2-0", next(_lines(8, 1)))
    third = ngv.open_run(root, progress=False, index_dir=index_dir)
    assert third.index_stats is not None and third.index_stats.reread == 1
    _assert_same(third, _plain(root, monkeypatch))

    # Replaced by a copy of the same size and mtime: only the inode tells (its low bits, the
    # top one set in both), and the file is read again.
    replaced = root / "4-0.capture.jsonl"
    before = os.stat(replaced)
    copy = root / "copy.tmp"
    shutil.copyfile(replaced, copy)
    os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(copy, replaced)
    after = os.stat(replaced)
    assert after.st_ino != before.st_ino and after.st_ino >> 63 == before.st_ino >> 63 == 1
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    fourth = ngv.open_run(root, progress=False, index_dir=index_dir)
    assert fourth.index_stats is not None
    assert (fourth.index_stats.reread, fourth.index_stats.reused) == (1, len(counts))
    _assert_same(fourth, third)


@pytest.mark.usefixtures("wide_inodes")
def test_journal_segments_hold_inodes_that_use_the_top_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "calls"
    counts = _store(root, files=10)
    (journal,) = journal_files(str(root))
    (segment,) = write_segments(journal)
    assert f".{os.stat(journal).st_ino}." in os.path.basename(segment)
    inodes = pl.read_parquet(segment, columns=["inode"])["inode"]
    assert inodes.dtype == pl.UInt64() and inodes.min() >= TOP_BIT

    run = ngv.open_run(root, progress=False, index_dir=tmp_path / "index")
    assert run.index_stats is not None
    assert run.index_stats.decoded.get("segments") == sum(counts.values())
    _assert_same(run, _plain(root, monkeypatch))
    shutil.rmtree(tmp_path / "index")
