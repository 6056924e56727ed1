"""Calls over time: calls and reported tokens per run and time bucket of ``started_at``, and the
round interval that cuts a run's span into few enough buckets."""

from __future__ import annotations

from datetime import datetime
from typing import Final

import polars as pl

from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.interop import accepts_pandas
from ngcapture_viz.stats._tables import _typed

__all__ = ["OVER_TIME_SCHEMA", "calls_over_time", "time_interval"]

OVER_TIME_SCHEMA: Final = pl.Schema(
    {
        "run": pl.String(),
        "bucket": pl.Datetime("us", "UTC"),
        "calls": pl.Int64(),
        "tokens_total": pl.Int64(),
        "tokens_reported": pl.Int64(),
    }
)
_INTERVALS: Final = (
    ("10ms", 0.01),
    ("50ms", 0.05),
    ("100ms", 0.1),
    ("500ms", 0.5),
    ("1s", 1),
    ("5s", 5),
    ("10s", 10),
    ("30s", 30),
    ("1m", 60),
    ("5m", 300),
    ("15m", 900),
    ("1h", 3600),
    ("6h", 21_600),
    ("1d", 86_400),
    ("7d", 604_800),
)


@accepts_pandas(calls=CALLS)
def time_interval(calls: pl.DataFrame, *, max_buckets: int = 240) -> str:
    """The shortest round interval that cuts the span of ``started_at`` into few enough buckets."""
    first, last = calls["started_at"].min(), calls["started_at"].max()
    if not isinstance(first, datetime) or not isinstance(last, datetime):
        return _INTERVALS[0][0]
    span = (last - first).total_seconds()
    for name, seconds in _INTERVALS:
        if span / seconds <= max_buckets:
            return name
    return _INTERVALS[-1][0]


@accepts_pandas(calls=CALLS)
def calls_over_time(calls: pl.DataFrame, *, interval: str | None = None) -> pl.DataFrame:
    """Calls and reported total tokens per run and time bucket of ``started_at``.

    ``tokens_total`` sums what was reported in the bucket and is null when no call in it
    reported tokens; ``tokens_reported`` says how many did.

    Example:
        >>> calls_over_time(run.calls, interval="1m")  # doctest: +SKIP
    """
    interval = interval or time_interval(calls)
    tokens = pl.col("tokens_total")
    rows = (
        calls.filter(pl.col("started_at").is_not_null())
        .group_by(
            pl.col("run").cast(pl.String),
            pl.col("started_at").dt.truncate(interval).alias("bucket"),
        )
        .agg(
            pl.len().alias("calls"),
            pl.when(tokens.is_not_null().any()).then(tokens.sum()).alias("tokens_total"),
            tokens.is_not_null().sum().alias("tokens_reported"),
        )
    )
    return _typed(rows, [], OVER_TIME_SCHEMA).sort("run", "bucket")
