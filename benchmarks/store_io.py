"""CaptureStore append and read throughput, beside the floors a plain file gives.

Append: ``CaptureStore.record`` (flock, torn-tail check, write, fsync) vs a bare
``write + fsync`` on an open file (the durability floor) vs ``write`` without fsync.
Read: ``read_records`` (parse + validate + normalize), ``read`` (parse only), a stdlib
``json`` loop and an ``orjson`` loop over the same lines (the parsing floor).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from capture_core import CaptureStore
from capture_core.testing import CaptureLineFactory


def _median_seconds(run: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run(*, quick: bool = False) -> list[dict[str, Any]]:
    appends = 200 if quick else 1000
    read_lines = 2000 if quick else 10_000
    repeats = 3 if quick else 5
    lines = list(CaptureLineFactory(seed=11).lines(read_lines))
    payloads = [line.to_jsonl() for line in lines]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = CaptureStore(root / "store", create=True)

        def store_append() -> None:
            store.clear("bench-0")
            for line in lines[:appends]:
                store.record("bench-0", line)

        def raw_append(fsync: bool) -> Callable[[], None]:
            def go() -> None:
                path = root / "raw.jsonl"
                with path.open("wb") as handle:
                    for data in payloads[:appends]:
                        handle.write(data)
                        handle.flush()
                        if fsync:
                            os.fsync(handle.fileno())

            return go

        floor = _median_seconds(raw_append(True), repeats)
        for variant, seconds in (
            ("CaptureStore.record (flock+fsync)", _median_seconds(store_append, repeats)),
            ("plain write+fsync (floor)", floor),
            ("plain write, no fsync", _median_seconds(raw_append(False), repeats)),
        ):
            rows.append({
                "benchmark": "append", "variant": variant, "n": appends,
                "median_s": seconds, "per_s": appends / seconds, "unit": "lines/s",
                "ratio_vs_floor": seconds / floor,
            })  # fmt: skip

        store.clear("bench-1")
        path = store.path_for("bench-1")
        path.write_bytes(b"".join(payloads))
        size_mb = path.stat().st_size / 1e6

        # The floors keep every parsed object alive, as a reader must.
        def json_loop() -> list[Any]:
            with path.open("rb") as handle:
                return [json.loads(raw) for raw in handle]

        def orjson_loop() -> list[Any]:
            return [orjson.loads(raw) for raw in path.read_bytes().split(b"\n") if raw]

        floor = _median_seconds(orjson_loop, repeats)
        for variant, seconds in (
            ("CaptureStore.read_records (records)", _median_seconds(
                lambda: store.read_records("bench-1"), repeats)),
            ("CaptureStore.read (raw dicts)", _median_seconds(
                lambda: store.read("bench-1"), repeats)),
            ("stdlib json loop", _median_seconds(json_loop, repeats)),
            ("orjson loop, keeps objects (reference)", floor),
        ):  # fmt: skip
            rows.append({
                "benchmark": f"read {size_mb:.1f} MB", "variant": variant, "n": read_lines,
                "median_s": seconds, "per_s": read_lines / seconds, "unit": "lines/s",
                "ratio_vs_floor": seconds / floor,
            })  # fmt: skip
    return rows
