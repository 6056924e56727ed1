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
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

import capture_core
from benchmarks import proxy_gym
from benchmarks.proxy_measure import (
    count_capture_lines,
    ensure_pyspy,
    ensure_wrk,
    machine_busy_s,
    parse_pyspy_raw,
    profile_markdown,
    quantile,
    run_wrk,
    serial_calls,
    summarise_profile,
    tree_cpu_s,
    wrk_script,
)
from capture_core.testing import request_body
from capture_core.testing.processes import ServiceProcess, run_capture_server, run_worker

OUT = Path(os.environ.get("NGCAPTURE_BENCH_OUT", "results/bench"))
ROLLOUT_IDS = 64
CONCURRENCY = 64
QUOTED_GYM = {"req_s": 330.0, "cpu_ms": 3.2}  # issue 14's measurement, used if Gym can't run
GOALS = {"p50_ms": 0.5, "p99_ms": 2.0, "vs_gym_req_s": 1.2, "vs_gym_cpu": 0.8, "on_vs_off": 0.85}


@dataclass
class Target:
    name: str
    service: ServiceProcess
    prefixed: bool  # /ng-rollout/<id> in front of the path
    capture_dir: Path | None
    is_proxy: bool  # False for the worker itself

    def path_for(self, index: int) -> str:
        if self.prefixed:
            return f"/ng-rollout/bench-{index % ROLLOUT_IDS}/v1/chat/completions"
        return "/v1/chat/completions"


@dataclass
class Plan:
    rounds: int
    seconds: float
    requests: int
    gym: bool


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


def _code_identity() -> str:
    """Which capture_core the ngcapture processes run: its tree, commit and whether it is dirty."""
    root = Path(capture_core.__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "capture_core"],
            check=False,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{root} (not a git checkout)"
    return f"{root} at {head}" + (" with uncommitted changes in capture_core/" if dirty else "")


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


# ---------------------------------------------------------------------------------------------
# summary


def _stat(records: list[dict[str, Any]], config: str, mode: str, key: str) -> list[float]:
    values = [r[mode].get(key) for r in records if r["config"] == config]
    return [v for v in values if v is not None]


def summarise(data: dict[str, Any]) -> dict[str, Any]:
    """Medians and ranges per configuration; goals as ratios with met / not met."""
    records, configs = data["records"], data["facts"]["configs"]
    keys = ["p50_ms", "p99_ms", "req_s", "proxy_cpu_ms", "worker_cpu_ms", "lines", "calls"]
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for config in configs:
        table[config] = {}
        for mode in ("json", "stream", "c64"):
            cell = {}
            for key in [*keys, "other_load_cores", "non_2xx", "socket_errors", "errors"]:
                values = _stat(records, config, mode, key)
                if values:
                    cell[key] = statistics.median(values)
                    cell[key + "_range"] = (min(values), max(values))
                    cell[key + "_sum"] = sum(values)
            table[config][mode] = cell
    return {"table": table, "goals": _goals(table, data["facts"])}


def _goal(label: str, value: float, limit: float, *, at_most: bool, unit: str) -> dict[str, Any]:
    met = value <= limit if at_most else value >= limit
    sign = "≤" if at_most else "≥"
    return {
        "goal": label,
        "value": value,
        "limit": limit,
        "met": met,
        "text": f"{label}: {value:.2f}{unit} (goal {sign} {limit:g}{unit}) — "
        f"{'met' if met else 'NOT met'}",
    }


