"""Proxy cost vs NeMo Gym (issue 14, item 7): one run, configurations interleaved.

Four configurations in front of the same simulated worker (``ngcapture worker --ttft-ms 0
--ms-per-token 0``, so what is measured is the proxy's own work):

* ``direct``: the worker itself;
* ``ngcapture off`` / ``ngcapture on``: ``ngcapture serve`` without and with a capture
  directory (local disk);
* ``NeMo Gym``: Gym's own model server with its capture middleware on (see ``proxy_gym``).

Each round measures every configuration in turn (the order rotates between rounds): at c=1,
one keep-alive client (TCP_NODELAY) makes N non-streamed then N streamed chat calls
(latency = time to the full body); at c=64, ``wrk -t1 -c64`` POSTs non-streamed chat for a
fixed time, requests cycling round-robin over 64 rollout ids (``bench-0`` .. ``bench-63``,
so appends do not all serialise on one file; at 64 connections about one request per id is
in flight). Server CPU is utime+stime of the server process tree (all threads) from
``/proc/<pid>/stat`` before and after each run, divided by the calls completed; the worker's is
reported separately. The machine's other load during each wrk run (busy CPU from
``/proc/stat`` minus the servers, the worker and wrk) is recorded as noise. Numbers are medians
of the rounds with their range.

Goals (issue 14): capture adds ≤ 0.5 ms p50 and ≤ 2 ms p99 at c=1; at c=64 ngcapture with
capture on serves ≥ 1.2× Gym's req/s at ≤ 0.8× Gym's server CPU per captured call; capture on
keeps ≥ 85 % of capture off's req/s. When Gym cannot be installed or run, the error is
reported and the issue's quoted figures (330 req/s, 3.2 ms per call) stand in.

Run: ``python -m benchmarks --only proxy [--quick]``, or ``python -m benchmarks.proxy`` with
``--rounds/--seconds/--requests/--no-gym``; ``python -m benchmarks.proxy --profile`` runs
py-spy on the ngcapture proxy (capture on) at c=64 and writes ``proxy-profile.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson

from benchmarks import proxy_gym
from benchmarks.proxy_measure import (
    count_capture_lines,
    ensure_wrk,
    machine_busy_s,
    quantile,
    run_wrk,
    serial_calls,
    tree_cpu_s,
    wrk_script,
)
from benchmarks.proxy_plan import CONCURRENCY, OUT, Plan, Target, _code_identity
from benchmarks.proxy_profile import profile
from benchmarks.proxy_report import markdown, rows, summarise
from capture_core.testing import request_body
from capture_core.testing.processes import ServiceProcess, run_capture_server, run_worker


def _cpu(target: Target, worker: ServiceProcess) -> tuple[float, float]:
    proxy = tree_cpu_s(target.service.process.pid) if target.is_proxy else 0.0
    return proxy, tree_cpu_s(worker.process.pid)


def _settled_lines(directory: Path | None, expected: int, *, limit_s: float = 5.0) -> int:
    """Capture lines once ``expected`` have landed (or ``limit_s`` passed) and none has landed
    for 0.3 s: Gym answers a non-streamed call before its line is written, and calls that wrk
    abandons at its deadline may still land. A shortfall after that is a lost line."""
    if directory is None:
        return 0
    deadline = time.monotonic() + limit_s
    count = count_capture_lines(directory)
    while count < expected and time.monotonic() < deadline:
        time.sleep(0.05)
        count = count_capture_lines(directory)
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if (now := count_capture_lines(directory)) == count:
            break
        count = now
    return count


def _serial(target: Target, worker: ServiceProcess, body: bytes, requests: int) -> dict[str, Any]:
    serial_calls(target.service.port, target.path_for, body, requests=0, warm=20)
    lines0, (proxy0, worker0) = _settled_lines(target.capture_dir, 0), _cpu(target, worker)
    run = serial_calls(target.service.port, target.path_for, body, requests=requests, warm=0)
    proxy1, worker1 = _cpu(target, worker)
    calls = len(run.latencies_s)
    return {
        "p50_ms": statistics.median(run.latencies_s) * 1000,
        "p99_ms": quantile(run.latencies_s, 0.99) * 1000,
        "req_s": calls / run.elapsed_s,
        "calls": calls,
        "errors": run.errors,
        "proxy_cpu_ms": (proxy1 - proxy0) * 1000 / calls if target.is_proxy else None,
        "worker_cpu_ms": (worker1 - worker0) * 1000 / calls,
        "lines": _settled_lines(target.capture_dir, lines0 + calls) - lines0,
    }


def _wrk(
    target: Target, worker: ServiceProcess, wrk: str, script: Path, seconds: float
) -> dict[str, Any]:
    lines0, (proxy0, worker0) = _settled_lines(target.capture_dir, 0), _cpu(target, worker)
    busy0 = machine_busy_s()
    run = run_wrk(wrk, target.service.url, script, seconds=seconds, connections=CONCURRENCY)
    busy1 = machine_busy_s()
    proxy1, worker1 = _cpu(target, worker)
    result, calls = run.result, max(1, run.result.requests)
    ours = (proxy1 - proxy0) + (worker1 - worker0) + run.wrk_cpu_s
    return {
        "req_s": result.req_s,
        "calls": result.requests,
        "p50_ms": result.latency_s.get("50%", float("nan")) * 1000,
        "p99_ms": result.latency_s.get("99%", float("nan")) * 1000,
        "non_2xx": result.non_2xx,
        "socket_errors": sum(result.socket_errors.values()),
        "statuses": {str(k): v for k, v in sorted(result.statuses.items())},
        "proxy_cpu_ms": (proxy1 - proxy0) * 1000 / calls if target.is_proxy else None,
        "worker_cpu_ms": (worker1 - worker0) * 1000 / calls,
        "wrk_cores": run.wrk_cpu_s / run.elapsed_s,
        "other_load_cores": max(0.0, (busy1 - busy0 - ours) / run.elapsed_s),
        "lines": _settled_lines(target.capture_dir, lines0 + result.requests) - lines0,
    }


def measure(plan: Plan) -> dict[str, Any]:
    """Start everything, run the interleaved rounds, return the raw records and facts."""
    wrk = ensure_wrk()
    facts: dict[str, Any] = {
        "code": _code_identity(),
        "loadavg_start": os.getloadavg(),
        "cores": os.cpu_count(),
        "plan": plan.__dict__,
    }
    gym_env = None
    if plan.gym:
        try:
            gym_env = proxy_gym.ensure_gym()
            facts["gym"] = {
                "version": gym_env.version,
                "interpreter": gym_env.interpreter,
                "notes": gym_env.notes,
                "server": proxy_gym.GYM_SERVER,
            }
        except Exception as exc:
            facts["gym_error"] = f"{type(exc).__name__}: {exc}"
    bodies = {
        m: orjson.dumps(request_body("chat", stream=m == "stream")) for m in ("json", "stream")
    }
    records: list[dict[str, Any]] = []
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ngc-bench-proxy-")))
        worker = stack.enter_context(run_worker(seed=1, ttft_ms=0, ms_per_token=0))
        off = stack.enter_context(run_capture_server(worker.url, None))
        on = stack.enter_context(run_capture_server(worker.url, tmp / "ngcapture"))
        targets = [
            Target("direct", worker, False, None, False),
            Target("ngcapture off", off, True, None, True),
            Target("ngcapture on", on, True, tmp / "ngcapture", True),
        ]
        if gym_env is not None:
            try:
                gym = stack.enter_context(
                    proxy_gym.run_gym_server(gym_env, worker.url, tmp / "gym")
                )
                targets.append(Target("NeMo Gym", gym, True, tmp / "gym", True))
            except Exception as exc:
                facts["gym_error"] = f"{type(exc).__name__}: {exc}"
        if "gym_error" in facts:
            print(f"proxy: NeMo Gym not measured: {facts['gym_error']}", flush=True)
        scripts = {}
        for prefixed in (False, True):
            scripts[prefixed] = tmp / f"post-{prefixed}.lua"
            scripts[prefixed].write_text(wrk_script(bodies["json"], prefixed=prefixed))
        for target in targets:  # warm every proxy's upstream pool at c=64 (not measured)
            run_wrk(wrk, target.service.url, scripts[target.prefixed], seconds=1, connections=64)
        for index in range(plan.rounds):
            shift = index % len(targets)
            for target in targets[shift:] + targets[:shift]:
                print(f"proxy: round {index + 1}/{plan.rounds}: {target.name}", flush=True)
                records.append(
                    {
                        "round": index + 1,
                        "config": target.name,
                        "json": _serial(target, worker, bodies["json"], plan.requests),
                        "stream": _serial(target, worker, bodies["stream"], plan.requests),
                        "c64": _wrk(target, worker, wrk, scripts[target.prefixed], plan.seconds),
                    }
                )
        facts["configs"] = [t.name for t in targets]
    facts["loadavg_end"] = os.getloadavg()
    return {"facts": facts, "records": records}


def run(*, quick: bool = False, plan: Plan | None = None, out: Path = OUT) -> list[dict[str, Any]]:
    plan = plan or (
        Plan(rounds=1, seconds=3, requests=100, gym=True)
        if quick
        else Plan(rounds=3, seconds=10, requests=400, gym=True)
    )
    data = measure(plan)
    summary = summarise(data)
    text = markdown(data, summary)
    out.mkdir(parents=True, exist_ok=True)
    (out / "proxy.json").write_text(json.dumps({**data, "summary": summary}, indent=2))
    (out / "proxy.md").write_text(text)
    print("\n" + text, flush=True)
    return rows(data, summary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.proxy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 3 s wrk, 100 calls")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--seconds", type=float, help="wrk duration per round (default 10)")
    parser.add_argument("--requests", type=int, help="c=1 calls per round and mode (400)")
    parser.add_argument("--no-gym", action="store_true", help="skip NeMo Gym (quoted figures)")
    parser.add_argument("--profile", action="store_true", help="py-spy the proxy instead")
    parser.add_argument("--profile-capture-off", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.profile:
        profile(seconds=args.seconds or 10.0, capture=not args.profile_capture_off, out=args.out)
        return 0
    base = Plan(1, 3, 100, True) if args.quick else Plan(3, 10, 400, True)
    plan = Plan(
        rounds=args.rounds or base.rounds,
        seconds=args.seconds or base.seconds,
        requests=args.requests or base.requests,
        gym=not args.no_gym,
    )
    run(plan=plan, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
