"""``ngcapture collect`` end to end: real worker and capture server processes on loopback."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from capture_core import CaptureStore
from capture_core.collect import CLEARED_DIR, CollectConfig, SimpleAgent, collect, run_tool
from capture_core.pending import mark_pending, wait_for_pending
from capture_core.testing.processes import ServiceProcess, run_capture_server, run_worker

METRIC_KEYS = ["tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens",
               "latency_total_ms", "num_calls"]  # fmt: skip
SEED_CALL_KEYS = {"model_call_id", "response_id", "call_index", "model_ref", "model", "dialect",
                  "status_code", "response_status", "tokens_in", "tokens_out", "tokens_reasoning",
                  "tokens_total", "latency_total_ms"}  # fmt: skip
PAYLOADS = {"request", "response", "request_raw", "response_raw"}
CAPTURE_KEYS = ("ng_model_call_capture", "ng_trajectory")
#: Without capture the agent's own evidence is still projected, but never joined to calls.
EVIDENCE_KEYS = (*CAPTURE_KEYS, "ng_agent_observations", "ng_perf")


@pytest.fixture(scope="module")
def worker() -> Iterator[ServiceProcess]:
    with run_worker(seed=11, ttft_ms=2, ms_per_token=0.02) as service:
        yield service


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    return tmp_path / "model-calls"


@pytest.fixture
def server(worker: ServiceProcess, capture_dir: Path) -> Iterator[ServiceProcess]:
    with run_capture_server(worker.url, capture_dir) as service:
        yield service


def read(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def by_key(records: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    keyed = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in records}
    assert len(keyed) == len(records)
    return keyed


def capture_lines(capture_dir: Path, rollout_id: str) -> list[bytes]:
    return CaptureStore(capture_dir).path_for(rollout_id).read_bytes().splitlines()


def check_attachment(record: Mapping[str, Any], capture_dir: Path) -> None:
    """The seed's shape key for key, and totals that match the calls and the capture file."""
    capture = record["ng_model_call_capture"]
    assert list(capture) == ["rollout_id", "metrics", "calls"]  # no gaps key when none
    assert list(capture["metrics"]) == METRIC_KEYS
    metrics, calls = capture["metrics"], capture["calls"]
    assert (
        metrics["num_calls"] == len(calls) == len(capture_lines(capture_dir, capture["rollout_id"]))
    )
    for call in calls:
        assert set(call) >= SEED_CALL_KEYS and not set(call) & PAYLOADS
    for name in METRIC_KEYS[:5]:
        reported = [c[name] for c in calls if c[name] is not None]
        assert metrics[name] == (sum(reported) if reported else None), name
    assert math.isclose(metrics["latency_total_ms"], sum(c["latency_total_ms"] for c in calls))
    trajectory = record["ng_trajectory"]
    assert trajectory["rollout_id"] == capture["rollout_id"]
    assert [c["model_call_id"] for c in trajectory["model_calls"]] == [
        c["model_call_id"] for c in calls
    ]
    assert trajectory["model_calls"][-1]["response"]["id"] == record["response"]["id"]