def _goals(table: dict[str, Any], facts: dict[str, Any]) -> list[dict[str, Any]]:
    goals = []
    on, off = table.get("ngcapture on", {}), table.get("ngcapture off", {})
    for mode in ("json", "stream"):
        goals.append(
            _goal(
                f"c=1 {mode}: capture adds p50",
                on[mode]["p50_ms"] - off[mode]["p50_ms"],
                GOALS["p50_ms"],
                at_most=True,
                unit=" ms",
            )
        )
        goals.append(
            _goal(
                f"c=1 {mode}: capture adds p99",
                on[mode]["p99_ms"] - off[mode]["p99_ms"],
                GOALS["p99_ms"],
                at_most=True,
                unit=" ms",
            )
        )
    gym = table.get("NeMo Gym", {}).get("c64")
    gym_req_s = gym["req_s"] if gym else QUOTED_GYM["req_s"]
    gym_cpu = gym["proxy_cpu_ms"] if gym else QUOTED_GYM["cpu_ms"]
    versus = "Gym measured in this run" if gym else "Gym's figures quoted in issue 14"
    goals.append(
        _goal(
            f"c=64: ngcapture on req/s ÷ {versus}",
            on["c64"]["req_s"] / gym_req_s,
            GOALS["vs_gym_req_s"],
            at_most=False,
            unit="×",
        )
    )
    goals.append(
        _goal(
            f"c=64: ngcapture on server CPU per call ÷ {versus}",
            on["c64"]["proxy_cpu_ms"] / gym_cpu,
            GOALS["vs_gym_cpu"],
            at_most=True,
            unit="×",
        )
    )
    goals.append(
        _goal(
            "c=64: capture on req/s ÷ capture off",
            on["c64"]["req_s"] / off["c64"]["req_s"],
            GOALS["on_vs_off"],
            at_most=False,
            unit="×",
        )
    )
    return goals


def _fmt(cell: dict[str, Any], key: str, digits: int = 2) -> str:
    if key not in cell:
        return "–"
    low, high = cell[key + "_range"]
    value = f"{cell[key]:,.{digits}f}"
    return value if low == high else f"{value} ({low:,.{digits}f}–{high:,.{digits}f})"


