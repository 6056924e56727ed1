"""Columnar segments of facts journals (``journal_segments``, ``ngcapture compact``).

A segment is a cache of a cache: an open that reads a journal's entries from its segments must
give exactly the frames an open that decodes the journal gives (the oracle: the same store
opened with its segments moved away), and a segment that does not match the journal as it is
now (its name, its bytes, its content) must be ignored, never trusted.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import orjson
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import ngcapture_viz as ngv
from capture_core import CaptureStore
from capture_core.cli import main
from capture_core.facts import FACTS_KEY
from capture_core.facts_journal import JOURNAL_DIR
from capture_core.store import DATA_SUFFIX
from capture_core.writers import CaptureWriter
from ngcapture_viz.load import _file_state, _journal, _journal_files, _scan, journal_segments
from ngcapture_viz.load import _plan as plan_module
from ngcapture_viz.load._line_types import JournalLine, _Facts, _Tool
from ngcapture_viz.load.journal_segments import (
    SEGMENT_FORMAT,
    SEGMENT_SCHEMA,
    Segment,
    segment_chain,
    write_segments,
)
from ngcapture_viz.load.journal_segments import write as segment_writer
from tests.ngcapture_viz.test_facts_journal import (
    _append,
    _journal_path,
    _journaled_appends,
    _lines,
)
from tests.ngcapture_viz.test_facts_journal import _store as _journaled_store

FRAMES = ("calls", "tool_calls", "rollouts", "gaps")
_NAME = re.compile(
    r"^(?P<stem>.+)\.s(?P<format>\d+)\.(?P<inode>\d+)\.(?P<start>\d+)-(?P<end>\d+)"
    r"\.(?P<first>\d+)-(?P<last>\d+)\.(?P<tail>[0-9a-f]{16})\.parquet$"
)


def _tooled(lines: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The lines, every third with several tool calls in its facts (names, arguments, choice
    indexes that differ; one whose arguments did not parse): the factory's have one at most."""
    for number, line in enumerate(lines):
        if number % 3 == 1:
            line[FACTS_KEY]["tool_calls"] = [
                {"call_id": f"c{number}-{i}", "type": "function", "name": f"tool-{(number + i) % 5}",
                 "arguments": orjson.dumps({"i": i, "n": number}).decode(), "choice_index": i % 2}
                for i in range(1 + number % 4)
            ] + [{"name": "broken", "arguments_raw": "{nope", "arguments_parse_error": True}]  # fmt: skip
        yield line


def _store(root: Path, files: int = 24, seed: int = 3) -> dict[str, int]:
    """``test_facts_journal``'s store, with more tool calls; lines per rollout id."""
    return _journaled_store(root, files, seed, lines=_tooled(_lines(seed, files * 6)))


def _segmented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int, at_least: int
) -> tuple[Path, Path, list[Path]]:
    """A store whose journal is compacted into at least ``at_least`` segments (small
    chunks): its root, its journal and the segments in chain order."""
    monkeypatch.setattr(_journal_files, "CHUNK_BYTES", 8192)
    root = tmp_path / "calls"
    _store(root, files=files)
    journal = _journal_path(root)
    paths = [Path(p) for p in write_segments(str(journal))]
    assert len(paths) >= at_least
    return root, journal, paths


