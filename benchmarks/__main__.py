"""``make bench``: run every benchmark and write one JSON file and one markdown table.

Usage: ``python -m benchmarks [--quick] [--out results/bench]``. Numbers are medians (or best
of N where a row says so); ratios compare each variant with the row marked as the floor. The
machine is shared and noisy: compare ratios within one run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import (
    capture_facts,
    capture_overhead,
    large_body,
    load,
    proxy,
    ray_index,
    render,
    sse_parse,
    staging,
    store_io,
    widget,
)

SUITES = {
    "capture_facts": capture_facts.run,
    "capture_overhead": capture_overhead.run,
    "large_body": large_body.run,
    "render": render.run,
    "load": load.run,
    "proxy": proxy.run,
    "ray_index": ray_index.run,
    "sse_parse": sse_parse.run,
    "staging": staging.run,
    "store_io": store_io.run,
    "widget": widget.run,
}


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| benchmark | variant | n | median s | throughput | × reference | detail |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['benchmark']} | {row['variant']} | {row['n']:,} | {row['median_s']:.4f} "
            f"| {row['per_s']:,.1f} {row['unit']} | {row['ratio_vs_floor']:.2f} "
            f"| {row.get('detail', '')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the ngcapture benchmarks.")
    parser.add_argument("--quick", action="store_true", help="smaller inputs, fewer repeats")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    parser.add_argument("--only", choices=sorted(SUITES), action="append")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name in args.only or SUITES:
        started = time.perf_counter()
        suite_rows = SUITES[name](quick=args.quick)
        print(f"{name}: {len(suite_rows)} rows in {time.perf_counter() - started:.1f} s")
        rows += [{"suite": name, **row} for row in suite_rows]
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": args.quick,
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    table = markdown(rows)
    (args.out / "results.md").write_text(table)
    print("\n" + table)
    print(f"Results: {args.out.resolve() / 'results.json'} and results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
