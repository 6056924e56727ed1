"""Measuring tools of the proxy benchmark: wrk, a keep-alive c=1 client, CPU from /proc, py-spy.

Parsers are plain functions of text (unit-tested in ``tests/test_benchmark_proxy_parsers.py``);
the rest runs processes and reads ``/proc``. Linux only.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
JSON_HEADERS = {"content-type": "application/json"}

# ---------------------------------------------------------------------------------------------
# /proc


def parse_proc_stat(text: str) -> tuple[int, int]:
    """``(ppid, utime + stime in clock ticks)`` from one ``/proc/<pid>/stat`` line.

    The command name (field 2) may hold spaces and parentheses, so fields are counted from the
    last ``)``. utime and stime (fields 14 and 15) cover all threads of the process.
    """
    rest = text[text.rindex(")") + 2 :].split()
    return int(rest[1]), int(rest[11]) + int(rest[12])


def parse_cpu_line(text: str) -> tuple[int, int]:
    """``(busy, total)`` clock ticks from the ``cpu`` line of ``/proc/stat`` (idle+iowait idle)."""
    values = [int(v) for v in text.split()[1:]]
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
    return total - values[3] - values[4], total


def _stat(pid: int) -> tuple[int, int] | None:
    try:
        return parse_proc_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None  # the process went away between listing and reading


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system, all threads) of ``root`` and its live descendants."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents[int(entry.name)], ticks[int(entry.name)] = stat
    members, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in members:
                members.add(pid)
                frontier.append(pid)
    return sum(ticks.get(pid, 0) for pid in members) / CLK_TCK


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores)."""
    busy, _ = parse_cpu_line(Path("/proc/stat").read_text().splitlines()[0])
    return busy / CLK_TCK


