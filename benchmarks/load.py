"""Opening a capture store: ``open_run`` (cold, warm, incremental) against Polars and DuckDB.

Each measurement runs in a fresh Python process, so "cold" really is cold (no index, nothing
imported: import time is excluded, file pages may be cached) and the peak RSS is the variant's
own. The alternatives read the same files into the columns they *can* produce with an explicit
schema (ids, dialect, timestamps, latencies, status, error category, model, prompt and output
tokens, file name); `open_run` produces all of those plus normalized reasoning and cache tokens,
finish reasons, tool calls, outcomes, byte offsets for lazy payloads, and gap rows.

Store size: ``NGCAPTURE_BENCH_LOAD_MB`` (default 250, ``--quick`` 24), grown to 1×, 2× and 4×.
Stores are generated once under ``results/bench/load/`` and reused.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from capture_core.testing import CaptureLineFactory

ROOT = Path("results/bench/load")
STAMP = "complete.json"

_SNIPPETS = {
    "open_run cold": """
import shutil, time
from ngcapture_viz import open_run
from ngcapture_viz.load.index import INDEX_DIR_NAME
shutil.rmtree(STORE / INDEX_DIR_NAME, ignore_errors=True)
t = time.perf_counter()
run = open_run(STORE)
seconds = time.perf_counter() - t
extra = {"rows": run.calls.height, "bytes_parsed": run.index_stats.bytes_parsed,
         "workers": run.index_stats.workers}
""",
    "open_run warm": """
import time
from ngcapture_viz import open_run
t = time.perf_counter()
run = open_run(STORE)
seconds = time.perf_counter() - t
extra = {"rows": run.calls.height, "bytes_parsed": run.index_stats.bytes_parsed}
""",
    "open_run +1% calls": """
import time
from ngcapture_viz import open_run
t = time.perf_counter()
run = open_run(STORE)
seconds = time.perf_counter() - t
extra = {"rows": run.calls.height, "bytes_parsed": run.index_stats.bytes_parsed,
         "appended_files": run.index_stats.appended}
""",
    "polars scan_ndjson": """
import time
import polars as pl
usage = pl.Struct({k: pl.Int64 for k in
    ("input_tokens", "prompt_tokens", "output_tokens", "completion_tokens")})
schema = {"model_call_id": pl.String, "dialect": pl.String, "started_at": pl.Float64,
    "completed_at": pl.Float64, "latency_ms": pl.Float64, "latency_ttft_ms": pl.Float64,
    "status_code": pl.Int64, "error_category": pl.String,
    "response": pl.Struct({"model": pl.String, "usage": usage})}
t = time.perf_counter()
u = pl.col("response").struct.field("usage")
frame = (pl.scan_ndjson(str(STORE / "*.capture.jsonl"), schema=schema, include_file_paths="file")
    .select("file", "model_call_id", "dialect", "started_at", "completed_at", "latency_ms",
        "latency_ttft_ms", "status_code", "error_category",
        pl.col("response").struct.field("model").alias("model"),
        pl.coalesce(u.struct.field("input_tokens"), u.struct.field("prompt_tokens"))
        .alias("tokens_in"),
        pl.coalesce(u.struct.field("output_tokens"), u.struct.field("completion_tokens"))
        .alias("tokens_out"))
    .collect())
seconds = time.perf_counter() - t
extra = {"rows": frame.height}
""",
    "duckdb read_json": """
import time
import duckdb
columns = ("{model_call_id: 'VARCHAR', dialect: 'VARCHAR', started_at: 'DOUBLE', "
    "completed_at: 'DOUBLE', latency_ms: 'DOUBLE', latency_ttft_ms: 'DOUBLE', "
    "status_code: 'BIGINT', error_category: 'VARCHAR', response: 'STRUCT(model VARCHAR, "
    "usage STRUCT(input_tokens BIGINT, prompt_tokens BIGINT, output_tokens BIGINT, "
    "completion_tokens BIGINT))'}")
t = time.perf_counter()
frame = duckdb.sql(f'''select filename as file, model_call_id, dialect, started_at, completed_at,
    latency_ms, latency_ttft_ms, status_code, error_category, response.model as model,
    coalesce(response.usage.input_tokens, response.usage.prompt_tokens) as tokens_in,
    coalesce(response.usage.output_tokens, response.usage.completion_tokens) as tokens_out
    from read_json('{STORE}/*.capture.jsonl', format='newline_delimited', filename=true,
    columns={columns})''').pl()
