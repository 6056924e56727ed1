"""LineageStore across real OS processes: writers racing a retirer, and concurrent appends."""

from __future__ import annotations

import collections
import hashlib
import json
import multiprocessing
import random
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest

from capture_core.lineage import LineageStore, RecordOutcome
from capture_core.staging.manifest import CallRecord, ManifestFailure
from tests.capture_core._processes import join_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

CTX = multiprocessing.get_context("fork")
WAIT = 20.0
WRITERS = 4
ROLLOUTS = 50
ROUNDS = 20


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _row(rollout: str, call: str) -> CallRecord:
    return CallRecord(
        model_call_id=call,
        prev_len=0,
        delta_len=2,
        cum_len=2,
        weight_version=0,
        digest=_hex(call),
        extras_digest=_hex("e"),
        staging_key=f"{rollout}/{call}",
        mode="text",
        chain_hash=_hex(f"chain {call}"),
        cumulative_hash=_hex(f"cum {call}"),
        response_id=f"resp_{call}",
    )


def _rollouts(round_: int) -> list[str]:
    return [f"g{round_}-{i}" for i in range(ROLLOUTS)]


def _writer(root: str, writer: int, barrier: Barrier, out: str) -> None:
    store = LineageStore(root)
    rng = random.Random(writer)
    outcomes: list[tuple[str, str, str]] = []
    for round_ in range(ROUNDS):
        barrier.wait(WAIT)
        ids = _rollouts(round_)
        rng.shuffle(ids)
        for rollout in ids:
            call = f"w{writer}-{round_}"
            outcomes.append((rollout, call, store.record(rollout, _row(rollout, call))))
        # A retried commit and a failure row, for one rollout each.
        again = ids[0]
        outcomes.append(
            (again, f"w{writer}-{round_}", store.record(again, _row(again, f"w{writer}-{round_}")))
        )
        failed = ManifestFailure(
            model_call_id=f"f{writer}-{round_}", reason="worker_capture_failed"
        )
        outcomes.append((ids[1], failed.model_call_id, store.record_failure(ids[1], failed)))
    Path(out).write_text(json.dumps(outcomes))


def _retirer(root: str, barrier: Barrier, out: str) -> None:
    store = LineageStore(root)
    rng = random.Random(99)
    report: list[dict[str, Any]] = []
    for round_ in range(ROUNDS):
        chosen = rng.sample(_rollouts(round_), ROLLOUTS // 2)
        barrier.wait(WAIT)
        for start in range(0, len(chosen), 5):
            removal = store.retire(chosen[start : start + 5])
            report.append({"removed": removal.removed, "absent": removal.absent})
            time.sleep(rng.uniform(0, 0.004))
    Path(out).write_text(json.dumps(report))


def _run(target: Any, *args: Any) -> Any:
    process = CTX.Process(target=target, args=args)
    process.start()
    return process


def _join_all(processes: list[Any]) -> None:
    join_all(processes, within_s=45)


def test_writers_racing_a_retirer(tmp_path: Path) -> None:
    root = tmp_path / "lineage"
    store = LineageStore(root)
    barrier = CTX.Barrier(WRITERS + 1)
    began = time.monotonic()
    processes = [
        _run(_writer, str(root), w, barrier, str(tmp_path / f"w{w}.json")) for w in range(WRITERS)
    ]
    processes.append(_run(_retirer, str(root), barrier, str(tmp_path / "retired.json")))
    _join_all(processes)
    elapsed = time.monotonic() - began

    report = json.loads((tmp_path / "retired.json").read_text())
    retired = {rid for batch in report for rid in batch["removed"] + batch["absent"]}
    assert len(retired) == ROUNDS * ROLLOUTS // 2
    outcomes: list[tuple[str, str, str]] = []
    for w in range(WRITERS):
        outcomes += [tuple(o) for o in json.loads((tmp_path / f"w{w}.json").read_text())]
    tally = collections.Counter(o[2] for o in outcomes)

    appended: dict[str, set[str]] = collections.defaultdict(set)
    for rollout, call, outcome in outcomes:
        if rollout in retired:
            continue  # a retired rollout's rows may have been appended before the retire
        assert outcome != RecordOutcome.DISCARDED_RETIRED, (rollout, call)
        if outcome == RecordOutcome.APPENDED:
            appended[rollout].add(call)

    everything = {rid for round_ in range(ROUNDS) for rid in _rollouts(round_)}
    for rollout in sorted(retired):
        assert not store.ledger_path(rollout).exists(), rollout
        assert store.is_retired(rollout)
    for rollout in sorted(everything - retired):
        raw = store.ledger_path(rollout).read_bytes()
        assert raw.endswith(b"\n")
        rows = [json.loads(line) for line in raw.splitlines()]
        ids = [r["model_call_id"] for r in rows]
        assert len(ids) == len(set(ids)), rollout
        manifest = store.manifest(rollout)
        listed = {r.model_call_id for r in manifest.records} | {
            f.model_call_id for f in manifest.failures
        }
        assert listed == appended[rollout] == set(ids), rollout
        assert {r.model_call_id for r in manifest.records} == {
            f"w{w}-{rollout.split('-')[0][1:]}" for w in range(WRITERS)
        }

    # Both orders happened: retires that removed a ledger and late writes that were discarded.
    assert any(batch["removed"] for batch in report)
    assert tally[RecordOutcome.DISCARDED_RETIRED] > 0
    assert tally[RecordOutcome.DUPLICATE] > 0
    print(f"race: {dict(tally)}, retired {len(retired)}, {elapsed:.1f}s")


def _append_to_one(root: str, writer: int, count: int, barrier: Barrier) -> None:
    store = LineageStore(root)
    barrier.wait(WAIT)
    for seq in range(count):
        store.record("shared", _row("shared", f"w{writer}-{seq}"))


def test_concurrent_appends_to_one_ledger_stay_whole(tmp_path: Path) -> None:
    barrier = CTX.Barrier(WRITERS)
    processes = [_run(_append_to_one, str(tmp_path), w, 100, barrier) for w in range(WRITERS)]
    _join_all(processes)
    records = LineageStore(tmp_path).manifest("shared").records
    assert len(records) == WRITERS * 100
    for w in range(WRITERS):
        own = [r.model_call_id for r in records if r.model_call_id.startswith(f"w{w}-")]
        assert own == [f"w{w}-{seq}" for seq in range(100)]
