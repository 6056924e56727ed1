"""The perf frame: where each rollout's wall time went (its ``ng_perf``), or why that is unknown."""

from __future__ import annotations

from typing import Final

import polars as pl

from ngcapture_viz.frames._columns import UTC_TIME, Column, FrameSchema

__all__ = ["PERF", "PERF_FIGURES"]

_INT = pl.Int64()
_STR = pl.String()
_FLOAT = pl.Float64()

#: The numeric figures of ``ng_perf`` (milliseconds unless named otherwise).
PERF_FIGURES: Final = (
    "wall_time_ms",
    "model_time_ms",
    "tool_time_ms",
    "overhead_time_ms",
    "tool_model_overlap_ms",
    "model_concurrency_peak",
    "model_concurrency_mean",
    "tokens_out_per_s",
    "ttft_p50_ms",
    "cache_hit_share",
)

PERF: Final = FrameSchema(
    "perf",
    [
        Column("run", pl.Categorical(), "The run's label."),
        Column("rollout_id", _STR, "The rollout."),
        Column("started_at", UTC_TIME, "Start of the rollout's window (the collector's clock)."),
        Column("completed_at", UTC_TIME, "End of that window."),
        Column("wall_time_ms", _FLOAT, "The window's length."),
        Column("model_time_ms", _FLOAT, "Time with at least one model call in flight."),
        Column("tool_time_ms", _FLOAT, "Time with a tool executing and no model call in flight."),
        Column("overhead_time_ms", _FLOAT, "Time with neither (model + tool + overhead = wall)."),
        Column("tool_model_overlap_ms", _FLOAT, "Tool time hidden under model time."),
        Column("model_calls", _INT, "Model calls the figures cover."),
        Column("tool_calls", _INT, "Tool executions the figures cover."),
        Column("model_concurrency_peak", _INT, "Most model calls in flight at once."),
        Column("model_concurrency_mean", _FLOAT, "Calls in flight, averaged over model time."),
        Column("tokens_out", _INT, "Output tokens of all calls (null: not all reported)."),
        Column("tokens_out_per_s", _FLOAT, "Output tokens per second of model time."),
        Column("ttft_p50_ms", _FLOAT, "Median time to first token of the calls that reported it."),
        Column("cache_hit_share", _FLOAT, "Cached / prompt tokens, over calls reporting both."),
        Column("evidence", _STR, "Per figure, its evidence sources and coverage (JSON)."),
        Column(
            "unavailable_reason",
            _STR,
            "Why there is no ng_perf (the `perf_unavailable` gap's detail); null when there is.",
        ),
    ],
)
