"""Rows from the capture server's facts journal (issue 19), against today's reader.

Stores are written the way the server writes them: ``CaptureStore.append`` then
``CaptureWriter.note_facts``. Every file the journal accounts for must give the rows and index
state the lines themselves give (the oracle is ``_reference_scan``, the reader as it was); every
file it does not (edited, appended to by another writer, torn, rewritten, lines missing from the
journal, a damaged journal) must be read from its lines, and the rows still be the same.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import orjson
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import ngcapture_viz as ngv
from capture_core import CaptureStore
from capture_core.facts import FACTS_KEY, FACTS_VERSION, call_facts
from capture_core.facts_journal import (
    JOURNAL_DIR,
    FactsJournal,
    FactsJournalEntry,
    journal_entry,
)
from capture_core.store import DATA_SUFFIX
from capture_core.testing import CaptureLineFactory
from capture_core.writers import CaptureWriter
from ngcapture_viz.load import _file_state, _journal, _journal_files, _scan
from ngcapture_viz.load import _plan as plan_module
from ngcapture_viz.load import index as index_module
from tests.ngcapture_viz import _reference_scan as reference

#: A scan this far after the files were written does not find them racy.
LATER_NS = 60 * 1_000_000_000


def _lines(seed: int, n: int) -> Iterator[dict[str, Any]]:
    factory = CaptureLineFactory(seed=seed, error_rate=0.2, truncation_rate=0.2)
    for line in factory.lines(n):
        data = line.to_json_dict()
        yield {**data, FACTS_KEY: call_facts(data["dialect"], data["request"], data["response"])}


def _store(
    root: Path, files: int = 24, seed: int = 3, lines: Iterator[dict[str, Any]] | None = None
) -> dict[str, int]:
    """Rollout files written through a writer that journals them (``lines``: at least
    ``files * 6`` to write, else ``_lines``'); lines per rollout id."""
    store = CaptureStore(root, create=True)
    writer = CaptureWriter(root)
    counts: dict[str, int] = {}
    lines = _lines(seed, files * 6) if lines is None else lines
    try:
        for number in range(files):
            rollout = f"{number}-0"
            counts[rollout] = 1 + number % 6
            for _ in range(counts[rollout]):
                _append(store, writer, rollout, next(lines))
    finally:
        writer.close()
    return counts


def _append(store: CaptureStore, writer: CaptureWriter, rollout: str, line: dict[str, Any]) -> None:
    writer.note_facts(f"{rollout}{DATA_SUFFIX}", store.append(rollout, line), line)


def _writer_appends(root: Path, seed: int, rollouts: tuple[str, ...]) -> CaptureStore:
    """One line appended to each of ``rollouts`` through a writer that journals them; the
    store, for appends of another writer."""
    store, writer = CaptureStore(root), CaptureWriter(root)
    try:
        for line, rollout in zip(_lines(seed, len(rollouts)), rollouts, strict=True):
            _append(store, writer, rollout, line)
    finally:
        writer.close()
    return store


def _tasks(module: Any, root: Path, scan_ns: int) -> list[Any]:
    names = sorted(n for n in os.listdir(root) if n.endswith(DATA_SUFFIX))
    return [
        module.FileTask(str(root / n), n, n.removesuffix(DATA_SUFFIX), scan_ns=scan_ns)
        for n in names
    ]


def _scan_same(root: Path, *, later: bool = True, verify: bool = False) -> _scan.ScanResult:
    """The scan (journal and all) gives the reference reader's rows and states; returns it."""
    scan_ns = time.time_ns() + (LATER_NS if later else 0)
    old = reference.scan_files(_tasks(reference, root, scan_ns))
    new = _scan.scan_files(_tasks(_scan, root, scan_ns), verify=verify)
    assert_frame_equal(
        new.calls.sort("path", "call_index"), old.calls.sort("path", "call_index"), check_exact=True
    )
    order = ("rollout_id", "call_index", "tool_index")
    assert_frame_equal(new.tool_calls.sort(order), old.tool_calls.sort(order), check_exact=True)
    damaged = ("path", "call_index", "code")
    if not verify:
        assert_frame_equal(new.damaged.sort(damaged), old.damaged.sort(damaged), check_exact=True)
    # A file read from the journal has no byte hashed (its hashes are None); else the same.
    assert sorted(map(_unhashed, new.states)) == sorted(map(_unhashed, old.states))
    by_name = {s.name: s for s in old.states}
    for state in new.states:
        if state.head_hash is not None:
            assert dataclasses.astuple(state) == dataclasses.astuple(by_name[state.name])
    return new


def _unhashed(state: Any) -> tuple[Any, ...]:
    values = dataclasses.asdict(state)
    return tuple(v for k, v in values.items() if k not in ("head_hash", "tail_hash"))


def _journal_path(root: Path) -> Path:
    (path,) = (root / JOURNAL_DIR).iterdir()
    return path


def test_every_appended_line_has_an_entry_that_says_where_it_is(tmp_path: Path) -> None:
    counts = _store(tmp_path)
    entries = [
        FactsJournalEntry.model_validate_json(line)
        for line in _journal_path(tmp_path).read_bytes().splitlines()
    ]
    assert len(entries) == sum(counts.values())
    for entry in entries:
        data = (tmp_path / entry.file).read_bytes()
        line = orjson.loads(data[entry.offset : entry.offset + entry.length])
        assert data[entry.offset + entry.length : entry.offset + entry.length + 1] == b"\n"
        assert line["model_call_id"] == entry.model_call_id
        assert line[FACTS_KEY] == entry.ngcapture_facts
    last = {entry.file: entry for entry in entries}
    for name, entry in last.items():
        stat = (tmp_path / name).stat()
        assert (entry.size, entry.mtime_ns, entry.inode) == (
            stat.st_size,
            stat.st_mtime_ns,
            stat.st_ino,
        )


def test_a_line_without_current_facts_gets_no_entry() -> None:
    from capture_core._appending import Appended

    at = Appended(10, True, 0, 10, 1, 1)
    assert journal_entry("a.capture.jsonl", at, {"model_call_id": "c", "dialect": "chat"}) is None
    old = {"model_call_id": "c", "dialect": "chat", FACTS_KEY: {"v": 0}}
    assert journal_entry("a.capture.jsonl", at, old) is None


def test_a_journaled_store_is_read_from_its_journal_with_the_same_rows(tmp_path: Path) -> None:
    counts = _store(tmp_path)
    result = _scan_same(tmp_path)
    assert result.decoded.get("journal") == sum(counts.values())
    assert result.decoded["facts"] == result.decoded["bodies"] == 0
    assert result.bytes_parsed == 0  # not one capture byte read
    assert all(s.head_hash is None and s.tail_hash is None for s in result.states)


def test_files_modified_within_the_racy_window_are_read_from_their_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (_file_state, reference):  # racy for both readers, however slow the fsyncs
        monkeypatch.setattr(module, "RACY_NS", 600 * 1_000_000_000)
    _store(tmp_path)
    result = _scan_same(tmp_path, later=False)
    assert "journal" not in result.decoded


def test_verify_never_reads_the_journal(tmp_path: Path) -> None:
    _store(tmp_path, files=6)
    result = _scan_same(tmp_path, verify=True)
    assert "journal" not in result.decoded
    assert result.decoded["bodies"] > 0


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] = ord("#") if data[at] != ord("#") else ord("%")
    path.write_bytes(bytes(data))


