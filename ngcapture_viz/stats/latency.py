"""Latency tables: percentiles of total latency and TTFT per group, and their distribution (ECDF
points) for the curves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import polars as pl

from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.interop import accepts_pandas
from ngcapture_viz.stats._tables import (
    _COVERAGE,
    DEFAULT_BY,
    _check_by,
    _coverage,
    _group,
    _per_metric,
    _sorted,
    _typed,
)

__all__ = [
    "DISTRIBUTION_SCHEMA",
    "LATENCY_METRICS",
    "LATENCY_SCHEMA",
    "PERCENTILES",
    "latency_distribution",
    "latency_percentiles",
]

LATENCY_METRICS: Final = ("latency_total_ms", "latency_ttft_ms")
PERCENTILES: Final = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}

LATENCY_SCHEMA: Final = pl.Schema(
    {
        "metric": pl.String(),
        **_COVERAGE,
        "n_streamed": pl.Int64(),
        "n_reported_streamed": pl.Int64(),
        **dict.fromkeys(PERCENTILES, pl.Float64()),
        "mean": pl.Float64(),
    }
)


@accepts_pandas(calls=CALLS)
def latency_percentiles(calls: pl.DataFrame, by: Sequence[str] = DEFAULT_BY) -> pl.DataFrame:
    """p50/p90/p95/p99 and mean of total latency and TTFT per group, with coverage.

    Percentiles are Polars' ``quantile(q, interpolation="linear")`` over the reported values.
    ``n_streamed`` counts the group's streamed calls and ``n_reported_streamed`` those of them
    that reported the metric (TTFT is only meaningful for streams).

    Example:
        >>> calls = CALLS.from_rows([{"run": "a", "latency_total_ms": 10.0}])  # doctest: +SKIP
        >>> latency_percentiles(calls, by=("run",))["p50"].to_list()  # doctest: +SKIP
        [10.0, None]
    """
    streamed = pl.col("stream").fill_null(False)

    def stats(metric: str) -> list[pl.Expr]:
        value = pl.col(metric)
        return [
            *_coverage(metric),
            streamed.sum().cast(pl.Int64).alias("n_streamed"),
            (value.is_not_null() & streamed).sum().cast(pl.Int64).alias("n_reported_streamed"),
            *(value.quantile(q, interpolation="linear").alias(n) for n, q in PERCENTILES.items()),
            value.mean().alias("mean"),
        ]

    return _per_metric(calls, by, LATENCY_METRICS, stats, LATENCY_SCHEMA)


DISTRIBUTION_SCHEMA: Final = pl.Schema(
    {"metric": pl.String(), "share": pl.Float64(), "value": pl.Float64(), "n_reported": pl.Int64()}
)


@accepts_pandas(calls=CALLS)
def latency_distribution(
    calls: pl.DataFrame, by: Sequence[str] = DEFAULT_BY, *, points: int = 51
) -> pl.DataFrame:
    """The empirical distribution (ECDF) of total latency and TTFT per group, at ``points`` shares.

    One row per group, metric and share ``q`` in ``[0, 1]``: ``value`` is the linear-interpolated
    quantile ``q`` of the reported values (null when the group reported none), so ``share`` of
    the group's reporting calls took at most ``value`` ms. Drawn against each other they are the
    ECDF; the size does not grow with the calls (``points`` rows per group and metric).

    Example:
        >>> latency_distribution(run.calls, ("run",), points=11)  # doctest: +SKIP
    """
    keys = _check_by(calls, by)
    shares = [i / (points - 1) for i in range(points)] if points > 1 else [0.5]
    parts = [
        _typed(_distribution(calls, keys, metric, shares), keys, DISTRIBUTION_SCHEMA)
        for metric in LATENCY_METRICS
    ]
    return _sorted(pl.concat(parts), [*keys, "metric"], metric_order=LATENCY_METRICS)


def _distribution(
    calls: pl.DataFrame, keys: Sequence[str], metric: str, shares: list[float]
) -> pl.DataFrame:
    """One metric's rows of :func:`latency_distribution`: each group's values sorted once,
    then every share read off them with linear interpolation (what ``quantile(q, "linear")``
    computes), for all groups and shares at once in numpy (as Polars expressions it took one
    ``list.get`` pair per share: ~60 ms at 100,000 calls whatever the number of groups)."""
    values = pl.col(metric).drop_nulls().sort().cast(pl.Float64).alias("_sorted")
    # Without keys, all calls are one group (a select alone would not make them a list).
    ordered = _group(calls, keys, [values]) if keys else calls.select(values.implode())
    sizes = ordered["_sorted"].list.len().to_numpy().astype(np.int64)
    # The groups' values end to end (an empty list would explode into a null: left out).
    flat = ordered["_sorted"].filter(pl.Series(sizes > 0)).explode().to_numpy()
    starts = np.cumsum(sizes) - sizes
    position = (sizes.astype(np.float64) - 1)[:, None] * np.asarray(shares)[None, :]
    low = np.floor(position)
    reported = np.repeat(sizes > 0, len(shares))
    value = np.full(position.size, np.nan)
    if flat.size:
        first = starts[:, None]
        below = flat[np.where(sizes[:, None] > 0, first + low.astype(np.int64), 0)]
        above = flat[np.where(sizes[:, None] > 0, first + np.ceil(position).astype(np.int64), 0)]
        value = (below + (above - below) * (position - low)).ravel()
    rows = pl.DataFrame(
        {
            "share": pl.Series(np.tile(shares, len(sizes)), dtype=pl.Float64()),
            "value": pl.Series(value, dtype=pl.Float64()),
            "_reported": pl.Series(reported, dtype=pl.Boolean()),
            "n_reported": pl.Series(np.repeat(sizes, len(shares)), dtype=pl.Int64()),
        }
    ).with_columns(
        pl.lit(metric).alias("metric"), pl.when("_reported").then(pl.col("value")).alias("value")
    )
    if not keys:
        return rows
    groups = ordered.select(keys)[np.repeat(np.arange(len(sizes)), len(shares))]
    return pl.concat([groups, rows], how="horizontal")
