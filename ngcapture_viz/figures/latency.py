"""Latency and TTFT as distributions: one ECDF per group, its percentiles marked on it.

A curve per group (run · model · dialect) shows which share of the calls that reported the
metric took at most x ms; the p50, p90, p95 and p99 of ``stats.latency_percentiles`` sit on it
as marks. Each run keeps its colour; the groups of one run differ by dash. Nothing is drawn
per call: the curves come from ``stats.latency_distribution`` (a fixed number of points).

Example:
    >>> by = ["run", "model"]
    >>> latency_figure(latency_percentiles(calls, by), by,  # doctest: +SKIP
    ...                distribution=latency_distribution(calls, by))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.figures._validation import subplots, trace
from ngcapture_viz.figures.bars import group_labels
from ngcapture_viz.figures.style import DASHES, run_colors
from ngcapture_viz.interop import accepts_pandas
from ngcapture_viz.stats.latency import (
    DISTRIBUTION_SCHEMA,
    LATENCY_METRICS,
    LATENCY_SCHEMA,
    PERCENTILES,
)

__all__ = ["LOG_FROM", "latency_figure"]

#: A panel's x axis turns logarithmic when its largest value is this many times its smallest.
LOG_FROM: Final = 30.0
_PANEL_TITLES: Final = {
    "latency_total_ms": "latency_total_ms: share of calls that took at most x ms",
    "latency_ttft_ms": "latency_ttft_ms: time to the first token",
}


#: Layout in pixels: above the plots (title, subtitle, first panel title), the two panels and
#: the space between them, below them to the legend (ticks and the axis title), a legend row.
_TOP_PX: Final = 130
_PLOTS_PX: Final = 430
_LEGEND_DROP_PX: Final = 70
_LEGEND_ROW_PX: Final = 21


@accepts_pandas(table=LATENCY_SCHEMA, distribution=DISTRIBUTION_SCHEMA)
def latency_figure(
    table: pl.DataFrame, by: Sequence[str], *, distribution: pl.DataFrame | None = None
) -> go.Figure:
    """ECDF of total latency and TTFT per group with its percentiles marked.

    Args:
        table: ``stats.latency_percentiles(calls, by)``: the marks (and coverage).
        by: the group columns of both tables.
        distribution: ``stats.latency_distribution(calls, by)``: the curves (none: marks only).

    Traces, per panel and group in table order: the curve (when ``distribution`` is given),
    then the marks (``x`` = p50, p90, p95, p99; ``y`` = 0.5, 0.9, 0.95, 0.99).
    """
    fig = subplots(
        rows=2,
        cols=1,
        subplot_titles=[_PANEL_TITLES[m] for m in LATENCY_METRICS],
        vertical_spacing=0.22,
    )
    runs = table["run"].cast(pl.String).unique(maintain_order=True).to_list() if "run" in by else []
    colors = run_colors(runs)
    curves = _curves(distribution, by)
    for row, metric in enumerate(LATENCY_METRICS, start=1):
        rows = table.filter(pl.col("metric") == metric)
        labels = group_labels(rows, by)
        seen: dict[str, int] = {}
        values: list[float] = []
        for label, group in zip(labels, rows.iter_rows(named=True), strict=True):
            run = str(group["run"]) if "run" in by else ""
            dash = DASHES[seen.get(run, 0) % len(DASHES)]
            seen[run] = seen.get(run, 0) + 1
            color = colors.get(run, "#636efa")
            name = f"{label} · {group['n_reported']:,}/{group['n_calls']:,} reported"
            curve = curves.get((label, metric))
            if distribution is not None:
                xs = curve[0] if curve else []
                ys = curve[1] if curve else []
                values += [x for x in xs if x is not None]
                fig.add_trace(
                    trace(
                        go.Scatter,
                        x=xs,
                        y=ys,
                        mode="lines",
                        line={"color": color, "dash": dash, "width": 2},
                        name=name,
                        legendgroup=label,
                        showlegend=row == 1,
                        hovertemplate=f"{label}<br>%{{y:.0%}} of calls ≤ %{{x:,.1f}} ms"
                        "<extra></extra>",
                        meta={"kind": "ecdf", "group": label, "metric": metric},
                    ),
                    row=row,
                    col=1,
                )
            marks = [group[p] for p in PERCENTILES]
            values += [x for x in marks if x is not None]
            fig.add_trace(
                trace(
                    go.Scatter,
                    x=marks,
                    y=list(PERCENTILES.values()),
                    mode="markers",
                    marker={"color": color, "size": 8, "symbol": "diamond"},
                    name=f"{name} (p50/p90/p95/p99)",
                    legendgroup=label,
                    showlegend=distribution is None and row == 1,
                    text=list(PERCENTILES),
                    customdata=[[group["n_reported"], group["n_calls"]]] * len(PERCENTILES),
                    hovertemplate=f"{label}<br>%{{text}} %{{x:,.1f}} ms<br>"
                    "reported by %{customdata[0]:,} / %{customdata[1]:,} calls<extra></extra>",
                    meta={"kind": "percentiles", "group": label, "metric": metric},
                ),
                row=row,
                col=1,
            )
        positive = [v for v in values if v > 0]
        if positive and max(positive) / min(positive) >= LOG_FROM:
            # Labels at 1, 2 and 5 of each decade: all nine crowd a narrow decade (9 ran into 1000).
            fig.update_xaxes(type="log", dtick="D2", row=row, col=1)
        fig.update_yaxes(title_text="share of calls", tickformat=".0%", range=[0, 1.02], row=row)
    # One x title, under the lower panel: the upper one's ran into the lower panel's title.
    fig.update_xaxes(title_text="ms", row=len(LATENCY_METRICS), col=1)
    # The legend (a line per group) below the plots, the figure growing with it: a fixed height
    # squeezed the plots and let the legend run over the axis title and off the figure.
    groups = max(1, table.filter(pl.col("metric") == LATENCY_METRICS[0]).height)
    legend_px = _LEGEND_ROW_PX * groups
    fig.update_layout(
        title={
            "text": "Latency distribution per " + " · ".join(by or ["call"]),
            "subtitle": {"text": "curve: ECDF of the calls that reported it; ◆ p50 p90 p95 p99"},
        },
        height=_TOP_PX + _PLOTS_PX + _LEGEND_DROP_PX + legend_px + 10,
        margin={"t": _TOP_PX, "b": _LEGEND_DROP_PX + legend_px + 10},
        legend={
            "orientation": "h",
            "yanchor": "top",
            "y": -_LEGEND_DROP_PX / _PLOTS_PX,
            "x": 0,
            "tracegroupgap": 0,
        },
    )
    return fig


def _curves(
    distribution: pl.DataFrame | None, by: Sequence[str]
) -> dict[tuple[str, str], tuple[list[float | None], list[float]]]:
    """``(group label, metric) -> (values, shares)`` of the distribution table."""
    if distribution is None or distribution.height == 0:
        return {}
    labelled = distribution.with_columns(
        pl.Series("_label", group_labels(distribution, by), dtype=pl.String)
    ).filter(pl.col("value").is_not_null())
    return {
        (str(label), str(metric)): (part["value"].to_list(), part["share"].to_list())
        for (label, metric), part in labelled.group_by("_label", "metric", maintain_order=True)
    }