def test_files_the_journal_does_not_account_for_are_read_from_their_lines(tmp_path: Path) -> None:
    counts = _store(tmp_path)
    store = CaptureStore(tmp_path)
    spare = _lines(99, 20)
    touched = {}
    # A byte of a body changed (same size, the mtime moves).
    body = tmp_path / f"1-0{DATA_SUFFIX}"
    _flip(body, body.read_bytes().index(b'"request":{') + 10)  # JSON no more
    touched["1-0"] = counts["1-0"]
    # A line another writer appended (no entry).
    store.record("2-0", next(spare))
    touched["2-0"] = counts["2-0"] + 1
    # A torn tail.
    with open(tmp_path / f"3-0{DATA_SUFFIX}", "ab") as file:
        file.write(b'{"model_call_id": "torn", "dial')
    touched["3-0"] = counts["3-0"] + 1
    # A line in the middle without its entry, then journaled ones after it.
    writer = CaptureWriter(tmp_path)
    try:
        store.record("4-0", next(spare))
        _append(store, writer, "4-0", next(spare))
        touched["4-0"] = counts["4-0"] + 2
        # Cleared and written again: a new inode, and entries of the old one in the journal.
        store.clear("5-0")
        for _ in range(2):
            _append(store, writer, "5-0", next(spare))
        touched["5-0"] = 2
    finally:
        writer.close()
    # Written by another writer alone.
    for _ in range(3):
        store.record("other-0", next(spare))
    touched["other-0"] = 3
    result = _scan_same(tmp_path)
    from_journal = sum(counts.values()) - sum(counts[r] for r in touched if r in counts)
    # 5-0, rewritten and journaled again, is read from the journal when its new inode differs
    # from the old; a reused inode number makes the old entries' offsets repeat: its lines.
    assert from_journal <= result.decoded["journal"] <= from_journal + 2
    assert result.damaged.height >= 2  # the flipped body and the torn tail


