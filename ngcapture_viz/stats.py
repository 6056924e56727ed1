"""Latency, token, throughput and error tables over the calls frame, each with its coverage.

Every table is long: one row per group and metric, with ``n_calls`` (calls in the group),
``n_reported`` (calls that reported the metric) and ``coverage`` (their share). A metric no call
of a group reported has null statistics and coverage 0: unknown is never zero.

Example:
    >>> import ngcapture_viz as ngv  # doctest: +SKIP
    >>> run = ngv.open_run("results/demo/ckpt-100/model-calls")  # doctest: +SKIP
    >>> latency_percentiles(run.calls, by=("model",))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Final

import numpy as np
import polars as pl

from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.interop import accepts_pandas

__all__ = [
    "DEFAULT_BY",
    "LATENCY_METRICS",
    "PERCENTILES",
    "TOKEN_METRICS",
    "calls_over_time",
    "coverage",
    "error_rates",
    "latency_distribution",
    "latency_percentiles",
    "throughput_summary",
    "time_interval",
    "token_histogram",
    "token_summary",
]

DEFAULT_BY: Final = ("run", "model", "dialect")
LATENCY_METRICS: Final = ("latency_total_ms", "latency_ttft_ms")
TOKEN_METRICS: Final = ("tokens_in", "tokens_out", "tokens_reasoning", "cached_tokens")
THROUGHPUT_METRIC: Final = "output_tokens_per_s"
PERCENTILES: Final = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
ANY_ERROR: Final = "any error"

_COVERAGE: Final = {"n_calls": pl.Int64(), "n_reported": pl.Int64(), "coverage": pl.Float64()}
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
ERROR_SCHEMA: Final = pl.Schema(
    {
        "error_category": pl.String(),
        "calls": pl.Int64(),
        "errors": pl.Int64(),
        "rate": pl.Float64(),
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


@accepts_pandas(calls=CALLS)
def error_rates(calls: pl.DataFrame, by: Sequence[str] = ("run",)) -> pl.DataFrame:
    """Failed calls per group and error category, as counts and as a share of the group's calls.

    Each group has one ``"any error"`` row (every failed call; ``errors`` may be 0) and one row
    per error category that occurred in it.

    Example:
        >>> error_rates(run.calls).filter(pl.col("error_category") == "any error")  # doctest: +SKIP
    """
    keys = _check_by(calls, by)
    category = pl.col("error_category").cast(pl.String)
    totals = _group(
        calls, keys, [pl.len().alias("calls"), category.is_not_null().sum().alias("errors")]
    )
    totals = totals.with_columns(pl.lit(ANY_ERROR).alias("error_category"))
    per_category = _group(
        calls.filter(category.is_not_null()).with_columns(category.alias("error_category")),
        [*keys, "error_category"],
        [pl.len().alias("errors")],
    )
    if keys:
        per_category = per_category.join(totals.select(*keys, "calls"), on=keys, nulls_equal=True)
    else:
        per_category = per_category.with_columns(pl.lit(calls.height).alias("calls"))
    rows = pl.concat([_typed(totals, keys, ERROR_SCHEMA), _typed(per_category, keys, ERROR_SCHEMA)])
    rate = pl.when(pl.col("calls") > 0).then(pl.col("errors") / pl.col("calls"))
    rows = rows.with_columns(rate.alias("rate"))
    return _sorted(rows, [*keys, "error_category"])


COVERAGE_SCHEMA: Final = pl.Schema({"metric": pl.String(), **_COVERAGE})


@accepts_pandas(calls=CALLS)
def coverage(
    calls: pl.DataFrame, metrics: Sequence[str] = TOKEN_METRICS, by: Sequence[str] = ("run",)
) -> pl.DataFrame:
    """How many calls of each group reported each metric: ``n_calls``, ``n_reported``, share.

    The counting part of ``token_summary`` (no sums or quantiles), for titles and hovers.

    Example:
        >>> coverage(run.calls, ["tokens_in"])  # doctest: +SKIP
    """
    keys = _check_by(calls, by)
    # One pass for every metric (the widget asks for this on every filter change).
    counts = [pl.col(m).is_not_null().sum().cast(pl.Int64).alias(m) for m in metrics]
    wide = _group(calls, keys, [pl.len().cast(pl.Int64).alias("n_calls"), *counts])
    long = wide.unpivot(
        index=[*keys, "n_calls"], on=list(metrics), variable_name="metric", value_name="n_reported"
    ).with_columns(
        pl.when(pl.col("n_calls") > 0)
        .then(pl.col("n_reported") / pl.col("n_calls"))
        .alias("coverage")
    )
    return _sorted(_typed(long, keys, COVERAGE_SCHEMA), [*keys, "metric"], metric_order=metrics)


def _coverage(metric: str) -> list[pl.Expr]:
    reported = pl.col(metric).is_not_null().sum().cast(pl.Int64)
    return [
        pl.len().cast(pl.Int64).alias("n_calls"),
        reported.alias("n_reported"),
        pl.when(pl.len() > 0).then(reported / pl.len()).alias("coverage"),
    ]


def _per_metric(
    calls: pl.DataFrame,
    by: Sequence[str],
    metrics: Sequence[str],
    stats: Callable[[str], list[pl.Expr]],
    schema: pl.Schema,
) -> pl.DataFrame:
    keys = _check_by(calls, by)
    parts = [
        _typed(
            _group(calls, keys, stats(metric)).with_columns(pl.lit(metric).alias("metric")),
            keys,
            schema,
        )
        for metric in metrics
    ]
    return _sorted(pl.concat(parts), [*keys, "metric"], metric_order=metrics)


def _group(frame: pl.DataFrame, keys: Sequence[str], aggs: Sequence[pl.Expr]) -> pl.DataFrame:
    if keys:
        return frame.group_by(list(keys)).agg(aggs)
    return frame.select(aggs)


def _typed(frame: pl.DataFrame, keys: Sequence[str], schema: pl.Schema) -> pl.DataFrame:
    """Keys first with their own dtypes, then the declared columns (cast; missing ones null)."""
    columns = (
        (pl.col(n) if n in frame.columns else pl.lit(None)).cast(d).alias(n)
        for n, d in schema.items()
    )
    return frame.select(*keys, *columns)


def _sorted(
    frame: pl.DataFrame, keys: Sequence[str], *, metric_order: Sequence[str] = ()
) -> pl.DataFrame:
    """Stable, readable row order: keys as text (nulls last), metrics in declaration order."""
    exprs: list[pl.Expr] = []
    for key in keys:
        if key == "metric" and metric_order:
            order = {m: i for i, m in enumerate(metric_order)}
            exprs.append(pl.col(key).replace_strict(order, return_dtype=pl.Int64()))
        else:
            exprs.append(pl.col(key).cast(pl.String))
    if not exprs:
        return frame
    return frame.sort(exprs, nulls_last=True, maintain_order=True)


def _check_by(calls: pl.DataFrame, by: Sequence[str]) -> list[str]:
    if isinstance(by, str):
        by = (by,)
    unknown = [c for c in by if c not in calls.columns]
    if unknown:
        raise ValueError(
            f"unknown calls column(s) {unknown} in by=; valid columns: {calls.columns}"
        )
    return list(by)


HISTOGRAM_SCHEMA: Final = pl.Schema(
    {
        "run": pl.String(),
        "metric": pl.String(),
        "bin_start": pl.Float64(),
        "bin_end": pl.Float64(),
        "count": pl.Int64(),
    }
)
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
def token_histogram(
    calls: pl.DataFrame, metrics: Sequence[str] = TOKEN_METRICS, *, bins: int = 40
) -> pl.DataFrame:
    """Counts of reported values per run, metric and bin (bins shared by every run of a metric).

    Bins are ``[bin_start, bin_end)`` with a whole-number width of at least 1; calls that did
    not report the metric are in no bin (their number is the coverage gap, not a zero bin).

    Example:
        >>> token_histogram(run.calls, ("tokens_out",), bins=20)  # doctest: +SKIP
    """
    parts = []
    for metric in metrics:
        values = calls.select(pl.col("run").cast(pl.String), pl.col(metric)).drop_nulls(metric)
        if values.height == 0:
            continue
        lo, hi = _number(values[metric].min()), _number(values[metric].max())
        width = max(1, -(-int(hi - lo + 1) // bins))
        index = ((pl.col(metric) - lo) // width).cast(pl.Int64)
        counted = values.group_by("run", index.alias("bin")).agg(pl.len().alias("count"))
        parts.append(
            counted.select(
                "run",
                pl.lit(metric).alias("metric"),
                (pl.col("bin") * width + lo).alias("bin_start"),
                ((pl.col("bin") + 1) * width + lo).alias("bin_end"),
                "count",
            ).cast(HISTOGRAM_SCHEMA)
        )
    if not parts:
        return pl.DataFrame(schema=HISTOGRAM_SCHEMA)
    order = {m: i for i, m in enumerate(metrics)}
    rows = pl.concat(parts)
    return rows.sort("run", pl.col("metric").replace_strict(order), "bin_start")


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


def _number(value: object) -> float:
    if not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return value
