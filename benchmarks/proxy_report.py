"""The proxy benchmark's report: medians per configuration, the goals of issue 14, markdown, rows.

Pure functions of the raw records and facts ``proxy.measure`` returns.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.proxy_plan import ROLLOUT_IDS

QUOTED_GYM = {"req_s": 330.0, "cpu_ms": 3.2}  # issue 14's measurement, used if Gym can't run
GOALS = {"p50_ms": 0.5, "p99_ms": 2.0, "vs_gym_req_s": 1.2, "vs_gym_cpu": 0.8, "on_vs_off": 0.85}


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
