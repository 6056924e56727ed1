"""What every stats table shares: the default ``by``, the coverage columns, and how a table is
grouped by ``by`` (checked against the calls' columns), typed to its schema and sorted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import polars as pl

__all__ = ["DEFAULT_BY"]

DEFAULT_BY: Final = ("run", "model", "dialect")

_COVERAGE: Final = {"n_calls": pl.Int64(), "n_reported": pl.Int64(), "coverage": pl.Float64()}


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