@pytest.fixture(autouse=True)
def _settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written a moment ago count as settled (else the journal vouches for none)."""
    for module in (_file_state, plan_module):
        monkeypatch.setattr(module, "RACY_NS", 0)


def _open(root: Path) -> Any:
    """A cold open (no index kept or used)."""
    run = ngv.open_run(root, progress=False, index=False)
    assert run.index_stats is not None
    return run


def _decoded(run: Any) -> dict[str, int]:
    return dict(run.index_stats.decoded)


def _segments(root: Path) -> list[Path]:
    return sorted((root / JOURNAL_DIR).glob("*.parquet"))


@contextmanager
def _segments_hidden(root: Path) -> Iterator[None]:
    hidden = root.parent / f"{root.name}-hidden-segments"
    hidden.mkdir()
    moved = _segments(root)
    for path in moved:
        os.rename(path, hidden / path.name)
    try:
        yield
    finally:
        for path in moved:
            os.rename(hidden / path.name, path)
        hidden.rmdir()


def _without_segments(root: Path) -> Any:
    """The oracle: the store opened with its journals decoded (segments moved away)."""
    with _segments_hidden(root):
        run = _open(root)
    assert "segments" not in _decoded(run)
    return run


def _assert_same(run: Any, oracle: Any) -> None:
    for name in FRAMES:
        mine, theirs = getattr(run, name), getattr(oracle, name)
        assert mine.height == theirs.height, name
        keys = [c for c in ("rollout_id", "call_index", "tool_index", "code", "path")
                if c in mine.columns]  # fmt: skip
        assert_frame_equal(
            mine.sort(keys, nulls_last=True),
            theirs.sort(keys, nulls_last=True),
            check_exact=True,
        )


def _chain(journal: Path) -> list[Segment]:
    fd = os.open(journal, os.O_RDONLY)
    try:
        return segment_chain(str(journal), fd)
    finally:
        os.close(fd)


def _renamed(path: Path, **changes: object) -> Path:
    """Rename segment ``path`` with some parts of its name changed (``format``, ``inode``,
    ``start``, ``end``, ``first``, ``last``, ``tail``)."""
    match = _NAME.match(path.name)
    assert match is not None, path.name
    parts = {**match.groupdict(), **{k: str(v) for k, v in changes.items()}}
    name = (
        f"{parts['stem']}.s{parts['format']}.{parts['inode']}.{parts['start']}-{parts['end']}"
        f".{parts['first']}-{parts['last']}.{parts['tail']}.parquet"
    )
    target = path.with_name(name)
    assert target != path
    os.rename(path, target)
    return target


def _name_part(path: Path, part: str) -> int:
    match = _NAME.match(path.name)
    assert match is not None
    return int(match[part])


def _stamp(paths: list[Path]) -> dict[Path, tuple[int, int, bytes]]:
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes()) for p in paths}


# -- 1. the same frames -----------------------------------------------------------------------


def _damage(root: Path) -> tuple[int, int]:
    """A journal with a garbage line and a blank line inserted in the middle, an entry torn
    (its file no longer covered), entries whose facts are of another version or absent,
    entries with a negative inode, one past 64 bits and an offset past 63 bits, and a torn
    last entry; plus calls journaled without facts. Returns (lines, bad lines)."""
    store, writer = CaptureStore(root), CaptureWriter(root)
    try:
        for rollout, line in zip(("2-0", "nofacts-0"), _lines(51, 2), strict=True):
            line.pop(FACTS_KEY)  # no facts: no entry (the files are read from their lines)
            _append(store, writer, rollout, line)
    finally:
        writer.close()
    # The other writer's journal (no entry in it): the damage goes into the first one.
    path = next(p for p in (root / JOURNAL_DIR).iterdir() if p.stat().st_size)
    entries = path.read_bytes().splitlines(keepends=True)
    entries[5] = entries[5][:60] + b"\n"  # torn: not JSON
    other = orjson.loads(entries[9])
    other[FACTS_KEY]["v"] = 99  # facts of another version
    entries[9] = orjson.dumps(other) + b"\n"
    bare = orjson.loads(entries[12])
    del bare[FACTS_KEY]  # no facts at all
    entries[12] = orjson.dumps(bare) + b"\n"
    for number, field, value in ((14, "inode", -1), (15, "inode", 2**70), (16, "offset", 2**70)):
        wrong = orjson.loads(entries[number])
        wrong[field] = value  # no file's: its file is read from its lines
        entries[number] = json.dumps(wrong).encode() + b"\n"  # orjson stops at 64 bits
    entries[20:20] = [b"\x00garbage{\n", b"\n"]  # extra lines: every later line moves down
    path.write_bytes(b"".join(entries) + b'{"file": "torn')
    return len(entries), 6


@pytest.mark.parametrize("journal", ["clean", "damaged"])
def test_segments_give_the_frames_the_decoded_journal_gives(tmp_path: Path, journal: str) -> None:
    root = tmp_path / "calls"
    _store(root, files=24)
    lines = bad = 0
    if journal == "damaged":
        lines, bad = _damage(root)
    oracle = _open(root)
    assert oracle.calls.height > 0
    assert oracle.tool_calls["tool_index"].max() == 4 and oracle.tool_calls["name"].n_unique() > 5
    assert oracle.calls["error_category"].null_count() < oracle.calls.height  # errors
    assert (oracle.calls["outcome"] == "stream_truncated").any()
    assert "segments" not in _decoded(oracle)
    paths = [p for j in (root / JOURNAL_DIR).glob("*.jsonl") for p in write_segments(str(j))]
    assert paths and [Path(p) for p in sorted(paths)] == _segments(root)
    for journal_path in (root / JOURNAL_DIR).glob("*.jsonl"):
        if not journal_path.stat().st_size:
            continue  # the journal of the calls without facts: no entry
        chain = _chain(journal_path)
        data = journal_path.read_bytes()
        assert chain and chain[-1].end == data.rfind(b"\n") + 1  # all whole lines
        assert chain[-1].end_line == data.count(b"\n")
    run = _open(root)
    _assert_same(run, oracle)
    decoded, before = _decoded(run), _decoded(oracle)
    assert decoded["journal"] == before["journal"]
    if journal == "clean":
        assert decoded["segments"] == decoded["journal"] == run.calls.height
    else:
        # Every journaled row comes from the segment; the damaged entries' files (and the
        # calls without facts) are read from their lines.
        assert decoded["segments"] == decoded["journal"] < run.calls.height
        (path,) = [p for p in _segments(root) if _name_part(p, "last") == lines]
        segment = pl.read_parquet(path)
        assert segment.height == lines - bad and segment["v"].null_count() == 1
        # Each row's ``line`` is the journal line it was decoded from (blank lines counted).
        (journal_path,) = [
            j for j in (root / JOURNAL_DIR).glob("*.jsonl") if path.name.startswith(j.stem)
        ]
        entries = journal_path.read_bytes().split(b"\n")
        for line, file, offset in segment.select("line", "file", "offset").iter_rows():
            entry = orjson.loads(entries[line])
            assert (entry["file"], entry["offset"]) == (file, offset)
    # And the lines themselves say the same (the journal moved away).
    hidden = tmp_path / "hidden"
    os.rename(root / JOURNAL_DIR, hidden)
    try:
        _assert_same(run, _open(root))
    finally:
        os.rename(hidden, root / JOURNAL_DIR)


# -- 2. several segments, and entries after them ----------------------------------------------


@pytest.mark.parametrize("keep", [None, 0], ids=["kept", "decoded-again"])
def test_a_chain_of_segments_and_the_entries_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int | None
) -> None:
    monkeypatch.setattr(_journal_files, "CHUNK_BYTES", 8192)
    monkeypatch.setattr(_scan, "CHUNK_ROWS", 7)  # a segment's rows make several frames
    if keep is not None:  # decoded again, a chunk at a time, after the chain
        monkeypatch.setattr(_journal, "KEEP_ENTRIES", keep)
    root = tmp_path / "calls"
    counts = _store(root, files=24)
    journal = _journal_path(root)
    first = write_segments(str(journal))
    assert len(first) >= 3
    chain = _chain(journal)
    assert [s.path for s in chain] == first
    assert chain[-1].end == journal.stat().st_size
    run = _open(root)
    assert _decoded(run)["segments"] == _decoded(run)["journal"] == sum(counts.values())
    _assert_same(run, _without_segments(root))
    old = _stamp(_segments(root))
    # Appends after the compaction: their entries are decoded, after the chain's.
    _journaled_appends(root, 41, ("0-0", "1-0", "5-0", "new-0", "new-1", "0-0"), journal.stem)
    grown = _open(root)
    decoded = _decoded(grown)
    assert decoded["segments"] == sum(counts.values()) < grown.calls.height
    assert decoded["journal"] == grown.calls.height == sum(counts.values()) + 6
    _assert_same(grown, _without_segments(root))
    # Compacting again writes the new part only, from where the chain ended.
    more = write_segments(str(journal))
    assert more and not set(more) & set(first)
    assert _name_part(Path(more[0]), "start") == chain[-1].end
    assert _name_part(Path(more[0]), "first") == chain[-1].end_line
    assert _stamp([p for p in _segments(root) if p in old]) == old  # none rewritten
    assert set(_segments(root)) == set(old) | {Path(p) for p in more}
    assert write_segments(str(journal)) == []
    assert _stamp([p for p in _segments(root) if p in old]) == old
    whole = _open(root)
    assert _decoded(whole)["segments"] == _decoded(whole)["journal"] == whole.calls.height
    _assert_same(whole, grown)


def test_a_broken_link_ends_the_chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment whose first line is not where the one before ended (or missing) ends the
    chain: the segments before it are read, the rest of the journal is decoded."""
    root, journal, paths = _segmented(tmp_path, monkeypatch, files=24, at_least=3)
    _renamed(paths[1], first=_name_part(paths[1], "first") + 1)
    assert [Path(s.path) for s in _chain(journal)] == paths[:1]
    run = _open(root)
    in_first = pl.read_parquet(paths[0]).height
    assert 0 < _decoded(run)["segments"] <= in_first < _decoded(run)["journal"]
    _assert_same(run, _without_segments(root))


