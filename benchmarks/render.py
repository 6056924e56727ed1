"""Rendering cost: the dashboard and the HTML report for 10k, 100k and 1M calls.

The big runs are built in memory by replicating a synthetic run's frames (``write_run``, about
a thousand calls) with fresh rollout and call ids, shifted start times and perturbed latencies
and token counts, so no million-call store is written. Timed: ``dashboard(run)`` and
``write_report(run)`` (which builds the dashboard, the gap report and nine timelines again);
the report's file size is in the detail. ``--quick`` uses 10k and 100k calls only.
Goal (issue 9): 100k calls render in under 5 s and the report stays under 20 MB.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from capture_core.testing import RunSpec, write_run
from ngcapture_viz.run import CaptureRun, open_run

GOAL_SECONDS = 5.0
GOAL_BYTES = 20_000_000
GOAL_CALLS = 100_000


def base_run(directory: Path, *, tasks: int = 150, seed: int = 0) -> CaptureRun:
    """A synthetic run on disk (about 7 calls per rollout, some concurrent, one damaged line)."""
    spec = RunSpec(tasks=tasks, repeats=2, calls=(2, 12), concurrency=3, seed=seed)
    synthetic = write_run(directory, spec)
    victim = sorted(synthetic.capture_dir.glob("*.capture.jsonl"))[0]
    with victim.open("ab") as handle:  # one damaged line, so the gap report has rows
        handle.write(b'{"model_call_id": "torn", "dialect": "chat"\n')
    return open_run(synthetic.capture_dir, synthetic.rollouts, label="bench", index=False)


def _perturb(column: str, key: str, seed: int) -> pl.Expr:
    """``column`` times a factor in [0.8, 1.2) drawn from a hash of ``key`` (deterministic)."""
    uniform = (pl.col(key).hash(seed) % 10_000).cast(pl.Float64) / 10_000
    return pl.col(column) * (0.8 + 0.4 * uniform)


def scale_run(run: CaptureRun, calls: int, *, seed: int = 0) -> CaptureRun:
    """``run`` replicated (with new ids, later start times, perturbed metrics) to ``calls`` calls.

    Copy ``i`` renames rollout ``<task>-<repeat>`` to ``<task>x<i>-<repeat>`` and call ids to
    ``<id>-<i>``, and starts ``i`` times the run's span (plus a second) later.

    Example:
        >>> big = scale_run(base_run(Path("/tmp/b")), 100_000)  # doctest: +SKIP
        >>> big.calls.height
        100000
    """
    copies = math.ceil(calls / max(run.calls.height, 1))
    first, last = run.calls["started_at"].min(), run.calls["completed_at"].max()
    if not isinstance(first, dt.datetime) or not isinstance(last, dt.datetime):
        raise ValueError("scale_run needs a run whose calls have timestamps")
    span = last - first + dt.timedelta(seconds=1)

    def copy(frame: pl.DataFrame, i: int) -> pl.DataFrame:
        out = frame.with_columns(
            pl.concat_str([pl.col("rollout_id").str.extract(r"^([^-]+)"), pl.lit(f"x{i}-"),
                           pl.col("rollout_id").str.extract(r"^[^-]+-(.*)$")])
            .alias("rollout_id")
        )  # fmt: skip
        shifted = [c for c in ("started_at", "completed_at") if c in frame.columns]
        out = out.with_columns(pl.col(c) + span * i for c in shifted)
        if "model_call_id" in frame.columns:
            out = out.with_columns(pl.col("model_call_id") + f"-{i}")
        return out

    def replicate(frame: pl.DataFrame) -> pl.DataFrame:
        return pl.concat([copy(frame, i) for i in range(copies)], how="vertical")

    big_calls = replicate(run.calls).head(calls)
    big_calls = big_calls.with_columns(
        _perturb("latency_total_ms", "model_call_id", seed),
        _perturb("latency_ttft_ms", "model_call_id", seed + 1),
        _perturb("tokens_out", "model_call_id", seed + 2).round().cast(pl.Int64),
    )
    kept = big_calls.select("run", "rollout_id").unique()
    keep = {"on": ["run", "rollout_id"], "how": "semi"}
    return CaptureRun(
        run.label,
        calls=big_calls,
        rollouts=replicate(run.rollouts).join(kept, **keep),  # type: ignore[arg-type]
        gaps=replicate(run.gaps).join(kept, **keep),  # type: ignore[arg-type]
        tool_calls=replicate(run.tool_calls).join(kept, **keep),  # type: ignore[arg-type]
    )


def _timed(action: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def run(*, quick: bool = False) -> list[dict[str, Any]]:
    from ngcapture_viz.figures.dashboard import dashboard
    from ngcapture_viz.report import write_report

    sizes = [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = base_run(root / "base")
        for calls in sizes:
            big = scale_run(base, calls)
            repeats = 1 if quick or calls >= 1_000_000 else 3
            out = root / f"report-{calls}.html"
            board_s = _timed(lambda big=big: dashboard(big), repeats)
            report_s = _timed(lambda big=big, out=out: write_report(big, out), repeats)
            size = out.stat().st_size
            label = f"render {calls:,} calls"
            goal = ""
            if calls == GOAL_CALLS:
                met = report_s < GOAL_SECONDS and size < GOAL_BYTES
                goal = f"; goal < {GOAL_SECONDS:g} s and < {GOAL_BYTES / 1e6:g} MB: "
                goal += "met" if met else "NOT met"
            for variant, seconds in (("dashboard", board_s), ("write_report", report_s)):
                rows.append({
                    "benchmark": label,
                    "variant": variant,
                    "n": calls,
                    "median_s": seconds,
                    "per_s": calls / seconds,
                    "unit": "calls/s",
                    "ratio_vs_floor": seconds / board_s,
                    "detail": (f"{big.rollouts.height:,} rollouts, median of {repeats}"
                               + (f"; report {size / 1e6:.1f} MB{goal}"
                                  if variant == "write_report" else "")),
                })  # fmt: skip
    return rows
