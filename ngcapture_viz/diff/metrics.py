"""The capture metrics a checkpoint diff estimates, and the per-rollout parts they rest on.

Each :class:`Metric` is either a ratio of sums, ``Σ num / Σ den`` over rollouts, whose ``num``
and ``den`` are expressions over the per-rollout aggregates :data:`ROLLOUT_PARTS` and the
``ng_perf`` parts :data:`PERF_PARTS` (means per call or per rollout, rates, time shares), or a
linear-interpolated quantile of one calls column. Nulls are unknown values: a call that did
not report a metric (a rollout without ``ng_perf``) is left out of it, never counted as 0.
:data:`METRICS` lists them all in report order; :mod:`ngcapture_viz.diff.bootstrap` estimates them.

Example:
    >>> [m.name for m in METRICS if m.unit == "share"][:3]
    ['error_rate', 'truncation_rate', 'gap_rate']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import polars as pl

from ngcapture_viz.frames.calls import is_truncated

__all__ = ["METRICS", "PERF_PARTS", "ROLLOUT_PARTS", "TOKEN_PARTS", "Metric"]


@dataclass(frozen=True)
class Metric:
    """One metric of a checkpoint diff.

    A ratio metric is ``Σ num / Σ den`` over rollouts (``num``/``den`` are expressions over
    the per-rollout parts of ``ROLLOUT_PARTS``); a quantile metric is a linear-interpolated
    quantile ``q`` of the calls column ``column``. ``per`` is the unit a value is reported for
    (``call`` or ``rollout``), which is also what coverage counts.
    """

    name: str
    per: Literal["call", "rollout"]
    unit: Literal["tokens", "ms", "share", "count"]
    meaning: str
    num: pl.Expr | None = None
    den: pl.Expr | None = None
    column: str | None = None
    q: float | None = None


def _col(name: str) -> pl.Expr:
    return pl.col(name)


def _complete(prefix: str) -> pl.Expr:
    """Every call of the rollout reported the value (and there was at least one call)."""
    return (_col(f"{prefix}_n") == _col("n_calls")) & (_col("n_calls") > 0)


def _per_call(column: str, meaning: str) -> Metric:
    return Metric(
        f"{column}_per_call", "call", "tokens", meaning, _col(f"{column}_sum"), _col(f"{column}_n")
    )


def _per_rollout(prefix: str, name: str, unit: Literal["tokens", "count"], meaning: str) -> Metric:
    complete = _complete(prefix)
    num = pl.when(complete).then(_col(f"{prefix}_sum")).otherwise(0)
    return Metric(name, "rollout", unit, meaning, num, complete.cast(pl.Int64))


_TRUNCATED: Final = is_truncated()
ROLLOUT_PARTS: Final = [
    pl.len().cast(pl.Int64).alias("n_calls"),
    *(
        expr
        for column in ("tokens_in", "tokens_out", "tokens_reasoning")
        for expr in (
            pl.col(column).sum().cast(pl.Float64).alias(f"{column}_sum"),
            pl.col(column).count().cast(pl.Int64).alias(f"{column}_n"),
        )
    ),
    pl.col("latency_total_ms").sum().alias("latency_sum"),
    pl.col("latency_total_ms").count().cast(pl.Int64).alias("latency_n"),
    pl.col("error_category").is_not_null().sum().cast(pl.Int64).alias("errors"),
    _TRUNCATED.sum().cast(pl.Int64).alias("truncated"),
    (pl.col("outcome").is_not_null() | pl.col("error_category").is_not_null())
    .sum()
    .cast(pl.Int64)
    .alias("truncation_n"),
    pl.col("num_tool_calls").sum().cast(pl.Float64).alias("tools_sum"),
    pl.col("num_tool_calls").count().cast(pl.Int64).alias("tools_n"),
]

#: The ``perf`` frame columns joined to each rollout for the ``ng_perf`` metrics.
PERF_PARTS: Final = ("wall_time_ms", "model_time_ms", "tool_time_ms", "overhead_time_ms")
_HAS_PERF: Final = pl.col("wall_time_ms").is_not_null() & (pl.col("wall_time_ms") > 0)


#: The ``tokens`` frame columns joined to each rollout for the token-capture metrics.
TOKEN_PARTS: Final = ("masked",)
_HAS_VERDICT: Final = pl.col("masked").is_not_null()


def _perf_share(column: str, name: str, meaning: str) -> Metric:
    """The mean over rollouts with ``ng_perf`` of ``column / wall_time_ms``."""
    share = pl.when(_HAS_PERF).then(_col(column) / _col("wall_time_ms")).otherwise(0)
    return Metric(name, "rollout", "share", meaning, share, _HAS_PERF.cast(pl.Int64))


#: Every metric a diff reports, in report order.
METRICS: Final[tuple[Metric, ...]] = (
    _per_call("tokens_in", "Mean prompt tokens per call that reported them."),
    _per_call("tokens_out", "Mean output tokens (reasoning included) per reporting call."),
    _per_call("tokens_reasoning", "Mean reasoning tokens per reporting call."),
    _per_rollout(
        "tokens_in",
        "tokens_in_per_rollout",
        "tokens",
        "Mean prompt tokens per rollout (rollouts whose every call reported them).",
    ),
    _per_rollout(
        "tokens_out",
        "tokens_out_per_rollout",
        "tokens",
        "Mean output tokens per rollout (rollouts whose every call reported them).",
    ),
    _per_rollout(
        "tokens_reasoning",
        "tokens_reasoning_per_rollout",
        "tokens",
        "Mean reasoning tokens per rollout (rollouts whose every call reported them).",
    ),
    Metric(
        "latency_mean_ms",
        "call",
        "ms",
        "Mean total latency per call.",
        _col("latency_sum"),
        _col("latency_n"),
    ),
    Metric(
        "latency_p50_ms",
        "call",
        "ms",
        "Median total latency over calls.",
        column="latency_total_ms",
        q=0.5,
    ),
    Metric(
        "latency_p95_ms",
        "call",
        "ms",
        "95th percentile of total latency over calls.",
        column="latency_total_ms",
        q=0.95,
    ),
    Metric(
        "ttft_p50_ms",
        "call",
        "ms",
        "Median time to first token over streamed calls.",
        column="latency_ttft_ms",
        q=0.5,
    ),
    Metric(
        "ttft_p95_ms",
        "call",
        "ms",
        "95th percentile of time to first token.",
        column="latency_ttft_ms",
        q=0.95,
    ),
    Metric(
        "error_rate",
        "call",
        "share",
        "Share of calls with an error category.",
        _col("errors"),
        _col("n_calls"),
    ),
    Metric(
        "truncation_rate",
        "call",
        "share",
        "Share of calls cut short: outcome `length` or a truncated stream.",
        _col("truncated"),
        _col("truncation_n"),
    ),
    _per_rollout(
        "tools", "tool_calls_per_rollout", "count", "Mean tool calls requested per rollout."
    ),
    Metric(
        "calls_per_rollout",
        "rollout",
        "count",
        "Mean captured calls per rollout (rollouts with at least one captured call).",
        _col("n_calls"),
        (_col("n_calls") > 0).cast(pl.Int64),
    ),
    Metric(
        "gap_rate",
        "rollout",
        "share",
        "Share of rollouts with at least one gap.",
        (_col("num_gaps") > 0).cast(pl.Int64),
        _col("num_gaps").is_not_null().cast(pl.Int64),
    ),
    Metric(
        "rollout_wall_time_ms",
        "rollout",
        "ms",
        "Mean rollout wall time (ng_perf: the collector's clock), rollouts with ng_perf.",
        pl.when(_HAS_PERF).then(_col("wall_time_ms")).otherwise(0),
        _HAS_PERF.cast(pl.Int64),
    ),
    _perf_share(
        "model_time_ms",
        "model_time_share",
        "Mean share of a rollout's wall time with a model call in flight (ng_perf).",
    ),
    _perf_share(
        "tool_time_ms",
        "tool_time_share",
        "Mean share of a rollout's wall time with only a tool executing (ng_perf).",
    ),
    _perf_share(
        "overhead_time_ms",
        "overhead_share",
        "Mean share of a rollout's wall time with neither: harness overhead (ng_perf).",
    ),
    Metric(
        "masked_rate",
        "rollout",
        "share",
        "Share of rollouts delivered with token-id capture that were masked (mask_sample), "
        "over rollouts with a token-capture verdict.",
        pl.when(_HAS_VERDICT).then(pl.col("masked").cast(pl.Int64)).otherwise(0),
        _HAS_VERDICT.cast(pl.Int64),
    ),
)
