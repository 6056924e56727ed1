"""Opening a capture store: ``open_run`` (cold, warm, incremental) against Polars and DuckDB.

Each measurement runs in a fresh Python process, so "cold" really is cold (no index, nothing
imported: import time is excluded, file pages may be cached) and the peak RSS is the variant's
own. The alternatives read the same files into the columns they *can* produce with an explicit
schema (ids, dialect, timestamps, latencies, status, error category, model, prompt and output
tokens, file name); `open_run` produces all of those plus normalized reasoning and cache tokens,
finish reasons, tool calls, outcomes, byte offsets for lazy payloads, and gap rows. Two floors:
reading every file's bytes, and reading them plus decoding each line's envelope with the
fastest decoder we found (msgspec into a typed struct, the bodies skipped).

Stores (``NGCAPTURE_BENCH_LOAD_SIZES``, MB, default ``50,250,1000,10000``; ``--quick``
``24,48``) are written once under ``results/bench/load/`` and reused: lines of a fixed base set
(``CaptureLineFactory``, ~5.3 KB a line, 1–9 calls per rollout) with fresh call ids, carrying
the ``ngcapture_facts`` our server writes, with the facts journal it writes beside them and
that journal's columnar segments, as the server leaves them when it stops (``ngcapture
compact``); one more store of the first size above 200 MB is written without facts (as another
writer, e.g. NeMo Gym, would write it). "open_run cold, journal lines only" puts the segments
aside: every journal entry decoded, as a store whose server was killed before compacting.
Variants are interleaved, one sample of each in turn.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.load_stores import ROOT, _append_one_percent, _restore, build_store
from ngcapture_viz.load.journal_segments import journal_files, write_segments

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
         "decoded": run.index_stats.decoded}
""",
    "open_run cold, journal lines only": """
import os, shutil, tempfile, time
from ngcapture_viz import open_run
from ngcapture_viz.load.index import INDEX_DIR_NAME
shutil.rmtree(STORE / INDEX_DIR_NAME, ignore_errors=True)
# The journal's columnar segments put aside: every entry is decoded, as before segments.
aside = Path(tempfile.mkdtemp(dir=STORE / ".facts"))
moved = [path.rename(aside / path.name) for path in (STORE / ".facts").glob("*.parquet")]
try:
    t = time.perf_counter()
    run = open_run(STORE)
    seconds = time.perf_counter() - t
finally:
    for path in moved:
        path.rename(STORE / ".facts" / path.name)
    aside.rmdir()
extra = {"rows": run.calls.height, "bytes_parsed": run.index_stats.bytes_parsed,
         "decoded": run.index_stats.decoded}
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
    "floor: read the bytes": """
import os, time
t = time.perf_counter()
total = 0
fd_dir = os.open(STORE, os.O_RDONLY | os.O_DIRECTORY)
for name in os.listdir(fd_dir):
    if name.endswith(".capture.jsonl"):
        fd = os.open(name, os.O_RDONLY, dir_fd=fd_dir)
        total += len(os.pread(fd, os.fstat(fd).st_size, 0))
        os.close(fd)
os.close(fd_dir)
seconds = time.perf_counter() - t
extra = {"rows": 0, "bytes": total}
""",
    "floor: read + decode envelopes": """
import os, time
import msgspec
class Ref(msgspec.Struct):
    name: str
    type: str = "responses_api_models"
class Envelope(msgspec.Struct):
    model_call_id: str
    dialect: str
    model_ref: Ref | None = None
    started_at: float | None = None
    completed_at: float | None = None
    latency_ms: float | None = None
    latency_ttft_ms: float | None = None
    status_code: int | None = None
    error_category: str | None = None
decode = msgspec.json.Decoder(Envelope).decode
t = time.perf_counter()
rows = 0
fd_dir = os.open(STORE, os.O_RDONLY | os.O_DIRECTORY)
for name in os.listdir(fd_dir):
    if name.endswith(".capture.jsonl"):
        fd = os.open(name, os.O_RDONLY, dir_fd=fd_dir)
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        os.close(fd)
        view = memoryview(data)
        start = 0
        while (end := data.find(b"\\n", start)) >= 0:
            decode(view[start:end])
            rows += 1
            start = end + 1
