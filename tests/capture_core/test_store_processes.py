"""CaptureStore across real OS processes: concurrent appends, per-file locking, SIGKILL crashes."""

from __future__ import annotations

import collections
import fcntl
import multiprocessing
import os
import random
import signal
import time
import uuid
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import orjson
import pytest

from capture_core.store import CaptureStore
from tests.capture_core._processes import join_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CTX = multiprocessing.get_context("fork")
# Failure timeout for anything that should happen promptly. Generous: it only bounds how long
# a broken run waits, and CI machines are slower and busier than a workstation.
WAIT = 30.0


def _line(**extra: Any) -> dict[str, Any]:
    return {
        "model_call_id": uuid.uuid4().hex,
        "dialect": "chat",
        "started_at": 1.0,
        "completed_at": 2.0,
        "latency_ms": 1000.0,
        "latency_ttft_ms": None,
        "status_code": 200,
        "error_category": None,
        "request": {"model": "m"},
        "response": {"model": "m", "choices": []},
        **extra,
    }


def _join_all(processes: list[Any]) -> None:
    join_all(processes, within_s=WAIT * 2)


# --- a. many processes append to one rollout ----------------------------------------------


def _append_many(root: str, rollout_id: str, writer: int, count: int, start: Event) -> None:
    store = CaptureStore(root)
    rng = random.Random(writer)
    start.wait(WAIT)
    for seq in range(count):
        pad = "w" * rng.choice([0, 10, 1_000, 20_000, 70_000])
        store.record(rollout_id, _line(writer=writer, seq=seq, request={"pad": pad}))


def test_four_processes_append_whole_lines(tmp_path: Path) -> None:
    writers, per_writer = 4, 250
    store = CaptureStore(tmp_path)
    start = CTX.Event()
    processes = [
        CTX.Process(target=_append_many, args=(str(tmp_path), "shared", w, per_writer, start))
        for w in range(writers)
    ]
    for process in processes:
        process.start()
    start.set()
    _join_all(processes)

    content = store.path_for("shared").read_bytes()
    assert content.endswith(b"\n")
    lines = content[:-1].split(b"\n")
    assert len(lines) == writers * per_writer
    parsed = [orjson.loads(line) for line in lines]  # every line is intact JSON
    pairs = collections.Counter((row["writer"], row["seq"]) for row in parsed)
    assert set(pairs) == {(w, s) for w in range(writers) for s in range(per_writer)}
    assert set(pairs.values()) == {1}
    for w in range(writers):  # one process's appends keep their order
        seqs = [row["seq"] for row in parsed if row["writer"] == w]
        assert seqs == sorted(seqs)
    read = store.read("shared", strict=True)
    assert [e.call_index for e in read.entries] == list(range(writers * per_writer))
    assert len(store.read_records("shared", strict=True).records) == writers * per_writer


# --- b. a stuck writer on one rollout does not block another ------------------------------