def test_a_damaged_journal_costs_only_the_files_of_its_bad_entries(tmp_path: Path) -> None:
    counts = _store(tmp_path)
    path = _journal_path(tmp_path)
    entries = path.read_bytes().splitlines(keepends=True)
    lost = {orjson.loads(entries[i])["file"] for i in (3, 10)}
    entries[3] = entries[3][:40] + b"\n"  # not JSON
    entry = orjson.loads(entries[10])
    entry[FACTS_KEY]["v"] = 99  # facts of another version
    entries[10] = orjson.dumps(entry) + b"\n"
    path.write_bytes(b"".join(entries) + b'{"file": "torn')  # and a torn last entry
    result = _scan_same(tmp_path)
    expected = sum(n for r, n in counts.items() if f"{r}{DATA_SUFFIX}" not in lost)
    assert len(lost) == 2 and result.decoded.get("journal") == expected
    assert result.decoded["facts"] == sum(counts.values()) - expected


def test_large_journals_are_decoded_again_a_chunk_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = _store(tmp_path, files=30)
    monkeypatch.setattr(_journal, "KEEP_ENTRIES", 0)
    monkeypatch.setattr(_journal_files, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(_scan, "CHUNK_ROWS", 16)
    result = _scan_same(tmp_path)
    assert result.decoded.get("journal") == sum(counts.values())


@pytest.mark.parametrize("change", ["entry gone", "another file", "another offset"])
def test_a_journal_that_changed_between_its_two_passes_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A journal too large to keep is decoded again for the rows; an entry that is not the one
    the first pass found there (a journal rewritten between the passes) gives no row: every
    file is read from its lines, with the same rows."""
    counts = _store(tmp_path, files=12)
    monkeypatch.setattr(_journal, "KEEP_ENTRIES", 0)
    real = _journal.Journals.decoded_chunks

    def changed(self: _journal.Journals) -> Iterator[tuple[int, int, list[Any]]]:
        for journal, start, decoded in real(self):
            entries = list(decoded)
            entry = entries[3]
            if change == "entry gone":
                entries[3] = None
            elif change == "another file":
                other = next(e.file for e in entries if e is not None and e.file != entry.file)
                entries[3] = msgspec.structs.replace(entry, file=other)
            else:
                entries[3] = msgspec.structs.replace(entry, offset=entry.offset + 1)
            yield journal, start, entries

    monkeypatch.setattr(_journal.Journals, "decoded_chunks", changed)
    result = _scan_same(tmp_path)
    assert result.decoded.get("journal") is None
    assert sum(result.decoded.values()) == sum(counts.values())


def test_a_sparse_first_pass_finds_what_a_whole_one_finds(tmp_path: Path) -> None:
    _store(tmp_path, files=30)
    path = _journal_path(tmp_path)
    entries = path.read_bytes().splitlines(keepends=True)
    entries[4] = b"\n"  # blank: decode_lines would skip it and shift every later position
    entries[7] = entries[7][:30] + b"\n"
    path.write_bytes(b"".join(entries))
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(DATA_SUFFIX))
    stats = {n: os.stat(tmp_path / n) for n in names[::3]}
    whole = _journal.Journals(str(tmp_path), stats)
    sparse = _journal.Journals(str(tmp_path), stats, sparse=True, keep_entries=5)
    assert whole.covered == sparse.covered and 0 < len(whole.covered) < len(stats)
    assert_frame_equal(whole.entries.drop("kept"), sparse.entries.drop("kept"))
    assert sparse.kept is None and whole.kept is not None  # sparse: more than 5 entries
    again = {
        (j, start + i): e for j, start, es in sparse.decoded_chunks() for i, e in enumerate(es)
    }
    decoded_again = [again[p] for p in whole.entries.select("journal", "index").iter_rows()]
    assert decoded_again == [whole.kept[i] for i in whole.entries["kept"]]


def test_a_journal_changed_between_its_passes_falls_back_to_the_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(tmp_path, files=8)
    chunks = _journal.Journals.decoded_chunks

    def one_lost(self: _journal.Journals) -> Iterator[Any]:
        for journal, start, entries in chunks(self):
            yield journal, start, [None, *entries[1:]]  # the first entry no longer decodes

    monkeypatch.setattr(_journal.Journals, "decoded_chunks", one_lost)
    monkeypatch.setattr(_journal, "KEEP_ENTRIES", 0)  # a journal too large to keep
    result = _scan_same(tmp_path)
    assert "journal" not in result.decoded and result.decoded["facts"] > 0


def test_open_run_and_its_index_refresh_read_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cold and +1 % opens of a journaled store equal opens of the same store read line by
    line (the journal moved away); the refresh re-reads only the appended files."""
    for module in (_file_state, plan_module):
        monkeypatch.setattr(module, "RACY_NS", 0)  # files written a moment ago count as old
    root = tmp_path / "calls"
    counts = _store(root, files=20)
    run = ngv.open_run(root, progress=False, index_dir=tmp_path / "index")
    assert run.index_stats is not None
    assert run.index_stats.decoded.get("journal") == sum(counts.values())
    _same_as_lines(run, root, tmp_path)
    store = _writer_appends(root, 7, ("0-0", "1-0", "new-0"))
    again = ngv.open_run(root, progress=False, index_dir=tmp_path / "index")
    assert again.index_stats is not None
    assert (again.index_stats.appended, again.index_stats.new) == (2, 1)
    assert again.index_stats.decoded == {"facts": 0, "bodies": 0, "exact": 0, "journal": 3}
    _same_as_lines(again, root, tmp_path)
    # Appended to by another writer: the journal no longer vouches for the file, whose
    # bytes were never hashed, so all of it is read again from its lines.
    store.record("2-0", next(_lines(8, 1)))
    third = ngv.open_run(root, progress=False, index_dir=tmp_path / "index")
    assert third.index_stats is not None
    assert (third.index_stats.appended, third.index_stats.reread) == (0, 1)
    assert third.index_stats.decoded["facts"] == counts["2-0"] + 1
    _same_as_lines(third, root, tmp_path)


def _same_as_lines(run: Any, root: Path, tmp_path: Path) -> None:
    hidden = tmp_path / "hidden-journal"
    os.rename(root / JOURNAL_DIR, hidden)
    try:
        lines = ngv.open_run(root, progress=False, index=False)
    finally:
        os.rename(hidden, root / JOURNAL_DIR)
    for name in ("calls", "tool_calls", "gaps", "rollouts"):
        mine, theirs = getattr(run, name), getattr(lines, name)
        keys = [c for c in ("rollout_id", "call_index", "tool_index", "code") if c in mine.columns]
        assert_frame_equal(
            mine.sort(keys, nulls_last=True), theirs.sort(keys, nulls_last=True), check_exact=True
        )
    assert pl.Series(run.calls["path"]).null_count() == 0


def test_an_append_just_written_is_read_from_its_lines_after_the_journal_vouches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files just appended to are within the racy window: their new lines are read from the
    file, but the journal still tells the append from a rewrite (a delta, not a re-read)."""
    root = tmp_path / "calls"
    counts = _store(root, files=12)
    with monkeypatch.context() as patch:
        for module in (_file_state, plan_module):
            patch.setattr(module, "RACY_NS", 0)
        first = ngv.open_run(root, progress=False, index_dir=tmp_path / "index")
    assert first.index_stats is not None
    assert first.index_stats.decoded.get("journal") == sum(counts.values())
    store, writer = CaptureStore(root), CaptureWriter(root)
    try:
        for line, rollout in zip(_lines(9, 2), ("3-0", "4-0"), strict=True):
            _append(store, writer, rollout, line)
    finally:
        writer.close()
    # Files unchanged since the first open count as settled (else, all written a moment
    # before it, they would be read again); the appended ones are racy for the scan,
    # however long the appends took.
    monkeypatch.setattr(plan_module, "RACY_NS", 0)
    monkeypatch.setattr(_file_state, "RACY_NS", 600 * 1_000_000_000)
    again = ngv.open_run(root, progress=False, index_dir=tmp_path / "index")
    assert again.index_stats is not None
    assert (again.index_stats.appended, again.index_stats.reread) == (2, 0)
    assert again.index_stats.decoded == {"facts": 2, "bodies": 0, "exact": 0}
    _same_as_lines(again, root, tmp_path)


def test_a_line_edited_before_a_later_append_is_read_from_the_file(tmp_path: Path) -> None:
    """The later append's mtime hides the edit; the chain of entries (each found the file as
    the one before left it) does not."""
    counts = _store(tmp_path, files=6)
    path = tmp_path / f"3-0{DATA_SUFFIX}"
    data = bytearray(path.read_bytes())
    at = data.index(b'"model_call_id":"') + len(b'"model_call_id":"')
    data[at] = ord("X") if data[at] != ord("X") else ord("Y")  # same size, still JSON
    path.write_bytes(bytes(data))
    store, writer = CaptureStore(tmp_path), CaptureWriter(tmp_path)
    try:
        _append(store, writer, "3-0", next(_lines(11, 1)))
    finally:
        writer.close()
    result = _scan_same(tmp_path)
    assert result.decoded["journal"] == sum(counts.values()) - counts["3-0"]
    assert result.decoded["facts"] == counts["3-0"] + 1


def test_a_line_appended_without_the_lock_between_write_and_stat_gets_no_entry() -> None:
    from capture_core._appending import Appended

    line = {"model_call_id": "c", "dialect": "chat", FACTS_KEY: {"v": FACTS_VERSION}}
    alone = Appended(11, False, 100, 111, 5, 7, 10, 100, 4)
    assert journal_entry("a.capture.jsonl", alone, line) is not None
    crowded = alone._replace(size=150)  # someone's 39 bytes landed before the fstat
    assert journal_entry("a.capture.jsonl", crowded, line) is None


def test_the_journal_never_fails_a_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from capture_core import facts_journal, journal_file
    from capture_core._appending import Appended

    line = {"model_call_id": "c", "dialect": "chat", FACTS_KEY: {"v": FACTS_VERSION}}
    at = Appended(11, False, 0, 11, 5, 7, 10, 0, 4)
    journal = facts_journal.FactsJournal(tmp_path, "t")
    real_write = os.write

    def refused(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_file, "_write", refused)
    journal.note("a.capture.jsonl", at, line)
    calls = []

    def short(fd: int, data: bytes) -> int:
        calls.append(data)
        return real_write(fd, data[:7] if len(calls) == 1 else data)

    monkeypatch.setattr(journal_file, "_write", short)
    journal.note("a.capture.jsonl", at, line)  # cut short, then closed by a newline
    monkeypatch.setattr(journal_file, "_write", real_write)
    journal.note("a.capture.jsonl", at, line)
    journal.close()
    journal.note("a.capture.jsonl", at, line)  # after close: nothing, no error
    assert journal.failures == 2
    lines = journal.path.read_bytes().split(b"\n")
    assert len(lines) == 3 and lines[2] == b""  # the torn entry, one whole entry, the end
    assert FactsJournalEntry.model_validate_json(lines[1]).model_call_id == "c"
    # A .facts that is not a directory: the server starts anyway, without a journal.
    other = tmp_path / "other"
    other.mkdir()
    (other / JOURNAL_DIR).write_text("not a directory")
    writer = CaptureWriter(other)
    try:
        writer.note_facts("a.capture.jsonl", at, line)
    finally:
        writer.close()


# -- refreshes read each journal from where it ended ------------------------------------------


def _marks(index_dir: Path) -> dict[str, list[int]]:
    return dict(orjson.loads((index_dir / "meta.json").read_bytes())["journals"])


def _set_marks(index_dir: Path, marks: object) -> None:
    meta = orjson.loads((index_dir / "meta.json").read_bytes())
    meta["journals"] = marks
    (index_dir / "meta.json").write_bytes(orjson.dumps(meta))


def _journaled_appends(root: Path, seed: int, rollouts: tuple[str, ...], token: str) -> None:
    """Appends by the server of journal ``token`` (which goes on)."""
    store, journal = CaptureStore(root), FactsJournal(root, token)
    try:
        for line, rollout in zip(_lines(seed, len(rollouts)), rollouts, strict=True):
            journal.note(f"{rollout}{DATA_SUFFIX}", store.append(rollout, line), line)
    finally:
        journal.close()


@pytest.fixture
def chunk_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every journal read: (the offset it started from, the bytes it gave)."""
    reads: list[tuple[int, int]] = []
    real = _journal.journal_chunks

    def spy(path: str, since: Any = None) -> Iterator[bytes]:
        given = 0
        with open(path, "rb") as file:
            start = _journal_files.mark_offset(file.fileno(), since)
        for chunk in real(path, since):
            given += len(chunk)
            yield chunk
        reads.append((start, given))

    monkeypatch.setattr(_journal, "journal_chunks", spy)
    return reads


