"""Token histograms: counts of reported values per run, metric and bin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import polars as pl

from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.interop import accepts_pandas
from ngcapture_viz.stats.tokens import TOKEN_METRICS

__all__ = ["HISTOGRAM_SCHEMA", "token_histogram"]

HISTOGRAM_SCHEMA: Final = pl.Schema(
    {
        "run": pl.String(),
        "metric": pl.String(),
        "bin_start": pl.Float64(),
        "bin_end": pl.Float64(),
        "count": pl.Int64(),
    }
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


def _number(value: object) -> float:
    if not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return value
