"""Percentile bars by group: output tokens per second (latency is a distribution: ``latency``).

One bar per percentile and group (run · model · dialect), each group labelled with its
coverage (how many calls reported the metric). From ``HORIZONTAL_FROM`` groups on the bars lie
down, one labelled row per group, and the figure grows with them instead of squeezing labels.

Example:
    >>> by = ["run", "model"]
    >>> throughput_figure(throughput_summary(run.calls, by), by)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.figures._validation import new_figure, trace
from ngcapture_viz.interop import accepts_pandas
from ngcapture_viz.stats.tokens import THROUGHPUT_SCHEMA

__all__ = [
    "COVERAGE_HOVER",
    "HORIZONTAL_FROM",
    "group_labels",
    "throughput_figure",
]

#: Hover line stating a group's coverage (``customdata`` = reported, calls).
COVERAGE_HOVER: Final = "reported by %{customdata[0]:,} / %{customdata[1]:,} calls"

#: From this many groups on, the percentile bars lie down (one readable row per group).
HORIZONTAL_FROM: Final = 7


def group_labels(table: pl.DataFrame, by: Sequence[str]) -> list[str]:
    """One ``"a · b · c"`` label per row from the group columns (null shown as ``(none)``)."""
    if not by:
        return ["all calls"] * table.height
    parts = [pl.col(c).cast(pl.String).fill_null("(none)") for c in by]
    return table.select(pl.concat_str(parts, separator=" · ")).to_series().to_list()


@accepts_pandas(table=THROUGHPUT_SCHEMA)
def throughput_figure(table: pl.DataFrame, by: Sequence[str]) -> go.Figure:
    """p50 and p95 of output tokens per second per group (``stats.throughput_summary``);
    lying bars from ``HORIZONTAL_FROM`` groups on."""
    horizontal = table.height >= HORIZONTAL_FROM
    labels = _labels_with_coverage(table, by, horizontal=horizontal)
    fig = new_figure()
    for name in ("p50", "p95"):
        fig.add_trace(
            _bar(
                labels,
                table[name].to_list(),
                horizontal=horizontal,
                name=name,
                customdata=_coverage_data(table),
                hovertemplate=_hover(name, "tokens/s", horizontal=horizontal),
            )
        )
    fig.update_layout(
        title={"text": "Output tokens per second; coverage under each group"}, barmode="group"
    )
    _value_axis(fig, "tokens / s", horizontal=horizontal)
    if horizontal:
        fig.update_layout(height=_lying_height(table.height, 2, panels=1))
    return fig


def _bar(labels: list[str], values: list[Any], *, horizontal: bool, **style: Any) -> go.Bar:
    if horizontal:
        return trace(go.Bar, x=values, y=labels, orientation="h", **style)
    return trace(go.Bar, x=labels, y=values, orientation="v", **style)  # explicit: widgets switch


def _hover(name: str, unit: str, *, horizontal: bool) -> str:
    label, value = ("%{y}", "%{x:,.1f}") if horizontal else ("%{x}", "%{y:,.1f}")
    return f"{label}<br>{name} {value} {unit}<br>{COVERAGE_HOVER}<extra></extra>"


def _value_axis(fig: go.Figure, title: str, *, horizontal: bool) -> None:
    if horizontal:
        fig.update_xaxes(title_text=title)
        fig.update_yaxes(autorange="reversed")  # the first group on top, like a table
    else:
        fig.update_yaxes(title_text=title)


def _lying_height(groups: int, bars: int, *, panels: int) -> int:
    return 160 + panels * groups * (bars * 9 + 16)


def _labels_with_coverage(table: pl.DataFrame, by: Sequence[str], *, horizontal: bool) -> list[str]:
    labels = group_labels(table, by)
    if not horizontal:  # under a standing bar: the run on a line of its own, so that
        # neighbouring labels stay apart in a narrow figure
        labels = [label.replace(" · ", "<br>", 1) for label in labels]
    return [
        f"{label}<br>{n:,}/{total:,} reported"
        for label, n, total in zip(labels, table["n_reported"], table["n_calls"], strict=True)
    ]


def _coverage_data(table: pl.DataFrame) -> list[tuple[int, int]]:
    return table.select("n_reported", "n_calls").rows()
