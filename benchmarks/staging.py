"""Token staging through the filesystem sink: staged calls per second and bytes per call.

For 1k-token and 32k-token deltas, with and without fsync, beside the raw bandwidth of the
same disk measured in the same run: writing the same number of bytes, one file per call, with
``write + fsync + rename`` (the floor any durable per-call sink pays) and without fsync.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from capture_core.staging import (
    FilesystemStagingSink,
    StagedCallRecord,
    build_staged_call_record,
)


def _records(delta: int, count: int, seed: int) -> list[StagedCallRecord]:
    rng = random.Random(seed)
    prompt = [rng.randrange(50_000) for _ in range(64)]
    return [
        build_staged_call_record(
            rollout_id=f"bench-{i}",
            model_call_id=f"{i:032x}",
            prompt_token_ids=prompt,
            generated_token_ids=[rng.randrange(150_000) for _ in range(delta)],
            generated_logprobs=[-rng.random() * 5 for _ in range(delta)],
            weight_version=1,
        )
        for i in range(count)
    ]


def _raw_writes(root: Path, sizes: list[int], *, fsync: bool) -> float:
    started = time.perf_counter()
    for index, size in enumerate(sizes):
        temp, final = root / f".tmp-{index}", root / f"raw-{index}"
        with temp.open("wb") as handle:
            handle.write(os.urandom(size))
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        temp.rename(final)
    if fsync:
        directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(directory)
        os.close(directory)
    return time.perf_counter() - started


def run(*, quick: bool = False) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for delta, count in ((1024, 60 if quick else 300), (32_768, 10 if quick else 40)):
        records = _records(delta, count, seed=delta)
        for fsync in (True, False):
            timings, sizes = [], []
            for repeat in range(3):
                with tempfile.TemporaryDirectory() as tmp:
                    sink = FilesystemStagingSink(Path(tmp) / "stage", fsync=fsync)
                    started = time.perf_counter()
                    for record in records:
                        sink.stage(record)
                    timings.append(time.perf_counter() - started)
                    if repeat == 0:
                        sizes = [p.stat().st_size for p in Path(tmp, "stage").rglob("*")
                                 if p.is_file()]  # fmt: skip
            with tempfile.TemporaryDirectory() as tmp:
                raw = statistics.median(
                    _raw_writes(Path(tmp), sizes, fsync=fsync) for _ in range(3)
                )
            seconds = statistics.median(timings)
            per_call = sum(sizes) / max(1, len(sizes))
            label = f"stage {delta:,}-token deltas, {'fsync' if fsync else 'no fsync'}"
            rows.append({
                "benchmark": label, "variant": "FilesystemStagingSink.stage", "n": count,
                "median_s": seconds, "per_s": count / seconds, "unit": "calls/s",
                "ratio_vs_floor": seconds / raw,
                "detail": (f"{per_call / 1024:,.1f} KiB per call, "
                           f"{sum(sizes) / seconds / 1e6:,.1f} MB/s staged"),
            })  # fmt: skip
            rows.append({
                "benchmark": label, "variant": "raw write+rename, same bytes (floor)", "n": count,
                "median_s": raw, "per_s": count / raw, "unit": "files/s", "ratio_vs_floor": 1.0,
                "detail": f"{sum(sizes) / raw / 1e6:,.1f} MB/s raw",
            })  # fmt: skip
    return rows