def _stuck_writer(path: str, line: bytes, locked: Event, release: Event) -> None:
    """A writer stuck mid-write: it holds the exclusive lock with half its line written."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    half = len(line) // 2
    os.write(fd, line[:half])
    locked.set()
    release.wait(WAIT * 3)
    os.write(fd, line[half:])
    os.fsync(fd)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _append_one(root: str, rollout_id: str, tag: str, started: Event, done: Event) -> None:
    store = CaptureStore(root)
    started.set()
    store.record(rollout_id, _line(tag=tag))
    done.set()


def _read_one(root: str, rollout_id: str, started: Event, conn: Connection) -> None:
    store = CaptureStore(root)
    started.set()
    read = store.read(rollout_id)
    conn.send(([e.data.get("tag") for e in read.entries], [d.reason for d in read.damaged]))


def test_stuck_writer_blocks_only_its_own_rollout(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    root = str(tmp_path)
    stuck_line = orjson.dumps(_line(tag="stuck")) + b"\n"
    locked, release = CTX.Event(), CTX.Event()
    y_started, y_done, x_started, x_done, reader_started = (CTX.Event() for _ in range(5))
    results, sender = CTX.Pipe(duplex=False)
    holder = CTX.Process(
        target=_stuck_writer, args=(str(store.path_for("x")), stuck_line, locked, release)
    )
    other = CTX.Process(target=_append_one, args=(root, "y", "to-y", y_started, y_done))
    same = CTX.Process(target=_append_one, args=(root, "x", "to-x", x_started, x_done))
    reader = CTX.Process(target=_read_one, args=(root, "x", reader_started, sender))
    processes = [holder]
    try:
        holder.start()
        assert locked.wait(WAIT)

        processes.append(other)
        other.start()
        assert y_done.wait(WAIT), "append to y waited for the lock on x"
        assert holder.is_alive()
        assert not release.is_set()

        processes += [same, reader]
        same.start()
        reader.start()
        sender.close()
        assert x_started.wait(WAIT)
        assert reader_started.wait(WAIT)
        assert not x_done.wait(0.3), "append to x went through while x was locked"
        assert not results.poll(0), "a reader saw x while a writer held it mid-line"
        assert store.path_for("x").read_bytes() == stuck_line[: len(stuck_line) // 2]
    finally:
        release.set()
    assert x_done.wait(WAIT)
    assert results.poll(WAIT)
    seen_tags, seen_damage = results.recv()
    results.close()
    assert seen_damage == []  # the reader never saw the half line
    assert seen_tags in (["stuck"], ["stuck", "to-x"])
    _join_all(processes)
    assert [e.data["tag"] for e in store.read("x", strict=True).entries] == ["stuck", "to-x"]
    assert [e.data["tag"] for e in store.read("y", strict=True).entries] == ["to-y"]


# --- c. SIGKILL at random moments ---------------------------------------------------------


def _crash_writer(root: str, rollout_id: str, child: int, conn: Connection) -> None:
    """Append big lines forever, reporting each seq once its record (fsynced) returned."""
    store = CaptureStore(root)
    rng = random.Random(child)
    conn.send("ready")
    seq = 0
    while True:
        pad = "z" * rng.randint(64 * 1024, 256 * 1024)
        store.record(rollout_id, _line(child=child, seq=seq, request={"pad": pad}))
        conn.send(seq)
        seq += 1


class _CrashLedger:
    """What the parent knows about one rollout file while children are killed on it."""

    def __init__(self, store: CaptureStore, rollout_id: str) -> None:
        self.store = store
        self.rollout_id = rollout_id
        self.reported: set[tuple[int, int]] = set()
        self.torn_offsets: set[int] = set()  # where each torn tail starts (never moves)
        self.complete_unterminated: set[int] = set()

    def note_tail(self) -> None:
        path = self.store.path_for(self.rollout_id)
        if not path.exists():  # killed before its first append created the file
            assert not self.reported, "a record was reported but its file does not exist"
            return
        content = path.read_bytes()
        if not content or content.endswith(b"\n"):
            return
        start = content.rfind(b"\n") + 1
        try:
            whole = isinstance(orjson.loads(content[start:]), dict)
        except orjson.JSONDecodeError:
            whole = False
        if whole:  # killed between the object's last byte and its newline
            self.complete_unterminated.add(start)
        else:
            self.torn_offsets.add(start)

    def check(self) -> None:
        read = self.store.read(self.rollout_id)  # tolerant: must never raise
        assert {d.byte_offset for d in read.damaged} == self.torn_offsets
        assert len(read.damaged) == len(self.torn_offsets)
        present = collections.Counter((e.data["child"], e.data["seq"]) for e in read.entries)
        assert all(count == 1 for count in present.values())
        assert self.reported <= set(present)
        indexes = sorted(
            [e.call_index for e in read.entries] + [d.call_index for d in read.damaged]
        )
        assert indexes == list(range(len(indexes)))

    def final_append(self) -> None:
        last = _line(child=-1, seq=0)
        self.store.record(self.rollout_id, last)
        read = self.store.read(self.rollout_id)
        assert read.entries[-1].data == last
        assert read.entries[-1].call_index == len(read.entries) + len(read.damaged) - 1
        assert {d.byte_offset for d in read.damaged} == self.torn_offsets
        assert all("torn" not in d.reason for d in read.damaged)  # the last tail was closed


def _kill_once(ledger: _CrashLedger, child: int, rng: random.Random) -> None:
    receiver, sender = CTX.Pipe(duplex=False)
    process = CTX.Process(
        target=_crash_writer, args=(str(ledger.store.root), ledger.rollout_id, child, sender)
    )
    process.start()
    sender.close()
    try:
        assert receiver.poll(WAIT), "child never became ready"
        assert receiver.recv() == "ready"
        time.sleep(rng.uniform(0.0, 0.015))
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.join(WAIT)
    assert process.exitcode == -signal.SIGKILL
    while receiver.poll(0):
        try:
            ledger.reported.add((child, receiver.recv()))
        except (EOFError, OSError):
            break
    receiver.close()
    ledger.note_tail()


@pytest.mark.timeout(300)  # 240 kills take ~15 s here, ~30 s with two CPU hogs; slack for CI
def test_sigkill_mid_append_leaves_only_torn_tails(
    tmp_path: Path, record_property: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(20240611)
    store = CaptureStore(tmp_path)
    min_kills, per_rollout = 240, 40  # a fresh rollout now and then keeps files small
    # Whether a kill lands inside a write depends on scheduling: on a busy machine the first
    # 240 kills may tear no line. Then go on, for this long after them, until one does.
    extra_s = 90.0
    ledgers: list[_CrashLedger] = []
    started = time.monotonic()
    child = 0
    extra_until = float("inf")  # set once the minimum is reached
    while child < min_kills or (
        not any(ledger.torn_offsets for ledger in ledgers) and time.monotonic() < extra_until
    ):
        if child % per_rollout == 0:
            if ledgers:
                ledgers[-1].check()
                ledgers[-1].final_append()
                ledgers[-1].check()
            ledgers.append(_CrashLedger(store, f"crash-{len(ledgers)}"))
        _kill_once(ledgers[-1], child, rng)
        if child % 10 == 9:
            ledgers[-1].check()
        child += 1
        if child == min_kills:
            extra_until = time.monotonic() + extra_s
    ledgers[-1].check()
    ledgers[-1].final_append()
    ledgers[-1].check()

    torn = sum(len(ledger.torn_offsets) for ledger in ledgers)
    whole = sum(len(ledger.complete_unterminated) for ledger in ledgers)
    reported = sum(len(ledger.reported) for ledger in ledgers)
    assert reported > 0
    assert torn > 0, "no SIGKILL landed mid-write: the torn-tail path was not exercised"
    record_property("torn_tails", torn)
    with capsys.disabled():
        print(
            f"\n[crash test] kills={child} torn_tails={torn} complete_but_unterminated={whole}"
            f" reported_records={reported} seconds={time.monotonic() - started:.1f}"
        )
