"""Writers of a capture directory: live or dead by their lock, failure logs, markers, sweeps.

Dead writers are real processes killed with SIGKILL, so their locks go the way a crash takes
them.
"""

from __future__ import annotations

import errno
import fcntl
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from capture_core import CaptureStore
from capture_core.collect.attachment import capture_attachment
from capture_core.failures import read_capture_failures
from capture_core.pending import (
    PENDING_DIR,
    WRITERS_DIR,
    mark_pending,
    pending_calls,
    sweep_markers,
    wait_for_pending,
    writer_alive,
)
from capture_core.records import CaptureFailure
from capture_core.writers import FAILURES_DIR, CaptureWriter

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from capture_core.writers import CaptureWriter
    writer = CaptureWriter(Path(sys.argv[1]))
    for call in sys.argv[3:]:
        writer.mark(sys.argv[2], call)
    print(writer.token, flush=True)
    time.sleep(120)
    """
)


def dead_writer(root: Path, rollout_id: str, *calls: str) -> str:
    """Start a writer process that marks ``calls``, kill it with SIGKILL; return its token."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), rollout_id, *calls],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None
        token = child.stdout.readline().strip()
        assert token, "the writer did not start"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        if child.stdout is not None:
            child.stdout.close()
    return token


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[CaptureWriter]:
    w = CaptureWriter(tmp_path)
    yield w
    w.close()


def test_a_running_writer_is_alive_and_a_closed_or_killed_one_is_not(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path)
    assert writer_alive(tmp_path, writer.token)
    writer.close()
    assert not writer_alive(tmp_path, writer.token)
    assert not writer_alive(tmp_path, dead_writer(tmp_path, "0-0"))
    assert not writer_alive(tmp_path, "f" * 32)  # never registered


def test_markers_tell_live_writes_from_lost_ones(tmp_path: Path, writer: CaptureWriter) -> None:
    token = dead_writer(tmp_path, "0-0", "aaa1", "aaa2")
    assert writer.mark("0-0", "bbb1")
    mark_pending(tmp_path, "0-0", "ccc1")  # an older version's marker: no writer named
    mark_pending(tmp_path, "1-0", "ddd1", writer.token)
    states = {(p.model_call_id, p.writer, p.state) for p in pending_calls(tmp_path, "0-0")}
    assert states == {("aaa1", token, "dead"), ("aaa2", token, "dead"),
                      ("bbb1", writer.token, "live"), ("ccc1", None, "unknown")}  # fmt: skip
    assert [p.model_call_id for p in pending_calls(tmp_path, "1-0")] == ["ddd1"]
    writer.unmark("0-0", "bbb1")
    assert "bbb1" not in {p.model_call_id for p in pending_calls(tmp_path)}


def test_waiting_ends_at_once_when_only_lost_writes_remain(tmp_path: Path) -> None:
    dead_writer(tmp_path, "0-0", "aaa1")
    started = time.monotonic()
    left = wait_for_pending(tmp_path, "0-0", timeout_s=30)
    assert left == ["aaa1"]
    assert time.monotonic() - started < 10  # not the 30 s timeout: nothing can land


def test_sweep_removes_dead_markers_and_says_which_lines_landed(tmp_path: Path, writer: CaptureWriter) -> None:  # fmt: skip
    token = dead_writer(tmp_path, "0-0", "aaa1", "aaa2")
    writer.mark("0-0", "bbb1")
    preview = sweep_markers(tmp_path, landed=[("0-0", "aaa2")], dry_run=True)
    assert [p.model_call_id for p in preview.lost] == ["aaa1"]
    assert len(pending_calls(tmp_path)) == 3  # a dry run removes nothing
    report = sweep_markers(tmp_path, landed=[("0-0", "aaa2")])
    assert sorted((p.model_call_id, landed) for p, landed in report.removed) == [
        ("aaa1", False), ("aaa2", True)]  # fmt: skip
    assert report.live == 1 and report.unknown == 0
    assert report.writers_removed == [token]
    assert [p.model_call_id for p in pending_calls(tmp_path)] == ["bbb1"]
    assert writer_alive(tmp_path, writer.token)  # a live writer's lock is never touched
    assert sorted(p.name for p in (tmp_path / PENDING_DIR).iterdir()) == [f"{writer.token}.slots"]