def test_a_refresh_reads_the_journal_only_from_where_it_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_reads: list[tuple[int, int]]
) -> None:
    """The index notes where the journal ended before its files were stat'ed; a refresh
    after more journaled appends decodes only the entries written since, and its rows are
    still the rows of the lines."""
    for module in (_file_state, plan_module):
        monkeypatch.setattr(module, "RACY_NS", 0)
    root, index_dir = tmp_path / "calls", tmp_path / "index"
    counts = _store(root, files=20)
    journal = _journal_path(root)
    ngv.open_run(root, progress=False, index_dir=index_dir)
    assert _marks(index_dir) == {journal.name: [journal.stat().st_ino, journal.stat().st_size]}
    assert chunk_reads == [(0, journal.stat().st_size)]  # a cold open reads it whole
    before = journal.stat().st_size
    _journaled_appends(root, 7, ("0-0", "1-0", "new-0"), journal.stem)
    chunk_reads.clear()
    again = ngv.open_run(root, progress=False, index_dir=index_dir)
    assert chunk_reads == [(before, journal.stat().st_size - before)]
    assert again.index_stats is not None
    assert (again.index_stats.appended, again.index_stats.new) == (2, 1)
    assert again.index_stats.decoded == {"facts": 0, "bodies": 0, "exact": 0, "journal": 3}
    _same_as_lines(again, root, tmp_path)
    assert _marks(index_dir)[journal.name][1] == journal.stat().st_size
    # Another server's journal, new since the mark, is read whole.
    store, writer = CaptureStore(root), CaptureWriter(root)
    try:
        _append(store, writer, "5-0", next(_lines(10, 1)))
    finally:
        writer.close()
    chunk_reads.clear()
    ngv.open_run(root, progress=False, index_dir=index_dir)
    other = (root / JOURNAL_DIR / f"{writer.token}.jsonl").stat().st_size
    assert sorted(chunk_reads) == [(0, other), (journal.stat().st_size, 0)]
    # An edit (its mtime moved) and then a journaled append: the append's entry found the
    # file as the edit left it, not as the index recorded it, so the chain from the index's
    # state breaks and the file is read again from its lines.
    path = root / f"2-0{DATA_SUFFIX}"
    data = bytearray(path.read_bytes())
    at = data.index(b'"model_call_id":"') + len(b'"model_call_id":"')
    data[at] = ord("X") if data[at] != ord("X") else ord("Y")
    recorded = path.stat().st_mtime_ns
    path.write_bytes(bytes(data))
    os.utime(path, ns=(recorded + 10**9, recorded + 10**9))
    _journaled_appends(root, 8, ("2-0",), journal.stem)
    third = ngv.open_run(root, progress=False, index_dir=index_dir)
    assert third.index_stats is not None
    assert (third.index_stats.appended, third.index_stats.reread) == (0, 1)
    assert third.index_stats.decoded["facts"] == counts["2-0"] + 1
    _same_as_lines(third, root, tmp_path)


