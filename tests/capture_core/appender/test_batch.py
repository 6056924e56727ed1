"""Appending a batch: every file's lines land in order, chained for the journal; a file another
process holds locked is left over untouched; failures leave no byte behind."""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from capture_core import CaptureStore
from capture_core._spare import Spare
from capture_core.appender import append_batch
from capture_core.appender.batch import FILES_PER_COMMIT
from capture_core.appender.frames import Request


def _line(index: int) -> bytes:
    return orjson.dumps({"model_call_id": f"c{index}", "dialect": "chat"}) + b"\n"


def _requests(names: list[str]) -> list[Request]:
    return [Request(job, name, b"", _line(job)) for job, name in enumerate(names)]


@contextmanager
def held_by_another_process(path: Path) -> Iterator[None]:
    """``path`` locked exclusively by a separate process until the block ends."""
    code = ("import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()


def test_lines_of_many_files_land_in_order_and_chain_for_the_journal(tmp_path: Path) -> None:
    CaptureStore(tmp_path).record("a", {"model_call_id": "before", "dialect": "chat"})
    before = os.stat(tmp_path / "a.capture.jsonl")
    names = ["a.capture.jsonl", "b.capture.jsonl"] * 3 + ["c.capture.jsonl"]
    outcomes, blocked = append_batch(
        str(tmp_path), _requests(names), wait=False, spare=Spare(), synced=set()
    )
    assert blocked == []
    assert [o.error for o in outcomes] == [None] * len(names)
    store = CaptureStore(tmp_path)
    ids = {rid: [e.data["model_call_id"] for e in store.read(rid).entries] for rid in "abc"}
    assert ids == {"a": ["before", "c0", "c2", "c4"], "b": ["c1", "c3", "c5"], "c": ["c6"]}
    for name in set(names):
        mine = [o.appended for o in outcomes if o.request.name == name]
        data = (tmp_path / name).read_bytes()
        stat = os.stat(tmp_path / name)
        first = mine[0]
        assert first is not None
        assert first.created == (name != "a.capture.jsonl")
        if name == "a.capture.jsonl":
            assert (first.size_before, first.mtime_before_ns) == (
                before.st_size,
                before.st_mtime_ns,
            )
        for earlier, later in itertools.pairwise(mine):
            assert earlier is not None and later is not None
            assert (later.size_before, later.mtime_before_ns) == (earlier.size, earlier.mtime_ns)
        for appended in mine:
            assert appended is not None
            assert data[appended.offset : appended.offset + appended.length + 1].endswith(b"}\n")
            assert appended.size == appended.offset + appended.length + 1
        last = mine[-1]
        assert last is not None
        assert (last.size, last.mtime_ns, last.inode) == (
            stat.st_size,
            stat.st_mtime_ns,
            stat.st_ino,
        )


def test_a_torn_tail_is_closed_before_the_first_line(tmp_path: Path) -> None:
    (tmp_path / "t.capture.jsonl").write_bytes(b'{"model_call_id": "torn"')
    outcomes, _ = append_batch(str(tmp_path), _requests(["t.capture.jsonl"] * 2), wait=True,
                               spare=Spare(), synced=set())  # fmt: skip
    first, second = (o.appended for o in outcomes)
    assert first is not None and second is not None
    assert (first.offset, first.written) == (25, len(_line(0)) + 1)
    assert second.offset == first.offset + first.length + 1
    read = CaptureStore(tmp_path).read("t")
    assert len(read.damaged) == 1
    assert [e.data["model_call_id"] for e in read.entries] == ["c0", "c1"]


@pytest.mark.parametrize("name", ["../escape.capture.jsonl", "a/b.capture.jsonl",
                                  "notes.txt", ".hidden.capture.jsonl", "x\x00.capture.jsonl"])  # fmt: skip
def test_a_name_that_is_not_a_capture_file_in_the_directory_is_refused(
    tmp_path: Path, name: str
) -> None:
    root = tmp_path / "calls"
    root.mkdir()
    outcomes, _ = append_batch(str(root), _requests([name, "ok.capture.jsonl"]), wait=True,
                               spare=Spare(), synced=set())  # fmt: skip
    refused, fine = outcomes
    assert refused.appended is None and refused.error is not None
    assert refused.error.errno == errno.EINVAL
    assert fine.appended is not None
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["calls", "ok.capture.jsonl"]


def test_a_file_another_process_holds_is_left_over_and_the_others_land(tmp_path: Path) -> None:
    busy = tmp_path / "busy.capture.jsonl"
    busy.write_bytes(b"")
    with held_by_another_process(busy):
        outcomes, blocked = append_batch(
            str(tmp_path), _requests(["busy.capture.jsonl", "free.capture.jsonl"] * 2),
            wait=False, spare=Spare(), synced=set(),
        )  # fmt: skip
        assert [o.request.name for o in outcomes] == ["free.capture.jsonl"] * 2
        assert [[r.job for r in group] for group in blocked] == [[0, 2]]
        assert busy.read_bytes() == b""
    outcomes, blocked = append_batch(
        str(tmp_path), blocked[0], wait=True, spare=Spare(), synced=set()
    )
    assert blocked == [] and all(o.appended is not None for o in outcomes)
    assert len(busy.read_bytes().splitlines()) == 2


def test_a_failed_fsync_cuts_that_files_lines_and_fails_each_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    CaptureStore(tmp_path).record("a", {"model_call_id": "before", "dialect": "chat"})
    size = (tmp_path / "a.capture.jsonl").stat().st_size
    real_fsync = os.fsync
    fails = {os.stat(tmp_path / "a.capture.jsonl").st_ino}

    def fsync(fd: int) -> None:
        if os.fstat(fd).st_ino in fails:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    names = ["a.capture.jsonl", "b.capture.jsonl", "a.capture.jsonl"]
    outcomes, _ = append_batch(
        str(tmp_path), _requests(names), wait=True, spare=Spare(), synced=set()
    )
    by_job = {o.request.job: o for o in outcomes}
    assert by_job[1].appended is not None
    for job in (0, 2):  # each call of the failed file fails on its own
        assert by_job[job].appended is None
        assert by_job[job].error is not None and by_job[job].error.errno == errno.EIO
    assert (tmp_path / "a.capture.jsonl").stat().st_size == size


def test_a_batch_of_more_files_than_one_commit_holds_lands_whole(tmp_path: Path) -> None:
    names = [f"{index}.capture.jsonl" for index in range(FILES_PER_COMMIT * 2 + 3)]
    outcomes, blocked = append_batch(
        str(tmp_path), _requests(names), wait=False, spare=Spare(), synced=set()
    )
    assert blocked == [] and len(outcomes) == len(names)
    assert all(o.appended is not None and o.appended.created for o in outcomes)
    assert len(list(tmp_path.glob("*.capture.jsonl"))) == len(names)


def test_a_new_files_name_is_durable_before_its_lock_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Else another writer could lock it, append and report its own line durable first."""
    from capture_core.appender import batch

    seen: list[str] = []

    def fsync_directory(fd: int) -> None:
        root = os.readlink(f"/proc/self/fd/{fd}")
        for path in sorted(Path(root).glob("*.capture.jsonl")):
            fd = os.open(path, os.O_RDONLY)
            try:  # another open file description: flock conflicts while the batch holds it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append(f"{path.name} free")
            except BlockingIOError:
                seen.append(f"{path.name} locked")
            finally:
                os.close(fd)

    monkeypatch.setattr(batch, "fsync_directory", fsync_directory)
    synced: set[str] = set()
    outcomes, _ = append_batch(str(tmp_path), _requests(["n.capture.jsonl"]), wait=True,
                               spare=Spare(), synced=synced)  # fmt: skip
    assert outcomes[0].appended is not None and seen == ["n.capture.jsonl locked"]
    assert synced == {"n.capture.jsonl"}
    append_batch(str(tmp_path), _requests(["n.capture.jsonl"]), wait=True, spare=Spare(),
                 synced=synced)  # fmt: skip
    assert len(seen) == 1  # made durable once per process
    # A name this process never made durable (its creator may have died first) is, once.
    append_batch(str(tmp_path), _requests(["n.capture.jsonl"]), wait=True, spare=Spare(),
                 synced=set())  # fmt: skip
    assert len(seen) == 2


def test_a_failed_directory_fsync_cuts_the_new_files_lines_and_fails_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from capture_core.appender import batch

    CaptureStore(tmp_path).record("old", {"model_call_id": "before", "dialect": "chat"})
    size = (tmp_path / "old.capture.jsonl").stat().st_size

    def fsync_directory(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(batch, "fsync_directory", fsync_directory)
    outcomes, _ = append_batch(str(tmp_path), _requests(["old.capture.jsonl", "new.capture.jsonl"]),
                               wait=True, spare=Spare(), synced={"old.capture.jsonl"})  # fmt: skip
    old, new = outcomes
    assert old.appended is not None and old.appended.offset == size
    assert new.appended is None and isinstance(new.error, OSError) and new.error.errno == errno.EIO
    assert (tmp_path / "new.capture.jsonl").read_bytes() == b""


def test_an_error_that_is_not_the_file_systems_releases_every_file_of_the_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from capture_core.appender import batch

    real = batch.write_lines

    def write_lines(path: str, lines: list[bytes], *, wait: bool) -> object:
        if path.endswith("b.capture.jsonl"):
            raise RuntimeError("a bug")
        return real(path, lines, wait=wait)

    monkeypatch.setattr(batch, "write_lines", write_lines)
    spare = Spare()
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(RuntimeError, match="a bug"):
        append_batch(str(tmp_path), _requests(["a.capture.jsonl", "b.capture.jsonl"]),
                     wait=True, spare=spare, synced=set())  # fmt: skip
    assert len(os.listdir("/proc/self/fd")) == before  # nothing left open
    assert (tmp_path / "a.capture.jsonl").read_bytes() == b""  # its line cut back
    with held_by_another_process(tmp_path / "a.capture.jsonl"):  # and its lock released
        pass


def test_out_of_descriptors_the_open_files_are_committed_and_the_rest_tried_again(
    tmp_path: Path,
) -> None:
    """In a process that can open only a few more files than it holds, one batch of 12 files
    still lands whole: the files open are committed (and closed) before the rest are tried."""
    code = textwrap.dedent("""
        import os, resource, sys
        from capture_core._spare import Spare
        from capture_core.appender.batch import append_batch
        from capture_core.appender.frames import Request
        root = sys.argv[1]
        spare = Spare()
        held = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (held + 3, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        requests = [Request(i, f"{i}.capture.jsonl", b"", b'{"model_call_id": "c%d"}\\n' % i) for i in range(12)]
        outcomes, _ = append_batch(root, requests, wait=True, spare=spare, synced=set())
        print(sum(o.appended is not None for o in outcomes), [str(o.error) for o in outcomes if o.error])
    """)  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "12 []", done.stdout + done.stderr
    assert len(list(tmp_path.glob("*.capture.jsonl"))) == 12