def test_marks_are_slots_in_one_file_that_grows_and_a_clean_close_leaves_nothing(tmp_path: Path) -> None:  # fmt: skip
    writer = CaptureWriter(tmp_path)
    calls = [f"c{i}" for i in range(150)]  # more than the slots made at start
    assert all(writer.mark("0-0", call) for call in calls)
    assert [p.model_call_id for p in pending_calls(tmp_path, "0-0")] == sorted(calls)
    assert pending_calls(tmp_path, "0-1") == []
    for call in calls:
        writer.unmark("0-0", call)
    assert pending_calls(tmp_path) == []
    assert writer.mark("0-0", "again")  # a freed slot is reused
    assert writer.slots_path.stat().st_size % 256 == 0
    writer.unmark("0-0", "again")
    writer.close()
    assert list((tmp_path / PENDING_DIR).iterdir()) == []
    assert list((tmp_path / ".writers").iterdir()) == []
    assert list((tmp_path / FAILURES_DIR).iterdir())  # the failure log always stays


def test_a_long_rollout_id_fits_a_slot(tmp_path: Path, writer: CaptureWriter) -> None:
    rollout_id = "r" * 200
    assert writer.mark(rollout_id, "f" * 32)
    assert [p.rollout_id for p in pending_calls(tmp_path, rollout_id)] == [rollout_id]
    with pytest.raises(ValueError, match="rollout id"):
        writer.mark("../x", "c1")


def test_failures_are_logged_durably_and_read_back(tmp_path: Path, writer: CaptureWriter) -> None:
    for index in range(3):
        writer.record_failure(CaptureFailure(
            rollout_id=f"{index}-0", model_call_id=f"c{index}", dialect="chat",
            started_at=100.0 + index, failed_at=101.0 + index, reason="EMFILE: Too many open files",
            writer=writer.token))  # fmt: skip
    log = tmp_path / FAILURES_DIR / f"{writer.token}.jsonl"
    with log.open("ab") as handle:
        handle.write(b'{"torn": ')
    read = read_capture_failures(tmp_path)
    assert [f.model_call_id for f in read.failures] == ["c0", "c1", "c2"]
    assert len(read.damaged) == 1 and read.damaged[0].line_number == 4
    assert [f.model_call_id for f in read.for_rollout("1-0")] == ["c1"]
    assert read.for_rollout("1-0", since=101.5) == []
    assert read_capture_failures(tmp_path / "nowhere").failures == []


def test_a_new_writer_never_touches_an_old_failure_log(tmp_path: Path) -> None:
    first = CaptureWriter(tmp_path)
    first.record_failure(CaptureFailure(rollout_id="0-0", model_call_id="c0", failed_at=1.0,
                                        reason="ENOSPC"))  # fmt: skip
    first.close()
    second = CaptureWriter(tmp_path)
    second.close()
    assert [f.model_call_id for f in read_capture_failures(tmp_path).failures] == ["c0"]
    assert len(list((tmp_path / FAILURES_DIR).iterdir())) == 2


SPARE = textwrap.dedent(
    """
    import os, resource, sys
    from pathlib import Path
    from capture_core.writers import CaptureWriter
    writer = CaptureWriter(Path(sys.argv[1]))
    opened = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (opened + 8, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    while True:  # use every descriptor there is
        try:
            held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    try:
        os.open(os.devnull, os.O_RDONLY)
        print("no limit reached")
    except OSError as exc:
        print("exhausted", exc.errno)
    fd = writer.with_spare_descriptor(lambda: os.open(os.devnull, os.O_RDONLY))
    print("spare gave", fd)
    """
)