@pytest.mark.parametrize("damage", ["replaced", "cut", "inside a line", "malformed", "none"])
def test_a_mark_the_journal_no_longer_matches_is_never_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """A journal replaced or cut shorter since the mark is read whole; a mark inside a line
    skips that line (its file is then read from its lines); malformed or missing marks read
    the journal whole. The rows are always the lines' rows."""
    for module in (_file_state, plan_module):
        monkeypatch.setattr(module, "RACY_NS", 0)
    root, index_dir = tmp_path / "calls", tmp_path / "index"
    _store(root, files=10)
    ngv.open_run(root, progress=False, index_dir=index_dir)
    journal = _journal_path(root)
    mark = _marks(index_dir)[journal.name]
    _journaled_appends(root, 12, ("0-0", "1-0", "new-0"), journal.stem)
    if damage == "replaced":  # same bytes, another inode (rotated, copied back)
        copy = journal.with_suffix(".copy")
        copy.write_bytes(journal.read_bytes())
        os.replace(copy, journal)
    elif damage == "cut":  # cut back below the mark, then appended to again
        with open(journal, "r+b") as file:
            file.truncate(mark[1] // 2)
        _journaled_appends(root, 13, ("3-0",), journal.stem)
    elif damage == "inside a line":  # the first entry since the mark is skipped
        _set_marks(index_dir, {journal.name: [mark[0], mark[1] + 5]})
    elif damage == "malformed":
        _set_marks(index_dir, {journal.name: [True, mark[1]], "x.jsonl": [1, 2, 3], "y": "z"})
    else:
        _set_marks(index_dir, None)
    again = ngv.open_run(root, progress=False, index_dir=index_dir)
    assert again.index_stats is not None
    if damage == "inside a line":  # 0-0's new line has no entry read: its file is re-read
        assert again.index_stats.decoded["journal"] == 2
        assert again.index_stats.reread == 1
    elif damage != "cut":  # read whole, its chains still start where the index left files
        assert again.index_stats.decoded["journal"] == 3
        assert (again.index_stats.appended, again.index_stats.reread) == (2, 0)
    _same_as_lines(again, root, tmp_path)


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_chunks_from_a_mark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(_journal_files, "CHUNK_BYTES", chunk)
    path = tmp_path / "journal.jsonl"
    lines = [b'{"a":%d,"pad":"%s"}\n' % (n, b"x" * (n * 13 % 50)) for n in range(20)]
    path.write_bytes(b"".join(lines) + b'{"torn":')
    inode = path.stat().st_ino

    def read(since: Any) -> bytes:
        return b"".join(_journal_files.journal_chunks(str(path), since))

    whole = b"".join(lines)
    assert read(None) == whole
    chunks = list(_journal_files.journal_chunks(str(path)))
    assert all(c.endswith(b"\n") and c.count(b"\n") >= 1 for c in chunks)
    if chunk < max(map(len, lines)):  # a line longer than a chunk is given whole
        assert {line for c in chunks for line in c.splitlines(keepends=True)} == set(lines)
    at = sum(map(len, lines[:7]))
    assert read([inode, at]) == b"".join(lines[7:])  # a line's start
    assert read([inode, at + 3]) == b"".join(lines[8:])  # inside a line: skipped
    assert read([inode, at - 1]) == b"".join(lines[7:])  # on a newline: that line is done
    assert read([inode, len(whole)]) == b""
    assert read([inode + 1, at]) == whole  # another file
    assert read([inode, path.stat().st_size + 1]) == whole  # cut shorter since
    assert read([inode, 0]) == whole


@pytest.mark.parametrize("lines", [7, 8, 9])
def test_a_rest_of_up_to_half_a_chunk_is_read_with_the_chunk_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: int
) -> None:
    """A journal of up to 1.5 chunks is one chunk (one read, no tail joined to another read);
    a longer one is cut into chunks at newlines."""
    monkeypatch.setattr(_journal_files, "CHUNK_BYTES", 100)
    path = tmp_path / "journal.jsonl"
    line = b'{"a":1,"pad":"xx"}\n'  # 20 bytes: 5 lines a chunk
    path.write_bytes(line * lines + b'{"torn"')  # 147 bytes (within 1.5 chunks), 167, 187
    chunks = list(_journal_files.journal_chunks(str(path)))
    assert b"".join(chunks) == line * lines
    assert len(chunks) == (1 if lines * len(line) + 7 <= 150 else 2)


