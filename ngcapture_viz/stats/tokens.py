"""Token tables: sum, mean and percentiles of each token count per group, and output tokens per
second (throughput)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import polars as pl

from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.interop import accepts_pandas
from ngcapture_viz.stats._tables import _COVERAGE, DEFAULT_BY, _coverage, _per_metric

__all__ = [
    "THROUGHPUT_METRIC",
    "THROUGHPUT_SCHEMA",
    "TOKEN_METRICS",
    "TOKEN_SCHEMA",
    "throughput_summary",
    "token_summary",
]

TOKEN_METRICS: Final = ("tokens_in", "tokens_out", "tokens_reasoning", "cached_tokens")
THROUGHPUT_METRIC: Final = "output_tokens_per_s"

TOKEN_SCHEMA: Final = pl.Schema(
    {
        "metric": pl.String(),
        **_COVERAGE,
        "sum": pl.Int64(),
        "mean": pl.Float64(),
        "p50": pl.Float64(),
        "p95": pl.Float64(),
    }
)
THROUGHPUT_SCHEMA: Final = pl.Schema(
    {
        "metric": pl.String(),
        **_COVERAGE,
        "p50": pl.Float64(),
        "p95": pl.Float64(),
        "mean": pl.Float64(),
    }
)


@accepts_pandas(calls=CALLS)
def token_summary(calls: pl.DataFrame, by: Sequence[str] = DEFAULT_BY) -> pl.DataFrame:
    """Sum, mean, p50 and p95 of each token count per group, over reported values only.

    A group in which no call reported a count gets a null ``sum`` (not 0) and coverage 0.

    Example:
        >>> token_summary(run.calls, by=("run",))  # doctest: +SKIP
    """

    def stats(metric: str) -> list[pl.Expr]:
        value = pl.col(metric)
        reported = value.is_not_null().any()
        return [
            *_coverage(metric),
            pl.when(reported).then(value.sum()).alias("sum"),
            value.mean().alias("mean"),
            value.quantile(0.5, interpolation="linear").alias("p50"),
            value.quantile(0.95, interpolation="linear").alias("p95"),
        ]

    return _per_metric(calls, by, TOKEN_METRICS, stats, TOKEN_SCHEMA)


@accepts_pandas(calls=CALLS)
def throughput_summary(calls: pl.DataFrame, by: Sequence[str] = DEFAULT_BY) -> pl.DataFrame:
    """p50, p95 and mean of ``output_tokens_per_s`` per group, with coverage.

    Example:
        >>> throughput_summary(run.calls, by=("model",))  # doctest: +SKIP
    """

    def stats(metric: str) -> list[pl.Expr]:
        value = pl.col(metric)
        return [
            *_coverage(metric),
            value.quantile(0.5, interpolation="linear").alias("p50"),
            value.quantile(0.95, interpolation="linear").alias("p95"),
            value.mean().alias("mean"),
        ]

    return _per_metric(calls, by, (THROUGHPUT_METRIC,), stats, THROUGHPUT_SCHEMA)