def test_the_spare_descriptor_makes_room_for_one_more(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SPARE, str(tmp_path)], capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines[0] == "exhausted 24", done.stdout + done.stderr  # EMFILE
    assert lines[1].startswith("spare gave "), done.stdout + done.stderr


def test_the_attachment_names_lost_and_failed_calls_one_by_one(tmp_path: Path, writer: CaptureWriter) -> None:  # fmt: skip
    store = CaptureStore(tmp_path, create=True)
    store.record("0-0", {"model_call_id": "landed1", "dialect": "chat"})
    dead_writer(tmp_path, "0-0", "lost1", "lost2", "landed1")
    for call in ("fail1", "fail2", "fail3"):
        writer.record_failure(CaptureFailure(rollout_id="0-0", model_call_id=call,
                                             started_at=time.time(), failed_at=time.time(),
                                             reason="ENOSPC: No space left on device"))  # fmt: skip
    store.mark_incomplete("0-0")
    attachment = capture_attachment([tmp_path], "0-0", drain_timeout_s=5)
    codes = [gap.code for gap in attachment.gaps]
    assert codes.count("model_call_capture_lost") == 2  # landed1's stale marker is no gap
    assert codes.count("model_call_capture_failed") == 3
    assert "model_call_capture_incomplete" not in codes  # explained call by call
    assert any("ENOSPC" in (gap.detail or "") for gap in attachment.gaps)
    assert attachment.metrics.num_calls == 1
    later = capture_attachment([tmp_path], "0-0", drain_timeout_s=5, since=time.time() + 60)
    assert [g.code for g in later.gaps].count("model_call_capture_failed") == 0
    assert "model_call_capture_incomplete" in [g.code for g in later.gaps]


def test_a_sweep_while_a_writer_starts_never_takes_it_for_dead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A sweep between the lock file's creation and its flock removed the lock file of a
    running server (was): from then on every reader took the server for dead."""
    real_flock = fcntl.flock  # readers call it too
    swept: list[object] = []

    def sweep_first(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_EX and not swept:  # a writer about to lock its file
            swept.append(sweep_markers(tmp_path))
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", sweep_first)
    writer = CaptureWriter(tmp_path)
    monkeypatch.undo()
    try:
        assert writer_alive(tmp_path, writer.token)
        assert sweep_markers(tmp_path).writers_removed == []
        assert writer.mark("0-0", "c1")
        assert [(p.model_call_id, p.state) for p in pending_calls(tmp_path)] == [("c1", "live")]
        writer.unmark("0-0", "c1")
    finally:
        writer.close()
    assert list((tmp_path / ".writers").iterdir()) == []


def test_closing_gives_back_the_space_reserved_for_the_failure_log(tmp_path: Path) -> None:
    """Was: every server start kept 1 MiB of disk for good (the log always stays, and so did
    its reservation beyond its end)."""
    writer = CaptureWriter(tmp_path)
    if not writer.reserved:
        pytest.skip("this file system cannot reserve space (fallocate)")
    writer.record_failure(CaptureFailure(rollout_id="0-0", model_call_id="c0", failed_at=1.0,
                                         reason="ENOSPC"))  # fmt: skip
    log = writer.failure_log
    assert log.stat().st_blocks * 512 >= 1 << 20
    writer.close()
    assert log.stat().st_blocks * 512 < 64 * 1024
    assert [f.model_call_id for f in read_capture_failures(tmp_path).failures] == ["c0"]


@pytest.mark.parametrize("folder", [PENDING_DIR, WRITERS_DIR, FAILURES_DIR])
def test_a_registration_folder_planted_as_a_symlink_is_refused(tmp_path: Path, folder: str) -> None:
    """A server registers only inside its capture directory: a ``.pending``, ``.writers`` or
    ``.failures`` that is a symlink stops it, and nothing is written where the link points."""
    root, elsewhere = tmp_path / "calls", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / folder).symlink_to(elsewhere)
    with pytest.raises(OSError) as caught:
        CaptureWriter(root)
    assert caught.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert list(elsewhere.iterdir()) == []