def test_a_read_that_returns_less_than_asked_is_not_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read may return fewer bytes than asked (Linux caps one read at ~2 GiB; some network
    file systems return less): only an empty read ends the journal."""
    monkeypatch.setattr(_journal_files, "CHUNK_BYTES", 64)
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: real(fd, min(n, 30), at))
    path = tmp_path / "journal.jsonl"
    lines = b"x" * 50 + b"\n" + b"y\n" + b"z" * 100 + b"\n"
    path.write_bytes(lines + b'{"torn"')
    chunks = list(_journal_files.journal_chunks(str(path)))
    assert b"".join(chunks) == lines
    assert all(chunk.endswith(b"\n") for chunk in chunks)
    inode = path.stat().st_ino
    assert b"".join(_journal_files.journal_chunks(str(path), [inode, 20])) == lines[51:]


def test_a_file_and_journal_cut_back_are_read_from_the_journal_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an append and a refresh, the file and the journal are put back as they were
    (size and mtime): the journal accounts for the file from offset 0 again (the chain does
    not start at the grown state the index holds), so the file is read from it."""
    for module in (_file_state, plan_module):
        monkeypatch.setattr(module, "RACY_NS", 0)
    root, index_dir = tmp_path / "calls", tmp_path / "index"
    counts = _store(root, files=8)
    journal = _journal_path(root)
    path = root / f"4-0{DATA_SUFFIX}"
    kept = [(p, p.stat().st_size, p.stat().st_mtime_ns) for p in (path, journal)]
    ngv.open_run(root, progress=False, index_dir=index_dir)
    _journaled_appends(root, 21, ("4-0",), journal.stem)
    ngv.open_run(root, progress=False, index_dir=index_dir)
    for file, size, mtime in kept:
        os.truncate(file, size)
        os.utime(file, ns=(mtime, mtime))
    again = ngv.open_run(root, progress=False, index_dir=index_dir)
    assert again.index_stats is not None
    assert again.index_stats.reread == 1
    assert again.index_stats.decoded.get("journal") == counts["4-0"]
    _same_as_lines(again, root, tmp_path)