def markdown(data: dict[str, Any], summary: dict[str, Any]) -> str:
    facts, table = data["facts"], summary["table"]
    plan = facts["plan"]
    lines = [
        f"Medians of {plan['rounds']} interleaved round(s), (min–max) over rounds. c=1: one "
        f"keep-alive client, {plan['requests']} calls per round and mode. c=64: wrk -t1 -c64, "
        f"{plan['seconds']:g} s per round, non-streamed chat, {ROLLOUT_IDS} rollout ids "
        "round-robin. CPU: server process tree, utime+stime from /proc, per completed call.",
        "",
        "| configuration | c=1 JSON p50 ms | c=1 JSON p99 ms | c=1 stream p50 ms "
        "| c=1 stream p99 ms | c=64 req/s | c=64 server CPU ms/call | c=64 worker CPU ms/call "
        "| c=1 JSON server CPU ms/call | capture lines / calls (c=64) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, cells in table.items():
        j, s, c = cells["json"], cells["stream"], cells["c64"]
        captured = (
            f"{c['lines_sum']:,.0f} / {c['calls_sum']:,.0f}"
            if config in ("ngcapture on", "NeMo Gym")
            else "–"
        )
        lines.append(
            f"| {config} | {_fmt(j, 'p50_ms')} | {_fmt(j, 'p99_ms')} "
            f"| {_fmt(s, 'p50_ms')} | {_fmt(s, 'p99_ms')} | {_fmt(c, 'req_s', 0)} "
            f"| {_fmt(c, 'proxy_cpu_ms')} | {_fmt(c, 'worker_cpu_ms')} "
            f"| {_fmt(j, 'proxy_cpu_ms')} | {captured} |"
        )
    lines += ["", "Goals (issue 14):", ""] + [f"- {g['text']}" for g in summary["goals"]]
    other = [r["c64"]["other_load_cores"] for r in data["records"]]
    lines += [
        "",
        "Facts and noise:",
        "",
        f"- ngcapture code measured: {facts['code']}",
        f"- machine: {facts['cores']} cores; load average at start "
        f"{facts['loadavg_start'][0]:.2f}, at end {facts['loadavg_end'][0]:.2f}; other "
        f"processes' CPU during the wrk runs: median {statistics.median(other):.2f} cores "
        f"(max {max(other):.2f})",
        f"- {_noise_verdict(statistics.median(other), facts['cores'] or 1)}",
        *_health_lines(data["records"], facts["configs"]),
    ]
    if "gym" in facts:
        gym = facts["gym"]
        lines.append(
            f"- NeMo Gym {gym['version']} ({gym['server']}, capture on), Python "
            f"{gym['interpreter']}" + (f"; {gym['notes']}" if gym["notes"] else "")
        )
    if "gym_error" in facts:
        lines.append(f"- NeMo Gym could not be measured: {facts['gym_error']}")
    return "\n".join(lines) + "\n"


def _noise_verdict(other_cores: float, cores: int) -> str:
    share = other_cores / cores
    if share < 0.1:
        return "noise: quiet machine (other processes < 10 % of the CPU during wrk runs)"
    if share < 0.3:
        return f"noise: other processes took {share:.0%} of the CPU: compare ratios, not absolutes"
    return (
        f"noise: VERY NOISY, other processes took {share:.0%} of the CPU during the wrk "
        "runs: req/s and c=1 latencies are distorted; CPU per call is the robust figure"
    )


def _health_lines(records: list[dict[str, Any]], configs: list[str]) -> list[str]:
    """Per configuration: c=64 req/s of each round, failures, and capture lines vs calls."""
    out = []
    for config in configs:
        mine = [r for r in records if r["config"] == config]
        per_round = ", ".join(f"{r['c64']['req_s']:,.0f}" for r in mine)
        statuses: dict[str, int] = {}
        for r in mine:
            for status, count in r["c64"].get("statuses", {}).items():
                statuses[status] = statuses.get(status, 0) + count
        serial_errors = sum(r[m]["errors"] for r in mine for m in ("json", "stream"))
        socket_errors = sum(r["c64"]["socket_errors"] for r in mine)
        text = (
            f"- {config}: c=64 req/s by round {per_round}; c=64 statuses {statuses}, "
            f"socket errors {socket_errors}; c=1 non-200 {serial_errors}"
        )
        if config in ("ngcapture on", "NeMo Gym"):
            serial_lines = sum(r[m]["lines"] for r in mine for m in ("json", "stream"))
            serial_calls_ = sum(r[m]["calls"] for r in mine for m in ("json", "stream"))
            wrk_lines = sum(r["c64"]["lines"] for r in mine)
            wrk_calls = sum(r["c64"]["calls"] for r in mine)
            text += (
                f"; capture lines landed: c=1 {serial_lines:,} for {serial_calls_:,} calls, "
                f"c=64 {wrk_lines:,} for {wrk_calls:,} completed calls (calls wrk abandoned "
                "at its deadline may land too)"
            )
            if serial_lines < serial_calls_ or wrk_lines < wrk_calls:
                lost = max(0, serial_calls_ - serial_lines)
                text += f" — LINES MISSING ({lost:,} answered c=1 calls have no line)"
        failed = sum(n for status, n in statuses.items() if status != "200") + socket_errors
        if failed > 0.01 * sum(r["c64"]["calls"] for r in mine) or serial_errors:
            text += " — FAILED CALLS: these numbers do not measure successful calls"
        out.append(text)
    return out


def rows(data: dict[str, Any], summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for ``python -m benchmarks``' table: c=1 rows relative to capture off, c=64 to Gym."""
    table, plan = summary["table"], data["facts"]["plan"]
    gym = table.get("NeMo Gym", {}).get("c64", {}).get("req_s", QUOTED_GYM["req_s"])
    out = []
    for config, cells in table.items():
        for mode, label in (("json", "c=1 chat json"), ("stream", "c=1 chat stream")):
            cell, base = cells[mode], table["ngcapture off"][mode]["p50_ms"]
            out.append(
                {
                    "benchmark": f"proxy {label}",
                    "variant": config,
                    "n": plan["requests"] * plan["rounds"],
                    "median_s": cell["p50_ms"] / 1000,
                    "per_s": cell["req_s"],
                    "unit": "req/s",
                    "ratio_vs_floor": cell["p50_ms"] / base,
                    "detail": f"p50 {_fmt(cell, 'p50_ms')} ms, p99 {_fmt(cell, 'p99_ms')} ms, "
                    f"server CPU {_fmt(cell, 'proxy_cpu_ms')} ms/call; × = p50 ÷ "
                    "ngcapture off",
                }
            )
        cell = cells["c64"]
        out.append(
            {
                "benchmark": "proxy c=64 wrk chat json",
                "variant": config,
                "n": int(cell["calls_sum"]),
                "median_s": cell["p50_ms"] / 1000,
                "per_s": cell["req_s"],
                "unit": "req/s",
                "ratio_vs_floor": cell["req_s"] / gym,
                "detail": f"req/s {_fmt(cell, 'req_s', 0)}, server CPU "
                f"{_fmt(cell, 'proxy_cpu_ms')} ms/call, worker "
                f"{_fmt(cell, 'worker_cpu_ms')} ms/call; × = req/s ÷ Gym's",
            }
        )
    return out


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


# ---------------------------------------------------------------------------------------------
# py-spy


def _pyspy(pyspy: str, pid: int, seconds: float, output: Path, *, gil: bool) -> None:
    args = [
        pyspy,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(round(seconds)),
        "--rate",
        "100",
        "--format",
        "raw",
        "--full-filenames",
        "--nonblocking",
        "--subprocesses",
        "--output",
        str(output),
    ]
    subprocess.run([*args, "--gil"] if gil else args, check=True, capture_output=True)


def profile(*, seconds: float = 10.0, capture: bool = True, out: Path = OUT) -> Path:
    """py-spy on the ngcapture proxy while wrk drives it at c=64; writes a top-functions summary.

    Two recordings of ``seconds`` each, one after the other under the same wrk run: every
    non-idle sample (a thread waiting in fsync or flock counts), then only samples holding the
    GIL (where the Python CPU goes). Raw stacks: ``proxy-profile-{all,gil}.txt``.
    """
    wrk, pyspy = ensure_wrk(), ensure_pyspy()
    out.mkdir(parents=True, exist_ok=True)
    raws = {"all": out / "proxy-profile-all.txt", "gil": out / "proxy-profile-gil.txt"}
    summary = out / "proxy-profile.md"
    body = orjson.dumps(request_body("chat"))
    with (
        tempfile.TemporaryDirectory(prefix="ngc-bench-profile-") as tmp,
        run_worker(seed=1, ttft_ms=0, ms_per_token=0) as worker,
        run_capture_server(worker.url, Path(tmp) / "calls" if capture else None) as server,
        ThreadPoolExecutor(1) as pool,
    ):
        script = Path(tmp) / "post.lua"
        script.write_text(wrk_script(body, prefixed=True))
        run_wrk(wrk, server.url, script, seconds=2, connections=CONCURRENCY)  # warm
        load = pool.submit(
            run_wrk, wrk, server.url, script, seconds=2 * seconds + 3, connections=CONCURRENCY
        )
        time.sleep(1.0)
        for name, raw in raws.items():
            _pyspy(pyspy, server.process.pid, seconds, raw, gil=name == "gil")
        result = load.result().result
    title = (
        f"py-spy: ngcapture proxy, capture {'on' if capture else 'off'}, wrk -c64, "
        f"{result.req_s:,.0f} req/s while sampled; code {_code_identity()}"
    )
    parts = [f"# {title}", ""]
    for name, heading in (("all", "All non-idle samples"), ("gil", "Samples holding the GIL")):
        stacks = parse_pyspy_raw(raws[name].read_text())
        parts.append(profile_markdown(summarise_profile(stacks), title=f"{heading}, {seconds:g} s"))
    summary.write_text("\n".join(parts))
    print(summary.read_text())
    return summary


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
