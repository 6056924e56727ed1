"""The index build of a 1 GB store: one local process against Ray with 1 and 2 worker processes.

Every variant runs in a fresh Python process. Ray runs as a one-machine cluster on 127.0.0.1
(``num_cpus`` = the worker processes) started in that process; its start-up is reported apart
and not counted in the build. Each variant builds the index cold (no index) three times; the
first Ray build also starts the worker processes (imports), so it is reported apart too.

On a 2-core machine shared with the driver, two Ray workers cannot beat one local process by
much: the ratio measures Ray's overhead (scheduling, parts written as Parquet and read back,
worker start-up), not the speed-up a cluster of real nodes gives.

Run: ``python -m benchmarks.ray_index`` (store under ``results/bench/load/``, shared with the
load benchmark).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.load_stores import ROOT, build_store

SIZE_MB = 1000
_SNIPPET = """
import json, shutil, sys, tempfile, time
from pathlib import Path
STORE, ENGINE, WORKERS = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
from ngcapture_viz.load.index import CaptureIndex
extra = {}
if ENGINE == "ray":
    import ray
    import ray._private.ray_constants as constants
    constants.ENABLE_RAY_CLUSTER = False  # everything on 127.0.0.1
    for attempt in range(3):  # a loaded machine can miss Ray's 30 s start-up deadline
        t = time.perf_counter()
        try:
            ray.init(address="local", num_cpus=WORKERS, include_dashboard=False,
                     _node_ip_address="127.0.0.1", log_to_driver=False)
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    extra["init_s"] = time.perf_counter() - t
times = []
for _ in range(3):
    place = Path(tempfile.mkdtemp(prefix="ngcapture-bench-"))
    t = time.perf_counter()
    stats = CaptureIndex(STORE, index_dir=place, engine=ENGINE).refresh()
    times.append(time.perf_counter() - t)
    shutil.rmtree(place)
extra.update(times=times, bytes=stats.bytes_parsed, processes=stats.workers)
if ENGINE == "ray":
    ray.shutdown()
print(json.dumps(extra))
"""


def _measure(store: Path, engine: str, workers: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _SNIPPET, str(store), engine, str(workers)],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
        env=None,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{engine} x{workers} failed: {done.stderr.strip()[-800:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run(*, quick: bool = False) -> list[dict[str, Any]]:
    size = 48 if quick else SIZE_MB
    store = ROOT / f"store-{size}mb"
    info = build_store(store, size * 1024 * 1024)
    rows = []
    reference = None
    for engine, workers in (("local", 1), ("ray", 1), ("ray", 2)):
        result = _measure(store, engine, workers)
        first, rest = result["times"][0], result["times"][1:]
        median = statistics.median(rest) if engine == "ray" else statistics.median(result["times"])
        if reference is None:
            reference = median
        mb = info["bytes"] / 1e6
        detail = f"{result['processes']} process(es), {mb / median / workers:,.0f} MB/s per worker"
        if engine == "ray":
            detail += (
                f"; first build {first:.2f} s (workers start); ray.init {result['init_s']:.1f} s"
            )
        rows.append(
            {
                "benchmark": f"index build {size:,} MB",
                "variant": "local, 1 process" if engine == "local" else f"Ray, {workers} worker(s)",
                "n": info["calls"],
                "median_s": median,
                "per_s": mb / median,
                "unit": "MB/s",
                "ratio_vs_floor": median / reference,
                "detail": detail,
            }
        )
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(
            f"| {row['benchmark']} | {row['variant']} | {row['n']:,} | {row['median_s']:.3f} | "
            f"{row['per_s']:,.0f} {row['unit']} | {row['ratio_vs_floor']:.2f} | {row['detail']} |"
        )