def test_marks_are_taken_before_the_files_are_stated_and_hold_for_a_second_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line appended to an unchanged file after the listing's ``stat`` (during a refresh
    that saves the index) has its entry after the mark that refresh saves, so the next
    refresh serves the grown file from the journal; also when the journal is too large to
    keep and is decoded again from the mark."""
    for module in (_file_state, plan_module):
        monkeypatch.setattr(module, "RACY_NS", 0)
    monkeypatch.setattr(_journal, "KEEP_ENTRIES", 0)  # every refresh decodes twice
    root, index_dir = tmp_path / "calls", tmp_path / "index"
    _store(root, files=8)
    token = _journal_path(root).stem
    ngv.open_run(root, progress=False, index_dir=index_dir)
    _journaled_appends(root, 31, ("3-0",), token)  # so that the next refresh saves
    real = index_module.DirListing.read

    def listing_then_append(path: Path) -> Any:
        found = real(path)
        _journaled_appends(root, 32, ("2-0",), token)
        return found

    monkeypatch.setattr(index_module.DirListing, "read", listing_then_append)
    between = ngv.open_run(root, progress=False, index_dir=index_dir)
    monkeypatch.setattr(index_module.DirListing, "read", real)
    assert between.index_stats is not None
    assert between.index_stats.decoded == {"facts": 0, "bodies": 0, "exact": 0, "journal": 1}
    again = ngv.open_run(root, progress=False, index_dir=index_dir)
    assert again.index_stats is not None
    assert (again.index_stats.appended, again.index_stats.reread) == (1, 0)
    assert again.index_stats.decoded == {"facts": 0, "bodies": 0, "exact": 0, "journal": 1}
    _same_as_lines(again, root, tmp_path)