def test_cli_collects_20_tasks_twice_with_the_seed_attachment(
    server: ServiceProcess, capture_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "rollouts.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "capture_core.cli", "collect", "--output", str(output),
         "--model-url", server.url, "--capture-dir", str(capture_dir), "--limit", "20",
         "--num-repeats", "2", "--concurrency", "4"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "rollouts: 40 ok, 0 failed" in done.stdout
    assert "gaps: none" in done.stdout
    assert "collect [" not in done.stderr  # no progress bar when stderr is not a terminal
    assert "HTTP Request" not in done.stderr  # no log line per model call
    run_id = done.stdout.split("run id: ", 1)[1].split()[0]
    records = read(output)
    assert len(records) == 40
    keyed = by_key(records)
    assert set(keyed) == {(t, r) for t in range(20) for r in range(2)}
    for (task, repeat), record in keyed.items():
        assert record["ng_model_call_capture"]["rollout_id"] == f"{run_id}.{task}-{repeat}"
        assert record["_ng_run_id"] == run_id
        assert record["task_id"] == f"mcqa-{task:03d}"  # the bundled example tasks
        assert record["ng_trajectory"]["task_id"] == record["task_id"]
        assert record["reward"] == (1.0 if record["parsed_answer"] == record["answer"] else 0.0)
        check_attachment(record, capture_dir)
    assert not Path(str(output).replace(".jsonl", "_failures.jsonl")).read_bytes()
    bad = subprocess.run(
        [sys.executable, "-m", "capture_core.cli", "collect", "--output", str(output),
         "--model-url", server.url, "--num-repeats", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "'--num-repeats': 0 is not in the range x>=1" in bad.stderr
    assert len(read(output)) == 40  # a refused run touches nothing


def test_capture_is_additive(worker: ServiceProcess, server: ServiceProcess, capture_dir: Path,
                             tmp_path: Path) -> None:  # fmt: skip
    on = tmp_path / "on.jsonl"
    options: dict[str, Any] = {"limit": 8, "num_repeats": 2, "tools": True}
    summary = collect(CollectConfig(None, on, server.url, [capture_dir], **options))
    assert summary.ok == 16 and summary.num_calls == 32  # one tool round trip each
    captured = by_key(read(on))
    for record in captured.values():
        check_attachment(record, capture_dir)
    with run_capture_server(worker.url, None) as uncaptured:
        off = collect(CollectConfig(None, tmp_path / "off.jsonl", uncaptured.url, **options))
    # The server still captures; the collector neither clears nor reads (nor attaches).
    no_dirs = collect(CollectConfig(None, tmp_path / "nodirs.jsonl", server.url, **options))
    assert (off.ok, no_dirs.ok, off.num_calls, no_dirs.num_calls) == (16, 16, 0, 0)
    stripped = {
        k: {f: v for f, v in r.items() if f not in EVIDENCE_KEYS} for k, r in captured.items()
    }
    for path in (tmp_path / "off.jsonl", tmp_path / "nodirs.jsonl"):
        plain = by_key(read(path))
        for record in plain.values():
            assert not {"ng_model_call_capture", "ng_perf"} & set(record)
            gaps = [g["code"] for g in record["ng_trajectory"]["gaps"]]
            assert gaps == ["model_calls_unavailable", "perf_unavailable"]
        assert {k: {f: v for f, v in r.items() if f not in EVIDENCE_KEYS}
                for k, r in plain.items()} == stripped  # fmt: skip


FLAKY = textwrap.dedent("""
    import sys, time
    from capture_core.collect import CollectConfig, SimpleAgent, collect
    url, output, capture_dir = sys.argv[1:4]
    inner = SimpleAgent(url)

    class Flaky:
        def run(self, row, rollout_id):
            result = inner.run(row, rollout_id)  # the model call is captured either way
            if row["_ng_task_index"] in (1, 2):
                raise RuntimeError("deterministic failure")
            time.sleep(0.4)  # slow enough to be killed with rollouts in flight
            return result

    collect(CollectConfig(None, output, url, [capture_dir], limit=16, concurrency=2),
            agent=Flaky())
""")


def finished_lines(output: Path) -> bytes:
    """The whole lines of a rollout file (none when it is not there yet)."""
    written = output.read_bytes() if output.exists() else b""
    return written[: written.rfind(b"\n") + 1]


def captured_in_flight(capture_dir: Path, finished: Mapping[tuple[int, int], Any]) -> set[str]:
    """First attempts with a captured call and no finished line, the two failing tasks aside."""
    return {rid for rid in CaptureStore(capture_dir).rollout_ids() if "-a" not in rid
            and tuple(map(int, rid.split("-"))) not in finished} - {"1-0", "2-0"}  # fmt: skip


def test_resume_after_a_kill(server: ServiceProcess, capture_dir: Path, tmp_path: Path) -> None:
    output, sidecar = tmp_path / "rollouts.jsonl", tmp_path / "rollouts_failures.jsonl"
    process = subprocess.Popen([sys.executable, "-c", FLAKY, server.url, str(output), str(capture_dir)])  # fmt: skip
    try:
        # Killed once some rollouts are done, both failures recorded, and a rollout is between
        # its captured call and its line (0.4 s): when that is seen, not after a fixed count.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            done = by_key([orjson.loads(line) for line in finished_lines(output).splitlines()])
            failures = sidecar.read_bytes().count(b"\n") if sidecar.exists() else 0
            if len(done) >= 3 and failures >= 2 and captured_in_flight(capture_dir, done):
                break
            time.sleep(0.01)
        assert process.poll() is None, "the collection finished before it could be killed"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(10)
    before = finished_lines(output)
    finished = by_key([orjson.loads(line) for line in before.splitlines()])
    assert [r["ng_failure"]["attempt"] for r in read(sidecar)] == [0, 0]
    in_flight = captured_in_flight(capture_dir, finished)
    assert in_flight, "no rollout was killed in flight"
    old_attempt = {rid: capture_lines(capture_dir, rid) for rid in ("1-0", "2-0", *in_flight)}
    CaptureStore(capture_dir).record("1-0-a1", {"model_call_id": "stale", "dialect": "chat"})

    summary = collect(CollectConfig(None, output, server.url, [capture_dir], limit=16, resume=True))
    after = output.read_bytes()
    assert after.startswith(before)  # finished rows' lines are byte-identical
    assert (summary.already_finished, summary.dispatched, summary.ok) == (len(finished), 16 - len(finished), 16 - len(finished))  # fmt: skip
    new = by_key([orjson.loads(line) for line in after[len(before) :].splitlines()])
    assert set(new) | set(finished) == {(t, 0) for t in range(16)} and not set(new) & set(finished)
    for (task, _), record in new.items():
        rollout_id = record["ng_model_call_capture"]["rollout_id"]
        assert rollout_id == (f"{task}-0-a1" if task in (1, 2) else f"{task}-0")
        assert record.get("_ng_attempt_index") == (1 if task in (1, 2) else None)
        check_attachment(record, capture_dir)  # one line per call: only the new attempt's
        (line,) = capture_lines(capture_dir, rollout_id)
        assert orjson.loads(line)["model_call_id"] == record["ng_model_call_capture"]["calls"][0]["model_call_id"]  # fmt: skip
    for rollout_id in ("1-0", "2-0"):  # the failed attempts' capture is kept apart, untouched
        assert capture_lines(capture_dir, rollout_id) == old_attempt[rollout_id]
    archived = {p.name.split(".")[0]: p for p in (capture_dir / CLEARED_DIR).iterdir()}
    assert set(archived) == {*in_flight, "1-0-a1"}  # exactly the re-run ids that had capture
    for rollout_id in in_flight:
        assert archived[rollout_id].read_bytes().splitlines() == old_attempt[rollout_id]
    assert summary.cleared_files == len(in_flight) + 1
    assert len(read(sidecar)) == 2


def test_a_write_that_never_lands_does_not_hang_the_collector(
    server: ServiceProcess, capture_dir: Path, tmp_path: Path
) -> None:
    inner = SimpleAgent(server.url)

    class StuckWrite:
        def run(self, row: Mapping[str, Any], rollout_id: str) -> dict[str, Any]:
            result = inner.run(row, rollout_id)
            if row["_ng_task_index"] == 0:  # a detached write that never lands
                mark_pending(capture_dir, rollout_id, "0" * 32)
            return result

    mark_pending(capture_dir, "1-0", "1" * 32)  # stuck since an earlier run
    started = time.monotonic()
    config = CollectConfig(None, tmp_path / "r.jsonl", server.url, [capture_dir], limit=4,
                           drain_timeout_s=1.0)  # fmt: skip
    summary = collect(config, agent=StuckWrite())
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 2 * 1.0 + 8  # clearing and draining are each bounded
    assert summary.cleared_still_pending == 1
    assert summary.gaps == {"model_call_capture_pending": 2}
    records = by_key(read(tmp_path / "r.jsonl"))
    for key in ((0, 0), (1, 0)):
        capture = records[key]["ng_model_call_capture"]
        assert capture["gaps"] == [{"code": "model_call_capture_pending", "detail": "count=1"}]
        assert capture["metrics"]["num_calls"] == 1
    assert "gaps" not in records[2, 0]["ng_model_call_capture"]


def test_damaged_capture_and_incomplete_marker_keep_the_other_calls(
    server: ServiceProcess, capture_dir: Path, tmp_path: Path
) -> None:
    inner = SimpleAgent(server.url)
    store = CaptureStore(capture_dir)

    class Damaging:
        def run(self, row: Mapping[str, Any], rollout_id: str) -> dict[str, Any]:
            result = inner.run(row, rollout_id)
            if row["_ng_task_index"] == 0:
                # The client can hold the whole body before the line is durable: let it land.
                assert wait_for_pending(capture_dir, rollout_id, timeout_s=10) == []
                with store.path_for(rollout_id).open("ab") as handle:
                    handle.write(b'{"model_call_id": "torn", "dial')  # a writer died mid-line
                store.mark_incomplete(rollout_id)
                result = inner.run(row, rollout_id)  # a later call still lands, on a new line
            return result

    collect(CollectConfig(None, tmp_path / "r.jsonl", server.url, [capture_dir], limit=2),
            agent=Damaging())  # fmt: skip
    records = by_key(read(tmp_path / "r.jsonl"))
    capture = records[0, 0]["ng_model_call_capture"]
    assert [c["call_index"] for c in capture["calls"]] == [0, 2]
    assert capture["metrics"]["num_calls"] == 2
    assert capture["gaps"] == [
        {"code": "model_call_capture_records_unreadable", "detail": "count=1"},
        {"code": "model_call_capture_incomplete"},
    ]
    gaps = records[0, 0]["ng_trajectory"]["gaps"]
    assert [g for g in gaps if g["code"].startswith("model_call_capture_")] == [
        {**g, "invocation_id": None, "detail": g.get("detail")} for g in capture["gaps"]]  # fmt: skip
    # The agent ran twice: the same request got the same response id, so the reference the
    # second run reports names two captured calls, and the join does not guess.
    assert gaps[0]["code"] == "model_call_reference_ambiguous"
    assert gaps[-1] == {"code": "perf_unavailable", "invocation_id": None,
                        "detail": "capture:model_call_capture_records_unreadable"}  # fmt: skip
    assert len(records[0, 0]["ng_trajectory"]["model_calls"]) == 2
    assert "gaps" not in records[1, 0]["ng_model_call_capture"]


def test_tools_show_in_the_trajectory_with_their_outputs(
    server: ServiceProcess, capture_dir: Path, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"id": "t0", "question": "What is the speed of light?", "options": '
        '{"A": "300,000 km/s", "B": "3 km/s"}, "answer": "A"}\n'
        "this line is not JSON\n"
        '{"id": "t2", "prompt": "Compute 6 * 7 with the calculator."}\n'
    )
    summary = collect(CollectConfig(tasks, tmp_path / "r.jsonl", server.url, [capture_dir],
                                    tools=True, dialect="chat"))  # fmt: skip
    assert [(b.line_number, b.reason[:14]) for b in summary.bad_input_lines] == [
        (2, "not valid JSON")
    ]
    assert (summary.tasks, summary.ok) == (2, 2)
    records = by_key(read(tmp_path / "r.jsonl"))
    assert set(records) == {(0, 0), (2, 0)}  # task index = line in the input
    assert records[2, 0]["reward"] is None  # no answer to grade against
    for record in records.values():
        check_attachment(record, capture_dir)
        (tool,) = record["ng_trajectory"]["tool_calls"]  # as the agent ran it, timed
        (asked,) = record["ng_model_call_capture"]["calls"][0]["tool_calls"]  # as the model asked
        assert (tool["tool_call_id"], tool["tool_name"]) == (asked["call_id"], asked["name"])
        assert tool["status"] == "completed" and tool["started_at"] <= tool["completed_at"]
        arguments = orjson.dumps(asked["arguments"]).decode()
        assert tool["output"] == run_tool(tool["tool_name"], arguments)
        assert record["turns"] == 2
        assert "ng_perf" in record
