"""Spread a cold index build over every core with worker *processes* started by command.

Workers are plain ``python -c`` subprocesses (``_WORKER``), not ``multiprocessing``:
that works the same from scripts without a ``__main__`` guard, notebooks and REPLs, and never
forks a process that holds Polars' thread pool. The parent parses a share itself while the
workers start. Each worker reads its tasks from a JSON file in its scratch directory, reports
parsed bytes on stdout and leaves its rows there as Arrow IPC files.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Final

import orjson
import polars as pl

import capture_core
from ngcapture_viz.exceptions import CaptureIndexError
from ngcapture_viz.load._scan import FileState, FileTask, ScanResult, scan_files

__all__ = ["scan_parallel"]

#: What a worker's start-up (interpreter, imports, handing rows back) is worth in parsed bytes:
#: the parent takes that much more. Measured on 2 cores: ~0.6 s, at ~170 MB/s per process.
STARTUP_BYTES: Final = 96 * 1024 * 1024
_TABLES: Final = ("calls", "tool_calls", "damaged")
_TASKS: Final = "tasks.json"
# A worker process: ``python -c _WORKER OUT PACKAGE_DIR ROOT...``. It runs ``worker_main``
# without the package's ``__init__`` (a worker only parses; the figures, reports and widgets the
# package re-exports import plotly and ipywidgets, ~0.25 s of a ~0.55 s start the parent waits
# for), from the very copies of ``ngcapture_viz`` and ``capture_core`` the parent imported.
_WORKER: Final = """
import sys, types
for name, path in (("ngcapture_viz", sys.argv[2]), ("ngcapture_viz.load", sys.argv[2] + "/load")):
    package = types.ModuleType(name)
    package.__path__ = [path]
    sys.modules[name] = package
sys.path[:0] = [root for root in sys.argv[3:] if root not in sys.path]
from pathlib import Path
from ngcapture_viz.load._pool import worker_main
worker_main(Path(sys.argv[1]))
"""


def scan_parallel(
    tasks: list[FileTask],
    sizes: list[int],
    *,
    workers: int,
    on_progress: Callable[[int], object],
) -> ScanResult:
    """Parse ``tasks`` with ``workers`` processes (the caller's included)."""
    shares = _split(tasks, sizes, workers)
    with tempfile.TemporaryDirectory(prefix="ngcapture-index-") as scratch:
        procs: list[subprocess.Popen[bytes]] = []
        readers: list[threading.Thread] = []
        try:
            for n, share in enumerate(shares[1:]):
                procs.append(_start(share, Path(scratch) / str(n)))
                readers.append(
                    threading.Thread(target=_relay, args=(procs[-1], on_progress), daemon=True)
                )
                readers[-1].start()
            parts = [scan_files(shares[0])]
            on_progress(parts[0].bytes_parsed)
            for n, (proc, reader) in enumerate(zip(procs, readers, strict=True)):
                reader.join()
                stderr = proc.stderr.read() if proc.stderr is not None else b""
                code = proc.wait()
                if code != 0:
                    tail = stderr.decode(errors="replace").strip().splitlines()[-5:]
                    raise CaptureIndexError(
                        f"index worker {n + 1} failed with exit code {code}: " + " | ".join(tail)
                    )
                parts.append(_collect(Path(scratch) / str(n)))
        finally:
            _reap(procs, readers)  # also when the parent's share or a worker failed
    return ScanResult(
        pl.concat([p.calls for p in parts], how="vertical"),
        pl.concat([p.tool_calls for p in parts], how="vertical"),
        pl.concat([p.damaged for p in parts], how="vertical"),
        states=[s for p in parts for s in p.states],
        unreadable=[u for p in parts for u in p.unreadable],
        bytes_parsed=sum(p.bytes_parsed for p in parts),
        processes=1 + sum(1 for share in shares[1:] if share),
    )


def _reap(procs: list[subprocess.Popen[bytes]], readers: list[threading.Thread]) -> None:
    """Kill what still runs, let the progress readers see the end, wait, close the pipes."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for reader in readers:
        reader.join()
    for proc in procs:
        with proc:  # waits and closes the pipes
            pass


def _split(tasks: list[FileTask], sizes: list[int], workers: int) -> list[list[FileTask]]:
    """The parent's share first (bigger by the workers' start-up), then one per worker."""
    total = sum(sizes)
    parent = min(total, (total + (workers - 1) * STARTUP_BYTES) // workers)
    rest = max(1, (total - parent) // max(1, workers - 1))
    shares: list[list[FileTask]] = [[]]
    budget, weight = parent, 0
    for task, size in zip(tasks, sizes, strict=True):
        if weight >= budget and len(shares) < workers:
            shares.append([])
            budget, weight = rest, 0
        shares[-1].append(task)
        weight += size
    return shares


def _start(share: list[FileTask], out: Path) -> subprocess.Popen[bytes]:
    out.mkdir(parents=True)
    # A file, not stdin: a task list larger than the pipe's buffer would block the parent
    # until the worker has finished importing, and the parent's own share would wait too.
    (out / _TASKS).write_bytes(orjson.dumps([asdict(task) for task in share]))
    package = Path(__file__).parent.parent  # ngcapture_viz/, not load/
    places = [package, *(Path(str(p)) for p in capture_core.__path__)]
    roots = dict.fromkeys(str(place.parent) for place in places)
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(out), str(package), *roots],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "POLARS_MAX_THREADS": "1"},
    )


def _relay(proc: subprocess.Popen[bytes], on_progress: Callable[[int], object]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(b"P "):
            on_progress(int(line[2:]))


def _collect(out: Path) -> ScanResult:
    meta = orjson.loads((out / "meta.json").read_bytes())
    frames = {name: pl.read_ipc(out / f"{name}.arrow") for name in _TABLES}
    return ScanResult(
        frames["calls"],
        frames["tool_calls"],
        frames["damaged"],
        states=[FileState(**state) for state in meta["states"]],
        unreadable=[tuple(u) for u in meta["unreadable"]],
        bytes_parsed=meta["bytes_parsed"],
    )


def worker_main(out: Path) -> None:
    """The body of one worker process (``_WORKER``): parse the tasks in ``out``, leave the rows."""
    tasks = [FileTask(**task) for task in orjson.loads((out / _TASKS).read_bytes())]
    # Report progress in slices so the parent's bar moves.
    step = max(1, len(tasks) // 20)
    parts = []
    for start in range(0, len(tasks), step):
        part = scan_files(tasks[start : start + step])
        parts.append(part)
        sys.stdout.write(f"P {part.bytes_parsed}\n")
        sys.stdout.flush()
    for name in _TABLES:
        frame = pl.concat([getattr(p, name) for p in parts], how="vertical")
        frame.write_ipc(out / f"{name}.arrow")
    meta = {
        "states": [asdict(s) for p in parts for s in p.states],
        "unreadable": [list(u) for p in parts for u in p.unreadable],
        "bytes_parsed": sum(p.bytes_parsed for p in parts),
    }
    (out / "meta.json").write_bytes(orjson.dumps(meta))
