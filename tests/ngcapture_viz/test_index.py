"""The sidecar index: incremental refresh by counters, invalidation, relocation, no writes.

Every refresh is checked two ways: its ``IndexStats`` counters (what was reused, appended,
re-read, how many bytes were parsed) and its frames, which must equal a plain read of the
directory without any index (``index=False``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core import CaptureStore
from capture_core.testing import CaptureLineFactory
from ngcapture_viz.load._plan import RefreshPlan
from ngcapture_viz.load.index import INDEX_DIR_NAME, CaptureIndex, IndexStats
from tests.ngcapture_viz.conftest import write_capture

ROLLOUT_IDS = [f"{task}-{repeat}" for task in range(3) for repeat in range(2)]


def _stats(run: ngv.CaptureRun) -> IndexStats:
    assert run.index_stats is not None
    return run.index_stats


def _counters(stats: IndexStats) -> tuple[int, ...]:
    """(files, reused, appended, reread, new, removed)"""
    return (stats.files, stats.reused, stats.appended, stats.reread, stats.new, stats.removed)


def _assert_same_as_plain_read(run: ngv.CaptureRun, capture_dir: Path) -> None:
    plain = ngv.open_run(capture_dir, label=run.label, index=False)
    for name in ("calls", "tool_calls", "gaps", "rollouts"):
        got, expected = getattr(run, name), getattr(plain, name)
        assert got.schema == expected.schema, name
        assert got.rows() == expected.rows(), name


@pytest.fixture
def store(capture_dir: Path, line_factory: CaptureLineFactory) -> Path:
    """Six rollouts of two lines each."""
    for rollout_id in ROLLOUT_IDS:
        write_capture(capture_dir, rollout_id, line_factory.lines(2))
    return capture_dir


def test_a_cold_open_builds_the_index_beside_the_store(store: Path) -> None:
    run = ngv.open_run(store)
    stats = _stats(run)
    assert _counters(stats) == (6, 0, 0, 0, 6, 0)
    assert stats.bytes_parsed == sum(p.stat().st_size for p in store.glob("*.capture.jsonl"))
    assert stats.location == store / INDEX_DIR_NAME
    assert (store / INDEX_DIR_NAME / "meta.json").is_file()
    assert run.calls.height == 12
    warm = ngv.open_run(store)
    assert _counters(_stats(warm)) == (6, 6, 0, 0, 0, 0)
    assert _stats(warm).bytes_parsed == 0
    _assert_same_as_plain_read(warm, store)


def test_appends_parse_only_the_appended_bytes(
    store: Path, line_factory: CaptureLineFactory
) -> None:
    ngv.open_run(store)
    capture = CaptureStore(store, create=False)
    appended = 0
    touched = ["0-1", "1-0", "2-1"]
    for rollout_id in touched:
        for line in line_factory.lines(2 if rollout_id == "1-0" else 1):
            appended += capture.record(rollout_id, line)
    run = ngv.open_run(store)
    stats = _stats(run)
    assert stats.bytes_parsed == appended
    assert _counters(stats) == (6, 3, 3, 0, 0, 0)
    counts = dict(run.rollouts.select("rollout_id", "num_calls").rows())
    assert counts == {"0-0": 2, "0-1": 3, "1-0": 4, "1-1": 2, "2-0": 2, "2-1": 3}
    appended_rows = run.calls.filter(run.calls["call_index"] >= 2)
    assert appended_rows.select("rollout_id", "call_index", "line_number").rows() == [
        ("0-1", 2, 3),
        ("1-0", 2, 3),
        ("1-0", 3, 4),
        ("2-1", 2, 3),
    ]
    _assert_same_as_plain_read(run, store)
    again = ngv.open_run(store)
    assert (_stats(again).bytes_parsed, _stats(again).reused) == (0, 6)


def test_a_rewrite_of_the_same_size_is_reread(
    store: Path, line_factory: CaptureLineFactory
) -> None:
    ngv.open_run(store)
    path = store / "1-1.capture.jsonl"
    before = path.stat()
    content = path.read_bytes()
    plain = ngv.open_run(store, index=False).calls
    old_id = plain.filter(plain["rollout_id"] == "1-1")["model_call_id"][0]
    new_id = "f" * len(old_id)
    with path.open("r+b") as handle:  # in place: same inode, same size
        handle.write(content.replace(old_id.encode(), new_id.encode(), 1))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert (path.stat().st_ino, path.stat().st_size) == (before.st_ino, before.st_size)
    run = ngv.open_run(store)
    stats = _stats(run)
    assert _counters(stats) == (6, 5, 0, 1, 0, 0)
    assert stats.bytes_parsed == before.st_size
    ids = run.calls.filter(run.calls["rollout_id"] == "1-1")["model_call_id"].to_list()
    assert ids[0] == new_id and old_id not in run.calls["model_call_id"].to_list()
    _assert_same_as_plain_read(run, store)


def test_a_shorter_file_is_reread(store: Path, line_factory: CaptureLineFactory) -> None:
    ngv.open_run(store)
    replacement = next(line_factory.lines(1))
    path = write_capture(store, "0-0", [replacement])  # truncates, same inode
    run = ngv.open_run(store)
    stats = _stats(run)
    assert _counters(stats) == (6, 5, 0, 1, 0, 0)
    assert stats.bytes_parsed == path.stat().st_size
    rows = run.calls.filter(run.calls["rollout_id"] == "0-0")
    assert rows.select("model_call_id", "call_index").rows() == [(replacement.model_call_id, 0)]
    _assert_same_as_plain_read(run, store)


def test_a_file_replaced_by_rename_is_reread(store: Path, line_factory: CaptureLineFactory) -> None:
    ngv.open_run(store)
    path = store / "2-0.capture.jsonl"
    old_inode = path.stat().st_ino
    lines = list(line_factory.lines(3))
    staged = write_capture(store.parent, "staged", lines)
    os.replace(staged, path)  # a new inode, longer than before
    assert path.stat().st_ino != old_inode
    run = ngv.open_run(store)
    assert _counters(_stats(run)) == (6, 5, 0, 1, 0, 0)
    assert _stats(run).bytes_parsed == path.stat().st_size
    rows = run.calls.filter(run.calls["rollout_id"] == "2-0")
    assert rows["model_call_id"].to_list() == [line.model_call_id for line in lines]
    _assert_same_as_plain_read(run, store)


def test_a_deleted_file_loses_its_rows(store: Path) -> None:
    ngv.open_run(store)
    (store / "1-0.capture.jsonl").unlink()
    run = ngv.open_run(store)
    assert _counters(_stats(run)) == (5, 5, 0, 0, 0, 1)
    assert _stats(run).bytes_parsed == 0
    assert "1-0" not in run.calls["rollout_id"].to_list()
    assert "1-0" not in run.rollouts["rollout_id"].to_list()
    assert run.calls.height == 10
    _assert_same_as_plain_read(run, store)


def test_deleting_the_index_is_harmless(store: Path) -> None:
    first = ngv.open_run(store)
    for path in (store / INDEX_DIR_NAME).iterdir():
        path.unlink()
    (store / INDEX_DIR_NAME).rmdir()
    rebuilt = ngv.open_run(store)
    assert _counters(_stats(rebuilt)) == (6, 0, 0, 0, 6, 0)
    for name in ("calls", "tool_calls", "gaps", "rollouts"):
        assert getattr(rebuilt, name).rows() == getattr(first, name).rows()
    assert (store / INDEX_DIR_NAME / "meta.json").is_file()


def test_a_damaged_index_is_rebuilt(store: Path) -> None:
    first = ngv.open_run(store)
    for path in (store / INDEX_DIR_NAME).glob("calls-*.parquet"):
        path.write_bytes(b"not parquet")
    rebuilt = ngv.open_run(store)
    assert _counters(_stats(rebuilt)) == (6, 0, 0, 0, 6, 0)
    assert rebuilt.calls.rows() == first.calls.rows()


def test_a_torn_tail_completed_later_is_read_whole(
    capture_dir: Path, line_factory: CaptureLineFactory
) -> None:
    a, b, c, d = (line.to_jsonl() for line in line_factory.lines(4))
    path = write_capture(capture_dir, "0-0", [a, b, c[:50]])
    first = ngv.open_run(capture_dir)
    torn = first.gaps.select("code", "call_index", "line_number", "byte_offset").rows()
    assert [(str(r[0]), *r[1:]) for r in torn] == [("capture_line_damaged", 2, 3, len(a) + len(b))]
    # Unchanged: only the torn tail is parsed again.
    same = ngv.open_run(capture_dir)
    assert (_stats(same).bytes_parsed, _stats(same).appended) == (50, 1)
    assert same.gaps.rows() == first.gaps.rows()
    with path.open("ab") as handle:
        handle.write(c[50:] + d)
    run = ngv.open_run(capture_dir)
    assert _stats(run).bytes_parsed == len(c) + len(d)
    assert run.gaps.height == 0
    assert run.calls.select("call_index", "line_number", "byte_offset").rows() == [
        (0, 1, 0),
        (1, 2, len(a)),
        (2, 3, len(a) + len(b)),
        (3, 4, len(a) + len(b) + len(c)),
    ]
    assert run.rollouts["num_damaged"].to_list() == [0]
    _assert_same_as_plain_read(run, capture_dir)


def test_a_store_that_cannot_hold_the_index_uses_the_cache_dir(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("NGCAPTURE_CACHE_DIR", str(cache))
    (store / INDEX_DIR_NAME).write_bytes(b"")  # a file: the index directory cannot be made
    run = ngv.open_run(store)
    stats = _stats(run)
    assert stats.location.parent == cache
    assert (stats.location / "meta.json").is_file()
    assert (store / INDEX_DIR_NAME).read_bytes() == b""
    assert CaptureIndex(store).location() == stats.location
    warm = ngv.open_run(store)
    assert (_stats(warm).reused, _stats(warm).bytes_parsed) == (6, 0)
    assert _stats(warm).location == stats.location
    _assert_same_as_plain_read(warm, store)


def test_a_stale_index_beside_a_store_that_became_unwritable_does_not_hide_the_cache(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line_factory: CaptureLineFactory
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("NGCAPTURE_CACHE_DIR", str(cache))
    beside = _stats(ngv.open_run(store)).location
    assert beside == store / INDEX_DIR_NAME
    lock = beside / "lock"
    lock.unlink()
    lock.mkdir()  # the index beside the store can no longer be written (EISDIR, even as root)
    path = sorted(store.glob("*.capture.jsonl"))[0]
    with path.open("ab") as handle:
        handle.write(line_factory.line().to_jsonl())
    first = _stats(ngv.open_run(store))
    assert first.location is not None and first.location.parent == cache
    assert (first.appended, first.bytes_parsed > 0) == (1, True)
    again = _stats(ngv.open_run(store))  # the newer cache copy is read, not the stale one
    assert (again.appended, again.reused, again.bytes_parsed) == (0, 6, 0)
    assert CaptureIndex(store).location() == first.location


def test_without_the_index_nothing_is_written(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("NGCAPTURE_CACHE_DIR", str(cache))
    before = sorted(p.name for p in store.iterdir())
    run = ngv.open_run(store, index=False)
    assert run.calls.height == 12
    assert sorted(p.name for p in store.iterdir()) == before
    assert not cache.exists()


def test_without_the_index_an_existing_index_is_not_read(store: Path) -> None:
    ngv.open_run(store)
    run = ngv.open_run(store, index=False)
    stats = _stats(run)
    assert (stats.reused, stats.new) == (0, 6)
    assert stats.bytes_parsed == sum(p.stat().st_size for p in store.glob("*.capture.jsonl"))


def test_an_explicit_index_dir_is_used(store: Path, tmp_path: Path) -> None:
    place = tmp_path / "elsewhere"
    run = ngv.open_run(store, index_dir=place)
    assert _stats(run).location == place and (place / "meta.json").is_file()
    assert not (store / INDEX_DIR_NAME).exists()
    warm = ngv.open_run(store, index_dir=place)
    assert _stats(warm).reused == 6


def test_appends_after_blank_and_damaged_lines_keep_counting(
    capture_dir: Path, line_factory: CaptureLineFactory
) -> None:
    a, b, c = (line.to_jsonl() for line in line_factory.lines(3))
    path = write_capture(capture_dir, "0-0", [a, b"\n", b"{bad\n", b" \t\n", b"[]\n"])
    first = ngv.open_run(capture_dir)
    assert first.gaps["call_index"].to_list() == [1, 2]
    with path.open("ab") as handle:
        handle.write(b"\n" + b + c)
    run = ngv.open_run(capture_dir)
    assert _stats(run).bytes_parsed == 1 + len(b) + len(c)
    assert _counters(_stats(run)) == (1, 0, 1, 0, 0, 0)
    assert run.calls.select("call_index", "line_number").rows() == [(0, 1), (3, 7), (4, 8)]
    assert run.gaps.select("call_index", "line_number").rows() == [(1, 3), (2, 5)]
    _assert_same_as_plain_read(run, capture_dir)


def test_a_same_size_rewrite_in_the_same_mtime_tick_is_reread(
    capture_dir: Path, line_factory: CaptureLineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ngcapture_viz.load.index as index_module

    line = next(line_factory.lines(1))
    path = write_capture(capture_dir, "0-0", [line])
    # The index's clock reads one second after the write, however slow this machine is.
    scan_ns = path.stat().st_mtime_ns + 1_000_000_000
    monkeypatch.setattr(index_module.time, "time_ns", lambda: scan_ns)
    ngv.open_run(capture_dir)
    before = path.stat()
    path.write_bytes(line.to_jsonl().replace(line.model_call_id.encode(), b"f" * 32, 1))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # what a fast rewrite gets
    run = ngv.open_run(capture_dir)
    assert run.calls["model_call_id"].to_list() == ["f" * 32]


def test_an_unchanged_torn_tail_does_not_rewrite_the_index(
    capture_dir: Path, line_factory: CaptureLineFactory
) -> None:
    a, b = (line.to_jsonl() for line in line_factory.lines(2))
    write_capture(capture_dir, "0-0", [a])
    write_capture(capture_dir, "0-1", [a, b[:30]])  # a writer is still on this line
    ngv.open_run(capture_dir)
    place = capture_dir / INDEX_DIR_NAME
    saved = {p.name: p.stat().st_mtime_ns for p in place.iterdir()}
    for _ in range(2):
        run = ngv.open_run(capture_dir)
        assert (_stats(run).bytes_parsed, _stats(run).appended, _stats(run).reused) == (30, 1, 1)
        assert run.gaps["call_index"].to_list() == [1]
        assert {p.name: p.stat().st_mtime_ns for p in place.iterdir()} == saved
    with (capture_dir / "0-1.capture.jsonl").open("ab") as handle:
        handle.write(b[30:])  # the line is finished: now the index moves on
    run = ngv.open_run(capture_dir)
    assert run.gaps.height == 0 and run.calls.height == 3
    assert {p.name for p in place.iterdir()} != set(saved)
    _assert_same_as_plain_read(run, capture_dir)


def test_racy_files_are_hash_checked_once_then_trusted_again(
    capture_dir: Path, line_factory: CaptureLineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:

    import ngcapture_viz.load._listing as listing_module
    import ngcapture_viz.load._plan as plan_module
    import ngcapture_viz.load.index as index_module

    for number, line in enumerate(line_factory.lines(3)):
        write_capture(capture_dir, f"{number}-0", [line])
    newest = max(p.stat().st_mtime_ns for p in capture_dir.glob("*.capture.jsonl"))
    clock = [newest + 1_000_000_000]  # the index's clock, independent of how slow we are
    monkeypatch.setattr(index_module.time, "time_ns", lambda: clock[0])
    ngv.open_run(capture_dir)  # one second after the writes: every file is racy, hash kept
    checked: list[str] = []
    real_check = listing_module.content_matches

    def counting(path: Path, row: dict[str, object]) -> bool:
        checked.append(path.name)
        return real_check(path, row)

    monkeypatch.setattr(plan_module, "content_matches", counting)
    # Three seconds later (the clock the index reads), the files are old enough to trust.
    clock[0] += 3_000_000_000
    first = ngv.open_run(capture_dir)
    assert sorted(checked) == [f"{n}-0.capture.jsonl" for n in range(3)]
    assert _stats(first).reused == 3
    assert _stats(first).bytes_parsed == 0
    checked.clear()
    second = ngv.open_run(capture_dir)
    assert checked == []  # settled: trusted by mtime, no file read
    assert _stats(second).reused == 3


@pytest.mark.parametrize("new_file", [False, True], ids=["same names", "a file added"])
def test_racy_files_checked_beside_an_append_are_kept_and_only_what_moved_is_read(
    capture_dir: Path,
    line_factory: CaptureLineFactory,
    monkeypatch: pytest.MonkeyPatch,
    new_file: bool,
) -> None:
    """The planner compares a listing whose names are the index's row by row side by side,
    and any other listing through a join: either way a racy file whose hash still matches is
    kept, one whose bytes changed under the same size and mtime is read again, and only the
    file that grew (and a new one, here between two others) is read on."""
    import ngcapture_viz.load._plan as plan_module
    import ngcapture_viz.load.index as index_module

    lines = list(line_factory.lines(6))
    for number, line in enumerate(lines[:4]):
        write_capture(capture_dir, f"{number}-0", [line])
    newest = max(p.stat().st_mtime_ns for p in capture_dir.glob("*.capture.jsonl"))
    clock = [newest + 1_000_000_000]
    monkeypatch.setattr(index_module.time, "time_ns", lambda: clock[0])
    ngv.open_run(capture_dir)  # every file racy: its whole hash kept
    grown = capture_dir / "2-0.capture.jsonl"
    with grown.open("ab") as handle:
        handle.write(lines[4].to_jsonl())
    rewritten = capture_dir / "3-0.capture.jsonl"
    before = rewritten.stat()
    data = lines[3].to_jsonl()
    rewritten.write_bytes(data.replace(lines[3].model_call_id.encode(), b"e" * 32, 1))
    os.utime(rewritten, ns=(before.st_atime_ns, before.st_mtime_ns))  # a fast rewrite
    if new_file:
        write_capture(capture_dir, "1-5", [lines[5]])  # sorts between 1-0 and 2-0
    compared: list[bool] = []
    real_compare = plan_module._compare

    def spy(*args: Any) -> Any:
        found = real_compare(*args)
        compared.append(found[-1])
        return found

    monkeypatch.setattr(plan_module, "_compare", spy)
    clock[0] = max(p.stat().st_mtime_ns for p in capture_dir.glob("*.capture.jsonl"))
    clock[0] += 3_000_000_000
    run = ngv.open_run(capture_dir)
    assert compared == [not new_file]  # side by side, or through the join
    stats = _stats(run)
    assert (stats.reused, stats.appended, stats.reread, stats.new, stats.removed) == (
        2, 1, 1, int(new_file), 0,
    )  # fmt: skip
    assert stats.bytes_parsed == sum(
        len(line.to_jsonl()) for line in (lines[4], lines[3], *lines[5:6] * new_file)
    )
    assert "e" * 32 in run.calls["model_call_id"].to_list()
    _assert_same_as_plain_read(run, capture_dir)


def test_a_files_table_with_a_null_state_is_rebuilt(
    capture_dir: Path, line_factory: CaptureLineFactory
) -> None:
    """A damaged index (a null where every file state has a value) is no index: the open
    parses again instead of comparing a file with a state it does not have."""
    lines = list(line_factory.lines(3))
    for number, line in enumerate(lines[:2]):
        write_capture(capture_dir, f"{number}-0", [line])
    ngv.open_run(capture_dir)
    (table,) = (capture_dir / INDEX_DIR_NAME).glob("files-*.parquet")
    files = pl.read_parquet(table)
    damaged = files.with_columns(
        pl.when(pl.col("name") == "0-0.capture.jsonl").then(None).otherwise(pl.col("consumed"))
        .alias("consumed")
    )  # fmt: skip
    damaged.write_parquet(table)
    with (capture_dir / "0-0.capture.jsonl").open("ab") as handle:
        handle.write(lines[2].to_jsonl())
    run = ngv.open_run(capture_dir)
    assert (_stats(run).reused, _stats(run).new) == (0, 2)
    _assert_same_as_plain_read(run, capture_dir)


def test_an_unwritable_index_warns_and_keeps_the_rows(
    capture_dir: Path,
    line_factory: CaptureLineFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    write_capture(capture_dir, "0-0", list(line_factory.lines(2)))
    (capture_dir / INDEX_DIR_NAME).write_text("not a directory")
    monkeypatch.setenv("NGCAPTURE_CACHE_DIR", "/dev/null/cache")  # cannot be created either
    with caplog.at_level("WARNING", logger="ngcapture_viz.load.index"):
        run = ngv.open_run(capture_dir)
    assert run.calls.height == 2
    assert _stats(run).location is None
    assert "could not write the index" in caplog.text
    with pytest.raises(ngv.CaptureIndexError, match="could not write the index"):
        CaptureIndex(capture_dir).refresh(require_write=True)


@pytest.mark.parametrize(
    "change", ["none", "swap", "add", "remove", "duplicate row", "unsorted rows", "unstated"]
)
def test_only_a_warm_open_with_every_file_unchanged_plans_nothing_per_file(
    capture_dir: Path,
    line_factory: CaptureLineFactory,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    import ngcapture_viz.load.index as index_module

    lines = list(line_factory.lines(4))
    for number, line in enumerate(lines[:3]):
        write_capture(capture_dir, f"{number}-0", [line])
    written = max(p.stat().st_mtime_ns for p in capture_dir.glob("*.capture.jsonl"))
    scan_ns = written + 3_000_000_000  # the index's clock: every file is old enough to trust
    monkeypatch.setattr(index_module.time, "time_ns", lambda: scan_ns)
    plans: list[RefreshPlan] = []
    real_plan = index_module.plan_refresh

    def spying(*args: Any, **kwargs: Any) -> RefreshPlan:
        plans.append(plan := real_plan(*args, **kwargs))
        return plan

    monkeypatch.setattr(index_module, "plan_refresh", spying)
    ngv.open_run(capture_dir)
    assert not plans[-1].everything_kept
    expected_ids = ["0-0", "1-0", "2-0"]
    counters = (3, 3, 0, 0, 0, 0)  # (files, reused, appended, reread, new, removed)
    if change in ("swap", "remove"):
        (capture_dir / "0-0.capture.jsonl").unlink()
        expected_ids.remove("0-0")
        counters = (2, 2, 0, 0, 0, 1)
    if change in ("swap", "add"):
        added = write_capture(capture_dir, "7-0", [lines[3]])
        os.utime(added, ns=(written, written))  # as old as the others
        expected_ids.append("7-0")
        counters = (3, 2, 0, 0, 1, 1) if change == "swap" else (4, 3, 0, 0, 1, 0)
    if change == "duplicate row":
        # A damaged files table: 0-0's row twice, 1-0's missing (same row count).
        [table] = (capture_dir / INDEX_DIR_NAME).glob("files-*.parquet")
        files = pl.read_parquet(table)
        first = files.filter(pl.col("name") == "0-0.capture.jsonl")
        pl.concat([first, files.filter(pl.col("name") != "1-0.capture.jsonl")]).write_parquet(table)
    if change == "unsorted rows":  # every row right, in another order: found by the join
        [table] = (capture_dir / INDEX_DIR_NAME).glob("files-*.parquet")
        pl.read_parquet(table).sort("name", descending=True).write_parquet(table)
    if change == "unstated":  # a new file that cannot be stat'ed (gone meanwhile, say)
        write_capture(capture_dir, "7-0", [lines[3]])
        expected_ids.append("7-0")  # read all the same: opening it does not need its stat
        real_stat = os.stat

        def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            if path == "7-0.capture.jsonl":
                raise PermissionError(13, "Permission denied", path)
            return real_stat(path, *args, **kwargs)

        monkeypatch.setattr(os, "stat", stat)
    run = ngv.open_run(capture_dir)
    if change == "unstated":
        monkeypatch.setattr(os, "stat", real_stat)
    assert plans[-1].everything_kept is (change in ("none", "unsorted rows"))
    assert sorted(run.calls["rollout_id"].unique()) == expected_ids
    if change == "unstated":
        assert plans[-1].reused == 3 and [task.name for task in plans[-1].tasks] == [
            "7-0.capture.jsonl"
        ]
        return
    if change != "duplicate row":  # a damaged index is repaired, not promised to be equal
        assert _counters(_stats(run)) == counters
        _assert_same_as_plain_read(run, capture_dir)


def test_a_warm_open_returns_the_frames_the_index_made_as_it_read_its_tables(
    store: Path, line_factory: CaptureLineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ngcapture_viz.frames.rollouts as rollouts_module
    import ngcapture_viz.load._prepared as prepared_module

    ngv.open_run(store)  # the index is written
    made: dict[str, int] = {"index": 0, "run": 0}

    def counting(where: str, real: Any) -> Any:
        def totals(calls: pl.DataFrame) -> pl.DataFrame:
            made[where] += 1
            return real(calls)

        return totals

    monkeypatch.setattr(
        prepared_module, "call_totals", counting("index", prepared_module.call_totals)
    )
    monkeypatch.setattr(
        rollouts_module, "call_totals", counting("run", rollouts_module.call_totals)
    )
    warm = ngv.open_run(store)
    # Made once, beside the saved tables' reading; the run used them as they were.
    assert made == {"index": 1, "run": 0}
    assert warm.calls["path"].str.starts_with(str(store) + os.sep).all()
    _assert_same_as_plain_read(warm, store)
    # After an append only the rollouts appended to get new totals.
    with (store / f"{ROLLOUT_IDS[0]}.capture.jsonl").open("ab") as handle:
        handle.write(line_factory.line().to_jsonl())
    made.update(index=0, run=0)
    appended = ngv.open_run(store)
    assert made == {"index": 2, "run": 0}  # the saved rows' totals, then the appended's
    assert appended.calls.height == warm.calls.height + 1
    _assert_same_as_plain_read(appended, store)
