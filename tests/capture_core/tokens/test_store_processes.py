"""TokenCaptureStore across real OS processes: concurrent appends, writers racing the freeze and
the drop fence, and writers SIGKILLed mid-append."""

from __future__ import annotations

import collections
import logging
import multiprocessing
import os
import random
import signal
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import orjson
import pytest

from capture_core.exceptions import TokenCaptureFrozenError, TokenCaptureRetiredError
from capture_core.tokens import (
    INTENTS_SUFFIX,
    STATE_SUFFIX,
    TokenCaptureState,
    TokenCaptureStore,
    TokenEntry,
)
from tests.capture_core._processes import join_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CTX = multiprocessing.get_context("fork")
# Failure timeout for what should happen promptly: it only bounds how long a broken run waits.
WAIT = 30.0


def _entry(rollout: str, call: str, size: int, pad: str = "") -> TokenEntry:
    items = [{"type": "message", "content": [{"type": "output_text", "text": pad}]}]
    return TokenEntry(
        rollout_id=rollout,
        model_call_id=call,
        prompt_token_ids=list(range(size)),
        generation_token_ids=[7, 8],
        generation_log_probs=[-0.5, -0.25],
        output_items=items,
        token_item_index=0,
    )


# --- a. 32 processes append to one rollout at once -------------------------------------------


def _append_some(root: str, writer: int, per_writer: int, barrier: Barrier) -> None:
    store = TokenCaptureStore(root)
    rng = random.Random(writer)
    barrier.wait(WAIT)
    for seq in range(per_writer):
        call = f"w{writer}-{seq}"
        store.begin_call_now("shared", call)
        store.append(_entry("shared", call, rng.choice([1, 500, 20_000]), "p" * rng.randint(0, 9)))


def test_32_processes_append_concurrently_and_every_entry_is_intact(tmp_path: Path) -> None:
    writers, per_writer = 32, 3
    store = TokenCaptureStore(tmp_path)
    barrier = CTX.Barrier(writers)
    processes = [
        CTX.Process(target=_append_some, args=(str(tmp_path), w, per_writer, barrier))
        for w in range(writers)
    ]
    for process in processes:
        process.start()
    join_all(processes, within_s=WAIT * 4)

    raw = store.path_for("shared").read_bytes()
    assert raw.endswith(b"\n")
    lines = raw[:-1].split(b"\n")
    assert len(lines) == writers * per_writer
    calls = [orjson.loads(line)["model_call_id"] for line in lines]  # every line whole JSON
    expected = {f"w{w}-{s}" for w in range(writers) for s in range(per_writer)}
    assert collections.Counter(calls) == dict.fromkeys(expected, 1)
    for w in range(writers):  # one process's appends keep their order
        mine = [c for c in calls if c.startswith(f"w{w}-")]
        assert mine == [f"w{w}-{s}" for s in range(per_writer)]
    state = store.state("shared")
    assert state.entry_digests.keys() == expected
    assert state.indexed_size == len(raw)
    assert state.version == writers * per_writer
    snapshot = store.freeze_now("shared")
    assert {e.model_call_id for e in snapshot.entries} == expected
    assert not snapshot.incomplete  # every intent was committed


# --- b. writers racing the freeze and the drop -------------------------------------------------

OK, LOST, FROZEN, RETIRED = "ok", "lost", "frozen", "retired"


def _racing_writer(
    root: str, rollout: str, writer: int, stop: Event, refusals: Any, conn: Connection
) -> None:
    """Put calls until told to stop, reporting each outcome. A call whose intent was recorded
    but whose entry was then refused is ``lost``. ``refusals`` counts [frozen, retired]."""
    store = TokenCaptureStore(root)
    seq = 0
    while not stop.is_set():
        call = f"w{writer}-{seq}"
        seq += 1
        announced = False
        try:
            store.begin_call_now(rollout, call)
            announced = True
            store.append(_entry(rollout, call, 50))
        except (TokenCaptureFrozenError, TokenCaptureRetiredError) as exc:
            retired = isinstance(exc, TokenCaptureRetiredError)
            with refusals.get_lock():
                refusals[int(retired)] += 1
            conn.send((call, LOST if announced else RETIRED if retired else FROZEN))
            time.sleep(0.001)
            continue
        conn.send((call, OK))
    conn.close()


def _outcomes(receiver: Connection) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []
    while True:
        try:
            got.append(receiver.recv())
        except EOFError:
            return got


