"""Shares of a group's calls: the calls that failed, per error category (error rates), and the
calls that reported each metric (coverage)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import polars as pl

from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.interop import accepts_pandas
from ngcapture_viz.stats._tables import _COVERAGE, _check_by, _group, _sorted, _typed
from ngcapture_viz.stats.tokens import TOKEN_METRICS

__all__ = ["ANY_ERROR", "COVERAGE_SCHEMA", "ERROR_SCHEMA", "coverage", "error_rates"]

ANY_ERROR: Final = "any error"

ERROR_SCHEMA: Final = pl.Schema(
    {
        "error_category": pl.String(),
        "calls": pl.Int64(),
        "errors": pl.Int64(),
        "rate": pl.Float64(),
    }
)


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
