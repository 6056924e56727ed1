"""Synthetic runs on disk: a capture store plus a rollout JSONL file, from a seed.

For tests, benchmarks, notebooks and users who want to try the analysis side without a
server. Tasks keep their character across runs (a task that is slow in one checkpoint is slow in
the next), so two runs with the same ``task_seed`` and different ``latency_scale`` are a
checkpoint pair with a known shift.

Example:
    >>> from capture_core.testing.runs import RunSpec, write_run
    >>> run = write_run(tmp_path / "ckpt-1", RunSpec(tasks=3, repeats=2))  # doctest: +SKIP
    >>> len(run.rollout_ids)  # doctest: +SKIP
    6
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from capture_core.ids import make_rollout_id
from capture_core.metrics import aggregate_model_call_records
from capture_core.normalize import normalize_line
from capture_core.records import ATTACHMENT_KEY, ModelCallCaptureAttachment, RawCaptureLine
from capture_core.store import DATA_SUFFIX
from capture_core.testing.lines import CaptureLineFactory

__all__ = ["RunSpec", "SyntheticRun", "write_run"]


@dataclass(frozen=True)
class RunSpec:
    """What to generate.

    Attributes:
        tasks / repeats: rollouts are ``<task>-<repeat>`` for every pair.
        calls: inclusive range of calls per rollout.
        concurrency: at most this many calls of a rollout overlap in time (1: sequential).
        latency_scale / tokens_scale: multiply every latency / output token count (a shift).
        error_rate / truncation_rate: share of failed calls / truncated streams.
        seed: varies the calls; task_seed: fixes each task's character across runs.
        marker: a string planted in every request and response payload (leak tests).
        start: Unix time of the first call.
    """

    tasks: int = 20
    repeats: int = 2
    calls: tuple[int, int] = (1, 6)
    concurrency: int = 1
    latency_scale: float = 1.0
    tokens_scale: float = 1.0
    error_rate: float = 0.05
    truncation_rate: float = 0.03
    seed: int = 0
    task_seed: int = 0
    marker: str | None = None
    start: float = 1786032154.0


@dataclass(frozen=True)
class SyntheticRun:
    """Where a generated run lives."""

    capture_dir: Path
    rollouts: Path
    rollout_ids: list[str] = field(default_factory=list)
    num_calls: int = 0


def write_run(directory: str | os.PathLike[str], spec: RunSpec | None = None) -> SyntheticRun:
    """Write ``<directory>/model-calls/`` and ``<directory>/rollouts.jsonl`` for ``spec``."""
    spec = spec or RunSpec()
    root = Path(directory)
    capture_dir = root / "model-calls"
    capture_dir.mkdir(parents=True, exist_ok=True)
    factory = CaptureLineFactory(
        seed=spec.seed, error_rate=spec.error_rate, truncation_rate=spec.truncation_rate
    )
    rng = random.Random(spec.seed * 7919 + 1)
    clock = spec.start
    ids: list[str] = []
    records: list[bytes] = []
    total = 0
    for task in range(spec.tasks):
        character = random.Random(spec.task_seed * 1_000_003 + task)
        slowness = character.lognormvariate(0.0, 0.35)
        skill = character.random()
        for repeat in range(spec.repeats):
            rollout_id = make_rollout_id(task, repeat)
            count = rng.randint(*spec.calls)
            lines = _rollout_lines(factory, rng, spec, count=count, start=clock, slowness=slowness)
            clock = max(line.completed_at or clock for line in lines) + rng.uniform(0.5, 3.0)
            (capture_dir / f"{rollout_id}{DATA_SUFFIX}").write_bytes(
                b"".join(line.to_jsonl() for line in lines)
            )
            calls = [normalize_line(line.to_json_dict(), i) for i, line in enumerate(lines)]
            attachment = ModelCallCaptureAttachment(
                rollout_id=rollout_id, metrics=aggregate_model_call_records(calls), calls=calls
            )
            record: dict[str, Any] = {
                "task_id": f"task-{task:04d}",
                "_ng_task_index": task,
                "_ng_rollout_index": repeat,
                "reward": 1.0 if rng.random() < skill else 0.0,
                ATTACHMENT_KEY: attachment.to_json_dict(),
            }
            records.append(orjson.dumps(record) + b"\n")
            ids.append(rollout_id)
            total += count
    rollouts = root / "rollouts.jsonl"
    rollouts.write_bytes(b"".join(records))
    return SyntheticRun(capture_dir, rollouts, ids, total)


def _rollout_lines(
    factory: CaptureLineFactory,
    rng: random.Random,
    spec: RunSpec,
    *,
    count: int,
    start: float,
    slowness: float,
) -> list[RawCaptureLine]:
    lanes = [start] * max(1, spec.concurrency)  # when each lane is free again
    out: list[RawCaptureLine] = []
    for _ in range(count):
        line = factory.line()
        lane = min(range(len(lanes)), key=lanes.__getitem__)
        begin = lanes[lane] + rng.uniform(0.005, 0.4)
        latency = round((line.latency_ms or 100.0) * slowness * spec.latency_scale, 2)
        ttft = line.latency_ttft_ms
        if ttft is not None:
            ttft = round(min(latency, ttft * slowness * spec.latency_scale), 2)
        update: dict[str, Any] = {
            "started_at": round(begin, 6),
            "completed_at": round(begin + latency / 1000, 6),
            "latency_ms": latency,
            "latency_ttft_ms": ttft,
        }
        if spec.tokens_scale != 1.0:
            update["response"] = _scale_tokens(line.response, spec.tokens_scale)
        if spec.marker is not None:
            update.update(_planted(line, update.get("response", line.response), spec.marker))
        line = line.model_copy(update=update)
        lanes[lane] = line.completed_at or begin
        out.append(line)
    return out


_OUTPUT_KEYS = ("output_tokens", "completion_tokens")


def _scale_tokens(response: dict[str, Any] | None, scale: float) -> dict[str, Any] | None:
    if not isinstance(response, dict) or not isinstance(response.get("usage"), dict):
        return response
    usage = dict(response["usage"])
    for key in _OUTPUT_KEYS:
        if isinstance(usage.get(key), int):
            usage[key] = round(usage[key] * scale)
    return {**response, "usage": usage}


def _planted(line: RawCaptureLine, response: dict[str, Any] | None, marker: str) -> dict[str, Any]:
    planted: dict[str, Any] = {"request": {**(line.request or {}), "metadata": {"note": marker}}}
    if response is not None:
        planted["response"] = {**response, "note": marker}
    if line.response_raw is not None:
        planted["response_raw"] = line.response_raw + f": {marker}\n\n"
    if line.request_raw is not None:
        planted["request_raw"] = line.request_raw + marker
    return planted