def _wait_for(condition: Any) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the writers stalled"
        time.sleep(0.002)


@pytest.mark.parametrize("round_", range(3))
def test_no_write_succeeds_after_the_freeze_and_none_after_the_drop(
    tmp_path: Path, round_: int
) -> None:
    """Four writer processes put calls while the parent freezes, then drops, the rollout:
    the snapshot holds exactly the acknowledged entries, a call announced before the freeze
    and refused after it makes the snapshot incomplete, and each writer sees only successes,
    then refusals as frozen, then as retired."""
    store = TokenCaptureStore(tmp_path)
    rollout = f"race-{round_}"
    stop = CTX.Event()
    refusals = CTX.Array("i", 2)
    writers = 4
    pipes = [CTX.Pipe(duplex=False) for _ in range(writers)]
    processes = [
        CTX.Process(
            target=_racing_writer,
            args=(str(tmp_path), rollout, w, stop, refusals, pipes[w][1]),
        )
        for w in range(writers)
    ]
    for process in processes:
        process.start()
    for _, sender in pipes:
        sender.close()
    try:
        _wait_for(lambda: store.state(rollout).entry_digests)
        time.sleep(random.Random(round_).uniform(0.0, 0.05))
        snapshot = store.freeze_now(rollout)
        _wait_for(lambda: refusals[0] > 0)  # some writer was refused as frozen
        assert store.drop_now(rollout, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
        _wait_for(lambda: refusals[1] > 0)  # and some as retired
    finally:
        stop.set()
    outcomes = [_outcomes(receiver) for receiver, _ in pipes]
    join_all(processes, within_s=WAIT)

    acked = {call for mine in outcomes for call, outcome in mine if outcome == OK}
    lost = {call for mine in outcomes for call, outcome in mine if outcome == LOST}
    assert acked, "no write landed before the freeze"
    assert {e.model_call_id for e in snapshot.entries} == acked
    assert snapshot.incomplete == bool(lost)  # an intent without its entry is a lost call
    order = {OK: 0, LOST: 1, FROZEN: 1, RETIRED: 2}
    for mine in outcomes:  # per writer: successes, then refusals as frozen, then as retired
        ranks = [order[outcome] for _, outcome in mine]
        assert ranks == sorted(ranks), mine
    assert not store.path_for(rollout).exists()
    assert store.state(rollout).retired


# --- c. SIGKILL mid-append ------------------------------------------------------------------


def _crash_writer(root: str, rollout: str, child: int, conn: Connection) -> None:
    """Announce and append calls forever, reporting each call once its append returned.

    The first line and half the others carry megabytes of content: the write of such a line
    takes long enough (tens of ms here) for a SIGKILL to cut it short.
    """
    store = TokenCaptureStore(root)
    rng = random.Random(child)
    pads = ["z" * (rng.randint(1, 3) << 20), "y" * rng.randint(0, 4096)]
    seq = 0
    conn.send("ready")
    while True:
        call = f"k{child}-{seq}"
        store.begin_call_now(rollout, call)
        store.append(_entry(rollout, call, rng.randint(1, 300), pads[seq and rng.randint(0, 1)]))
        conn.send(call)
        seq += 1


class _Rollout:
    """What the parent knows about the rollout its children are killed on."""

    def __init__(self, store: TokenCaptureStore, rollout_id: str) -> None:
        self.store = store
        self.rollout_id = rollout_id
        self.acked: set[str] = set()
        self.torn_entries = 0
        self.torn_intents = 0

    def check_after_kills(self, caplog: pytest.LogCaptureFixture, parent_seq: int) -> None:
        """The state file is whole; the store takes a new append, which cuts a torn tail."""
        state_path = self.store.path_for(self.rollout_id, STATE_SUFFIX)
        if state_path.exists():
            raw = state_path.read_bytes()
            assert raw.endswith(b"\n"), "half-written state file"
            TokenCaptureState.model_validate(orjson.loads(raw))
        entries = self.store.path_for(self.rollout_id)
        torn = entries.exists() and entries.read_bytes()[-1:] not in (b"", b"\n")
        intents = self.store.path_for(self.rollout_id, INTENTS_SUFFIX)
        self.torn_intents += intents.exists() and intents.read_bytes()[-1:] not in (b"", b"\n")
        caplog.clear()
        call = f"parent-{parent_seq}"
        with caplog.at_level(logging.WARNING, "capture_core.tokens"):
            self.store.append(_entry(self.rollout_id, call, 3))
        self.acked.add(call)
        assert ("cut a torn token entry line" in caplog.text) == torn
        assert entries.read_bytes().endswith(b"\n")
        self.torn_entries += torn

    def check_and_retire(self) -> None:
        """Every acknowledged entry is in the snapshot, once; then the snapshot is dropped."""
        snapshot = self.store.freeze_now(self.rollout_id)
        calls = [e.model_call_id for e in snapshot.entries]
        assert len(calls) == len(set(calls))
        missing = self.acked - set(calls)
        assert not missing, f"acknowledged entries lost: {sorted(missing)[:5]}"
        assert self.store.drop_now(
            self.rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version
        )


def _mid_write(path: Path) -> bool:
    """Whether the entries file ends inside a line: some writer is (or was) mid-write."""
    try:
        with path.open("rb") as file:
            file.seek(-1, os.SEEK_END)
            return file.read(1) != b"\n"
    except (FileNotFoundError, OSError):
        return False


def _kill_batch(
    rollout: _Rollout, first_child: int, count: int, rng: random.Random, *, targeted: bool
) -> None:
    """Start ``count`` writers on the rollout at once, let them run, SIGKILL them all.

    At a random moment, or (``targeted``) as soon as the entries file is seen to end inside a
    line (a big line being written), within a bounded wait.
    """
    pipes = [CTX.Pipe(duplex=False) for _ in range(count)]
    root = str(rollout.store.root)
    processes = [
        CTX.Process(target=_crash_writer, args=(root, rollout.rollout_id, first_child + i, s))
        for i, (_, s) in enumerate(pipes)
    ]
    try:
        for process in processes:
            process.start()
        for receiver, sender in pipes:
            sender.close()
            assert receiver.poll(WAIT), "child never became ready"
            assert receiver.recv() == "ready"
        if targeted:
            path = rollout.store.path_for(rollout.rollout_id)
            until = time.monotonic() + 0.25
            while not _mid_write(path) and time.monotonic() < until:
                time.sleep(0.0005)
        else:
            time.sleep(rng.uniform(0.0, 0.06))
    finally:
        for process in processes:
            if process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)
        for process in processes:
            process.join(WAIT)
    assert [p.exitcode for p in processes] == [-signal.SIGKILL] * count
    for receiver, _ in pipes:
        while receiver.poll(0):
            try:
                rollout.acked.add(receiver.recv())
            except (EOFError, OSError):
                break
        receiver.close()