# ---------------------------------------------------------------------------------------------
# wrk

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _seconds(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not match:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(match[1]) * _UNITS[match[2]]


@dataclass
class WrkResult:
    requests: int  # responses completed within the run
    duration_s: float
    req_s: float
    non_2xx: int = 0
    socket_errors: dict[str, int] = field(default_factory=dict)
    latency_s: dict[str, float] = field(default_factory=dict)  # "50%" -> seconds (--latency)
    statuses: dict[int, int] = field(default_factory=dict)  # from the script's done()


def parse_wrk(text: str) -> WrkResult:
    """The numbers of a ``wrk --latency`` report."""
    done = re.search(r"^\s*(\d+) requests in ([\d.]+\w+),", text, re.M)
    rate = re.search(r"^Requests/sec:\s+([\d.]+)", text, re.M)
    if not done or not rate:
        raise ValueError(f"not a wrk report:\n{text}")
    result = WrkResult(int(done[1]), _seconds(done[2]), float(rate[1]))
    if non_2xx := re.search(r"Non-2xx or 3xx responses: (\d+)", text):
        result.non_2xx = int(non_2xx[1])
    if errors := re.search(r"Socket errors: (.*)", text):
        result.socket_errors = {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", errors[1])}
    for pct, value in re.findall(r"^\s+(\d+%)\s+([\d.]+(?:us|ms|s|m))\s*$", text, re.M):
        result.latency_s[pct] = _seconds(value)
    for status, count in re.findall(r"^status (\d+): (\d+)$", text, re.M):
        result.statuses[int(status)] = result.statuses.get(int(status), 0) + int(count)
    return result


def ensure_wrk() -> str:
    """The ``wrk`` binary, installed from Debian's packages when missing and we are root."""
    if path := shutil.which("wrk"):
        return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("proxy: installing wrk from Debian's packages (apt-get)", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, capture_output=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "wrk"],
            check=False,
            env=env,
            capture_output=True,
        )
    if path := shutil.which("wrk"):
        return path
    raise RuntimeError(
        "wrk is not installed: run `make bench` (installs it) or apt-get install wrk"
    )


WRK_LUA = """\
-- POST a chat body; requests cycle round-robin over {ids} rollout ids (bench-0 .. bench-{last}).
local body = [==[{body}]==]
local prefixed = {prefixed}
local counter = 0
local headers = {{["Content-Type"] = "application/json"}}
local threads = {{}}
function setup(thread)
  table.insert(threads, thread)
end
function init(args)
  statuses = {{}}
end
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
function done(summary, latency, requests)
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses")) do
      io.write(string.format("status %d: %d\\n", status, count))
    end
  end
end
function request()
  counter = counter + 1
  local path = "/v1/chat/completions"
  if prefixed then
    path = "/ng-rollout/bench-" .. (counter % {ids}) .. path
  end
  return wrk.format("POST", path, headers, body)
end
"""


def wrk_script(body: bytes, *, prefixed: bool, ids: int = 64) -> str:
    return WRK_LUA.format(body=body.decode(), prefixed=str(prefixed).lower(), ids=ids, last=ids - 1)


@dataclass
class WrkRun:
    result: WrkResult
    wrk_cpu_s: float  # the load generator's own CPU (from wait4)
    elapsed_s: float


def run_wrk(
    wrk: str, url: str, script: Path, *, seconds: float, connections: int, threads: int = 1
) -> WrkRun:
    args = [
        wrk,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "30s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    started = time.perf_counter()
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
        assert process.stdout is not None
        output = process.stdout.read().decode(errors="replace")
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"wrk exited with {process.returncode}:\n{output}")
    result = parse_wrk(output)
    if result.requests and not result.statuses:  # the script's done() never ran: it failed
        raise RuntimeError(f"wrk's Lua script failed:\n{output}")
    return WrkRun(result, usage.ru_utime + usage.ru_stime, time.perf_counter() - started)


# ---------------------------------------------------------------------------------------------
# one client, keep-alive


@dataclass
class SerialRun:
    latencies_s: list[float]
    errors: int
    elapsed_s: float


def serial_calls(
    port: int, path_for: Callable[[int], str], body: bytes, *, requests: int, warm: int = 20
) -> SerialRun:
    """``requests`` calls one after another on one keep-alive connection (TCP_NODELAY).

    Latency is the time to the full body (a stream read to its end).
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.connect()
    assert conn.sock is not None
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    latencies: list[float] = []
    errors = 0

    def call(index: int) -> int:
        conn.request("POST", path_for(index), body=body, headers=JSON_HEADERS)
        response = conn.getresponse()
        response.read()
        return response.status

    try:
        for index in range(warm):
            call(index)
        started = time.perf_counter()
        for index in range(requests):
            start = time.perf_counter()
            status = call(index)
            latencies.append(time.perf_counter() - start)
            errors += status != 200
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    return SerialRun(latencies, errors, elapsed)


def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def count_capture_lines(directory: Path | None) -> int:
    """Lines in every ``*.capture.jsonl`` of a capture directory (0 without one)."""
    if directory is None or not directory.is_dir():
        return 0
    total = 0
    for path in directory.glob("*.capture.jsonl"):
        with path.open("rb") as handle:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    return total


# ---------------------------------------------------------------------------------------------
# py-spy

_PROCESS = re.compile(r'^process \d+:".*"$')
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def parse_pyspy_raw(text: str) -> list[tuple[list[tuple[str, str]], int]]:
    """``py-spy record --format raw`` (collapsed stacks, root first) as ``[(frames, count)]``.

    Each frame is ``(function, file)``; line numbers are dropped so a function is one key, and
    the ``process <pid>:"<command>"`` root that ``--subprocesses`` adds is left out.
    """
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = []
        for frame in stack.split(";"):
            if _PROCESS.match(frame):
                continue  # --subprocesses puts the process (pid and command line) at the root
            match = _FRAME.match(frame)
            frames.append((match["func"], match["file"]) if match else (frame, ""))
        stacks.append((frames, int(count)))
    return stacks


def module_group(path: str) -> str:
    """Which package a frame's file belongs to: ``httpcore``, ``asyncio``, ``capture_core/x.py``."""
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "capture_core/" in path:
        return "capture_core/" + path.split("capture_core/", 1)[1]
    stdlib = re.search(r"/lib/python3\.\d+/(.*)", path)
    if stdlib:
        return stdlib[1].split("/", 1)[0].removesuffix(".py")
    return path or "?"


@dataclass
class Profile:
    samples: int
    self_counts: Counter[str]
    inclusive_counts: Counter[str]
    group_inclusive: Counter[str]
    group_self: Counter[str]


def summarise_profile(stacks: list[tuple[list[tuple[str, str]], int]]) -> Profile:
    profile = Profile(0, Counter(), Counter(), Counter(), Counter())
    for frames, count in stacks:
        profile.samples += count
        if not frames:
            continue
        func, path = frames[-1]
        profile.self_counts[f"{func} ({module_group(path)})"] += count
        profile.group_self[module_group(path)] += count
        for key in {f"{f} ({module_group(p)})" for f, p in frames}:
            profile.inclusive_counts[key] += count
        for group in {module_group(p) for _, p in frames}:
            profile.group_inclusive[group] += count
    return profile


def profile_markdown(profile: Profile, *, title: str, top: int = 25) -> str:
    def table(counter: Counter[str], label: str, limit: int = top) -> list[str]:
        rows = [f"| {label} | samples | % |", "|---|---:|---:|"]
        for key, count in counter.most_common(limit):
            rows.append(f"| `{key}` | {count} | {100 * count / max(1, profile.samples):.1f} |")
        return rows

    lines = [
        f"## {title}",
        "",
        f"{profile.samples} samples (idle threads excluded).",
        "",
        "### Packages (inclusive: a sample counts once for each package on its stack)",
        "",
        *table(profile.group_inclusive, "package"),
        "",
        "### Packages (self)",
        "",
        *table(profile.group_self, "package"),
        "",
        "### Functions (self)",
        "",
        *table(profile.self_counts, "function"),
        "",
        "### Functions (inclusive)",
        "",
        *table(profile.inclusive_counts, "function", top * 2),
        "",
    ]
    return "\n".join(lines)


def ensure_pyspy() -> str:
    """py-spy from the project's venv, installed there on first use (benchmarks only)."""
    candidate = Path(sys.executable).parent / "py-spy"
    if not candidate.exists():
        print("proxy: installing py-spy into the project venv (profiling only)", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "py-spy"],
            check=True,
            capture_output=True,
        )
    return str(candidate)