# -- 3. segments that do not match the journal ------------------------------------------------


def _cut_in_place(journal: Path) -> None:
    """The journal cut to its first half of lines (same inode)."""
    lines = journal.read_bytes().splitlines(keepends=True)
    os.truncate(journal, sum(map(len, lines[: len(lines) // 2])))


def _regrown(segment: Path, journal: Path) -> None:
    """The journal cut (same inode), then appended to past the segment's end: other bytes
    there, which only the tail's hash tells."""
    _cut_in_place(journal)
    _journaled_appends(journal.parent.parent, 61, tuple(f"{n % 12}-0" for n in range(36)),
                       journal.stem)  # fmt: skip
    assert journal.stat().st_size > _name_part(segment, "end")


def _replaced(journal: Path) -> None:
    """The journal replaced by a shorter copy (another inode)."""
    copy = journal.with_name("copy")
    copy.write_bytes(journal.read_bytes()[: journal.stat().st_size // 2])
    os.replace(copy, journal)


IGNORED: dict[str, Callable[[Path, Path], object]] = {
    "tail": lambda s, j: _renamed(s, tail="0123456789abcdef"),
    "inode": lambda s, j: _renamed(s, inode=j.stat().st_ino + 1),
    "format 2": lambda s, j: _renamed(s, format=SEGMENT_FORMAT + 1),
    "format 0": lambda s, j: _renamed(s, format=SEGMENT_FORMAT - 1),
    "first line": lambda s, j: _renamed(s, first=1, last=_name_part(s, "last") + 1),
    "not from byte 0": lambda s, j: _renamed(s, start=1),
    "end past the journal": lambda s, j: _cut_in_place(j),
    "journal regrown": _regrown,
    "journal replaced": lambda s, j: _replaced(j),
    "garbage": lambda s, j: s.write_bytes(b"not a parquet file\n" * 50),
    "empty": lambda s, j: s.write_bytes(b""),
    "truncated": lambda s, j: s.write_bytes(s.read_bytes()[: s.stat().st_size // 2]),
    "other columns": lambda s, j: pl.DataFrame({"x": [1, 2]}).write_parquet(s),
    "columns missing": lambda s, j: pl.read_parquet(s).drop("tool_calls", "model").write_parquet(s),
    "a column of another type": lambda s, j: (
        pl.read_parquet(s).with_columns(pl.col("offset").cast(pl.String())).write_parquet(s)
    ),
}


#: Segments whose name matches the journal, but whose content cannot be read as a segment.
UNREADABLE = ("garbage", "empty", "truncated", "other columns", "columns missing",
              "a column of another type")  # fmt: skip


@pytest.mark.parametrize("change", list(IGNORED))
def test_a_segment_that_does_not_match_is_ignored(tmp_path: Path, change: str) -> None:
    root = tmp_path / "calls"
    _store(root, files=12)
    journal = _journal_path(root)
    (segment,) = map(Path, write_segments(str(journal)))
    assert _decoded(_open(root))["segments"] > 0
    IGNORED[change](segment, journal)
    # Named right or not: a segment whose footer is not a segment's is no link of a chain.
    assert _chain(journal) == []
    run = _open(root)  # never raises
    oracle = _without_segments(root)
    _assert_same(run, oracle)
    decoded = _decoded(run)
    assert not decoded.get("segments")
    assert decoded.get("journal") == _decoded(oracle)["journal"] > 0  # its lines decoded
    if change in UNREADABLE:  # compacting again replaces it with a readable one
        assert [Path(p) for p in write_segments(str(journal))] == [segment]
        assert _decoded(_open(root))["segments"] == decoded["journal"]


# -- 4. a segment changed between the two passes ----------------------------------------------


def _rewrite(path: Path, change: Any) -> None:
    frame = pl.read_parquet(path)
    target = path.with_name(".rewrite.tmp")
    change(frame).write_parquet(target)
    os.replace(target, path)  # a new file under the segment's name


BETWEEN: dict[str, Callable[[Path, Path], object]] = {
    "deleted": lambda p, o: p.unlink(),
    "garbage": lambda p, o: p.write_bytes(b"garbage" * 100),
    "another segment": lambda p, o: shutil.copyfile(o, p),
    "another file": lambda p, o: _rewrite(
        p, lambda f: f.with_columns(pl.col("file").shift(1, fill_value=pl.col("file").last()))
    ),
    "another offset": lambda p, o: _rewrite(p, lambda f: f.with_columns(pl.col("offset") + 1)),
    "the same, rewritten": lambda p, o: _rewrite(p, lambda f: f),
}


@pytest.mark.parametrize("change", list(BETWEEN))
def test_a_segment_changed_between_the_passes_gives_no_wrong_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The first pass decides which files the segments cover; the rows are read from the
    segments afterwards. A segment gone or changed meanwhile gives no row: every file is
    read from its lines (a segment rewritten with the same entries is still used)."""
    root, _journal_file, paths = _segmented(tmp_path, monkeypatch, files=16, at_least=2)
    oracle = _without_segments(root)
    real = _journal.Journals.__init__
    done: list[bool] = []

    def then_change(self: _journal.Journals, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        if not done and any(self.chains):
            done.append(True)
            BETWEEN[change](paths[0], paths[1])

    monkeypatch.setattr(_journal.Journals, "__init__", then_change)
    run = _open(root)
    assert done
    _assert_same(run, oracle)
    if change == "the same, rewritten":
        assert _decoded(run)["segments"] == _decoded(run)["journal"] == run.calls.height
    else:
        assert "journal" not in _decoded(run) and "segments" not in _decoded(run)
        assert sum(_decoded(run).values()) == run.calls.height  # all read from the lines


# -- 5. the format is pinned -----------------------------------------------------------------

# A segment holds entries as ``JournalLine`` decoded them, in the columns of SEGMENT_SCHEMA:
# change either (a field, its type or constraint, a default, a column) and segments written
# before would be read as if they held what the new code decodes. Bump SEGMENT_FORMAT, then
# pin the new digest for it here. A change that keeps what segments hold (a rename, a new
# msgspec describing the same types) pins the new digest for the current format.
_PINNED_FIELDS = ("model_call_id", "dialect", "model_ref", "started_at", "completed_at",
                  "latency_ms", "latency_ttft_ms", "status_code", "error_category", "request",
                  "response", "request_raw", "response_raw", "ngcapture_facts", "file", "offset",
                  "length", "size", "mtime_ns", "inode", "size_before", "mtime_before_ns")  # fmt: skip
_PINNED = {
    1: "45abab866cff3b3f5e5532415b89d1dc3d596c528d101b63109ec55fcb60ef48",
    2: "6aac4684627c8dd2db49997e114a5a2c32b346af347c80b1e8e158baf33378bd",  # unsigned inodes
}


def _format_description() -> str:
    lines = [f"JournalLine.__struct_fields__ = {JournalLine.__struct_fields__}"]
    for kind in (JournalLine, _Facts, _Tool):
        for cls in reversed(kind.__mro__):
            if "__annotations__" in vars(cls) and issubclass(cls, msgspec.Struct):
                lines.append(f"{kind.__name__}/{cls.__name__}: {vars(cls)['__annotations__']}")
        lines.append(f"{kind.__name__}: {msgspec.inspect.type_info(kind)!r}")
    lines += [f"SEGMENT_SCHEMA[{name!r}] = {dtype!r}" for name, dtype in SEGMENT_SCHEMA.items()]
    # A default's repr may hold its address (``msgspec.Raw``): not part of the format.
    return re.sub(r" at 0x[0-9a-fA-F]+>", ">", "\n".join(lines))


def test_the_segment_format_is_bumped_when_what_segments_hold_changes() -> None:
    assert SEGMENT_FORMAT == 2
    assert JournalLine.__struct_fields__ == _PINNED_FIELDS, (
        "JournalLine's fields changed: bump SEGMENT_FORMAT (journal_segments), then pin them"
    )
    digest = hashlib.sha256(_format_description().encode()).hexdigest()
    assert SEGMENT_FORMAT in _PINNED, "pin the digest of the new SEGMENT_FORMAT below"
    assert _PINNED[SEGMENT_FORMAT] == digest, (
        "JournalLine, _Facts, _Tool (ngcapture_viz/load/_line_types.py) or SEGMENT_SCHEMA "
        "changed: if what a segment holds changed, bump SEGMENT_FORMAT in "
        f"ngcapture_viz/load/journal_segments/schema.py; then pin {digest} for it in this test"
    )


# -- 6. ngcapture compact ---------------------------------------------------------------------


def test_ngcapture_compact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "calls"
    _store(root, files=6)
    assert main(["compact", str(root)]) == 0
    written = _segments(root)
    assert len(written) == 1
    assert "wrote 1 segment(s) for 1 journal(s)" in capsys.readouterr().out
    stamps = _stamp(written)
    assert main(["compact", "--quiet", str(root)]) == 0
    assert capsys.readouterr() == ("", "")
    assert _stamp(_segments(root)) == stamps  # nothing new, nothing rewritten
    decoded = _decoded(_open(root))
    assert decoded["segments"] == decoded["journal"] > 0
    # No journal here: a user's mistake, one line naming the path.
    bare = tmp_path / "bare"
    bare.mkdir()
    assert main(["compact", str(bare)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bare) in err and "error" in err
    assert main(["compact", str(tmp_path / "missing")]) == 2
    assert str(tmp_path / "missing") in capsys.readouterr().err
    # One journal file.
    other = tmp_path / "other"
    _store(other, files=4, seed=5)
    journal = _journal_path(other)
    assert main(["compact", str(journal)]) == 0
    assert len(_segments(other)) == 1 and _chain(journal)[-1].end == journal.stat().st_size
    # A capture file is no journal: no segment written beside it (a foreign file there).
    not_a_journal = other / f"0-0{DATA_SUFFIX}"
    assert main(["compact", str(not_a_journal)]) == 2
    assert str(not_a_journal) in capsys.readouterr().err
    assert journal_segments.journal_files(str(not_a_journal)) == []
    assert not list(other.glob("*.parquet"))
    assert _open(other).gaps.height == 0


# -- 7. what compacting leaves on disk ------------------------------------------------------------


def test_segments_get_the_journal_s_permissions(tmp_path: Path) -> None:
    root = tmp_path / "calls"
    _store(root, files=4)
    journal = _journal_path(root)
    for mode in (0o600, 0o640):  # what the server's umask gave the journal
        for segment in _segments(root):
            segment.unlink()
        journal.chmod(mode)
        (segment,) = map(Path, write_segments(str(journal)))
        assert stat.S_IMODE(segment.stat().st_mode) == mode


def test_compacting_removes_segments_of_a_replaced_journal_and_abandoned_files(
    tmp_path: Path,
) -> None:
    root = tmp_path / "calls"
    _store(root, files=4)
    journal = _journal_path(root)
    (old,) = map(Path, write_segments(str(journal)))
    other_format = _renamed(old, format=SEGMENT_FORMAT + 1)
    # The journal replaced (a copy: another inode); a killed run's temporary file, an hour old,
    # and a fresh one (a run going on now).
    copy = journal.with_name("copy")
    copy.write_bytes(journal.read_bytes())
    os.replace(copy, journal)
    abandoned = journal.parent / ".segment-abandoned.tmp"
    abandoned.write_bytes(b"x")
    os.utime(abandoned, (time.time() - 7200, time.time() - 7200))
    running = journal.parent / ".segment-running.tmp"
    running.write_bytes(b"x")
    (new,) = map(Path, write_segments(str(journal)))
    assert _name_part(new, "inode") == journal.stat().st_ino
    left = {path.name for path in journal.parent.iterdir()}
    assert left == {journal.name, new.name, running.name}, (other_format, left)


def test_compacting_removes_older_format_segments_and_keeps_newer_ones(tmp_path: Path) -> None:
    """After an upgrade the old format's segments are dead weight (no reader of this version
    reads them); a newer version's are some other reader's, and stay."""
    root = tmp_path / "calls"
    _store(root, files=4)
    journal = _journal_path(root)
    (first,) = map(Path, write_segments(str(journal)))
    older = _renamed(first, format=SEGMENT_FORMAT - 1)
    (second,) = map(Path, write_segments(str(journal)))
    newer = _renamed(second, format=SEGMENT_FORMAT + 1)
    (current,) = map(Path, write_segments(str(journal)))
    assert not older.exists()
    left = {path.name for path in journal.parent.iterdir()}
    assert left == {journal.name, newer.name, current.name}
    assert _name_part(current, "format") == SEGMENT_FORMAT


def test_compacting_a_journal_it_cannot_write_beside_fails_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "calls"
    _store(root, files=3)

    def full(*args: object, **kwargs: object) -> tuple[int, str]:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(segment_writer.tempfile, "mkstemp", full)  # the disk is full
    assert main(["compact", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err
    assert not _segments(root)


def test_a_segment_with_a_null_where_entries_have_values_is_not_used(tmp_path: Path) -> None:
    root = tmp_path / "calls"
    _store(root, files=8)
    journal = _journal_path(root)
    (segment,) = map(Path, write_segments(str(journal)))
    oracle = _without_segments(root)
    for column in ("tool_calls", "model_call_id", "offset"):
        frame = pl.read_parquet(segment)
        nulled = frame.with_columns(
            pl.when(pl.col("line") == frame["line"][1]).then(None).otherwise(pl.col(column))
            .alias(column)
        )  # fmt: skip
        nulled.write_parquet(segment)
        run = _open(root)  # never raises
        _assert_same(run, oracle)
        assert not _decoded(run).get("segments"), column
        frame.write_parquet(segment)
    assert _decoded(_open(root))["segments"] > 0  # restored: used again