@pytest.mark.timeout(600)  # ~10 s on an idle machine; generous for a loaded CI box
def test_sigkill_mid_append_loses_no_acknowledged_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Writers (four at a time, contending for the rollout's lock) are SIGKILLed, >= 200 of
    them, half the batches at a random moment and half as soon as a line is seen half-written:
    the state file is always whole, the store always takes the next append (cutting a torn
    line with a warning), and no acknowledged entry is ever lost."""
    rng = random.Random(20260903)
    store = TokenCaptureStore(tmp_path)
    per_batch, min_kills, max_kills, per_rollout = 4, 200, 800, 24
    rollouts: list[_Rollout] = []
    started = time.monotonic()
    kills = 0
    # Whether a kill lands inside a write is up to the scheduler: past the minimum, keep going
    # (boundedly) until at least one entry line was torn and cut.
    while kills < min_kills or (kills < max_kills and not any(r.torn_entries for r in rollouts)):
        if kills % per_rollout == 0:
            if rollouts:
                rollouts[-1].check_and_retire()
            rollouts.append(_Rollout(store, f"crash-{len(rollouts)}"))
        _kill_batch(rollouts[-1], kills, per_batch, rng, targeted=kills % (2 * per_batch) != 0)
        rollouts[-1].check_after_kills(caplog, kills)
        kills += per_batch
    rollouts[-1].check_and_retire()

    torn = sum(r.torn_entries for r in rollouts)
    acked = sum(len(r.acked) for r in rollouts)
    assert kills >= min_kills
    assert torn > 0, "no SIGKILL landed mid-write: the torn-tail path was not exercised"
    with capsys.disabled():
        print(
            f"\n[token crash test] kills={kills} torn_entry_lines={torn} "
            f"torn_intents={sum(r.torn_intents for r in rollouts)} acknowledged={acked} "
            f"rollouts={len(rollouts)} seconds={time.monotonic() - started:.1f}"
        )