os.close(fd_dir)
seconds = time.perf_counter() - t
extra = {"rows": rows}
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


_VARIANTS = (
    "floor: read the bytes",
    "floor: read + decode envelopes",
    "polars scan_ndjson",
    "duckdb read_json",
    "open_run cold",
    "open_run cold, journal lines only",
)


def _sizes(quick: bool) -> list[int]:
    default = "24,48" if quick else "50,250,1000,10000"
    return [int(size) for size in os.environ.get("NGCAPTURE_BENCH_LOAD_SIZES", default).split(",")]


def run(*, quick: bool = False) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    sizes = _sizes(quick)
    plan = [(size, True) for size in sizes]
    foreign = next((size for size in sizes if size >= 200), None)
    if foreign is not None:
        plan.append((foreign, False))
    for size, facts in plan:
        # The largest store: one sample of each cold variant (minutes each), three warm ones.
        repeats = 1 if quick or size >= 5000 else 3
        name = f"store-{size}mb" if facts else f"store-{size}mb-nofacts"
        store = ROOT / name
        print(f"load: {name}", file=sys.stderr, flush=True)
        info = build_store(store, size * 1_000_000, facts=facts)
        if facts:  # as the capture server leaves it: its journal compacted into segments
            for journal in journal_files(str(store)):
                write_segments(journal)
        megabytes = info["bytes"] / 1e6
        variants = _VARIANTS if facts else ("polars scan_ndjson", "open_run cold")
        results: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
        for _ in range(repeats):  # interleaved: a slow minute of the machine hits them all
            for variant in variants:
                results[variant].append(_measure(variant, store))
        if not facts:
            rows += _rows(info, megabytes, "no facts", results)
            continue
        # One open untimed first: the cold variants before it (DuckDB and Polars hold up to
        # 13 GB at 10 GB) push the directory's inodes out of the kernel's caches, and the
        # first open after them reads them back from disk (2.7 against 2.0 s at 10 GB).
        _measure("open_run warm", store)
        results["open_run warm"] = [_measure("open_run warm", store) for _ in range(3)]
        increments: list[dict[str, Any]] = []
        originals: dict[Path, tuple[int, int]] = {}
        for n in range(3 if not quick else 1):
            _measure("open_run warm", store)  # the index is up to date before appending
            added, original = _append_one_percent(store, info, seed=n)
            for path, size_before in original.items():
                originals.setdefault(path, size_before)
            increments.append({**_measure("open_run +1% calls", store), "appended_bytes": added})
            _restore(original)
        results["open_run +1% calls"] = increments
        _restore(originals)
        _measure("open_run warm", store)  # leave the index matching the store
        rows += _rows(info, megabytes, "facts", results)
    return rows


def _rows(
    info: dict[str, Any], megabytes: float, kind: str, results: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    reference = statistics.median(r["seconds"] for r in results["polars scan_ndjson"])
    out = []
    for variant, samples in results.items():
        seconds = statistics.median(r["seconds"] for r in samples)
        peak = max(r["peak_mb"] for r in samples)
        detail = f"{megabytes:,.0f} MB, {info['rollouts']:,} files, {kind}; peak RSS {peak:,.0f} MB"
        detail += f"; {len(samples)} sample(s)"
        if variant == "open_run +1% calls":
            parsed = statistics.median(r["bytes_parsed"] for r in samples)
            appended = statistics.median(r["appended_bytes"] for r in samples)
            detail += f"; parsed {parsed / 1e6:.2f} MB of {appended / 1e6:.2f} MB appended"
        if variant.startswith("open_run cold"):
            detail += f"; lines read by {samples[0].get('decoded')}"
        out.append(
            {
                "benchmark": f"load {megabytes:,.0f} MB"
                + ("" if kind == "facts" else " (no facts)"),
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