seconds = time.perf_counter() - t
extra = {"rows": frame.height}
""",
}

_WRAPPER = """
import json, resource, sys
from pathlib import Path
STORE = Path(sys.argv[1])
{body}
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"seconds": seconds, "peak_mb": peak, **extra}}))
"""


def build_store(path: Path, target_bytes: int, *, seed: int = 1) -> dict[str, Any]:
    """Write a store of about ``target_bytes`` of realistic lines (reused when complete)."""
    stamp = path / STAMP
    if stamp.is_file():
        return dict(json.loads(stamp.read_text()))
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    factory = CaptureLineFactory(seed=seed)
    rng = random.Random(seed)
    total = calls = rollouts = 0
    while total < target_bytes:
        count = rng.randint(1, 9)
        data = b"".join(line.to_jsonl() for line in factory.lines(count))
        (path / f"{rollouts // 8}-{rollouts % 8}.capture.jsonl").write_bytes(data)
        total += len(data)
        calls += count
        rollouts += 1
    info = {"bytes": total, "calls": calls, "rollouts": rollouts}
    stamp.write_text(json.dumps(info))
    return info


def _measure(variant: str, store: Path) -> dict[str, Any]:
    code = _WRAPPER.format(body=_SNIPPETS[variant])
    done = subprocess.run(
        [sys.executable, "-c", code, str(store)],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant} failed: {done.stderr.strip()[-800:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _append_one_percent(
    store: Path, info: dict[str, Any], seed: int
) -> tuple[int, dict[Path, int]]:
    """Append 1% more calls to random rollouts; returns the bytes added and original sizes."""
    rng = random.Random(seed)
    factory = CaptureLineFactory(seed=10_000 + seed)
    files = sorted(store.glob("*.capture.jsonl"))
    original: dict[Path, int] = {}
    added = 0
    for _ in range(max(1, info["calls"] // 100)):
        path = rng.choice(files)
        original.setdefault(path, path.stat().st_size)
        data = factory.line().to_jsonl()
        with path.open("ab") as handle:
            handle.write(data)
        added += len(data)
    return added, original


def _restore(original: dict[Path, int]) -> None:
    for path, size in original.items():
        os.truncate(path, size)


def run(*, quick: bool = False) -> list[dict[str, Any]]:
    base_mb = int(os.environ.get("NGCAPTURE_BENCH_LOAD_MB", "24" if quick else "250"))
    repeats = 1 if quick else 3
    rows: list[dict[str, Any]] = []
    for factor in (1, 2) if quick else (1, 2, 4):
        store = ROOT / f"store-{base_mb * factor}mb"
        info = build_store(store, base_mb * factor * 1_000_000)
        megabytes = info["bytes"] / 1e6
        results: dict[str, list[dict[str, Any]]] = {}
        for variant in ("polars scan_ndjson", "duckdb read_json", "open_run cold"):
            results[variant] = [_measure(variant, store) for _ in range(repeats)]
        results["open_run warm"] = [_measure("open_run warm", store) for _ in range(repeats)]
        increments: list[dict[str, Any]] = []
        originals: dict[Path, int] = {}
        for n in range(repeats):
            _measure("open_run warm", store)  # the index is up to date before appending
            added, original = _append_one_percent(store, info, seed=n)
            for path, size in original.items():
                originals.setdefault(path, size)
            increments.append({**_measure("open_run +1% calls", store), "appended_bytes": added})
        results["open_run +1% calls"] = increments
        _restore(originals)
        rows += _rows(info, megabytes, factor, results)
    return rows


def _rows(
    info: dict[str, Any], megabytes: float, factor: int, results: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    reference = statistics.median(r["seconds"] for r in results["polars scan_ndjson"])
    out = []
    for variant, samples in results.items():
        seconds = statistics.median(r["seconds"] for r in samples)
        peak = max(r["peak_mb"] for r in samples)
        detail = f"{megabytes:,.0f} MB store ({factor}×), peak RSS {peak:,.0f} MB"
        if variant == "open_run +1% calls":
            parsed = statistics.median(r["bytes_parsed"] for r in samples)
            appended = statistics.median(r["appended_bytes"] for r in samples)
            detail += f", parsed {parsed / 1e6:.2f} MB of {appended / 1e6:.2f} MB appended"
        if variant == "open_run cold":
            detail += f", {samples[0].get('workers', 1)} worker(s)"
        out.append(
            {
                "benchmark": f"load {megabytes:,.0f} MB",
                "variant": variant,
                "n": info["calls"],
                "median_s": seconds,
                "per_s": megabytes / seconds,
                "unit": "MB/s",
                "ratio_vs_floor": seconds / reference,
                "detail": detail,
                "peak_mb": peak,
                "samples": samples,
            }
        )
    return out
