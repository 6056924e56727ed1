"""Calls and tokens over time, and error rates by category.

Over time: one line per run over its time buckets; a bucket in which no call of the run
started is a gap in its line, never a segment drawn across the idle time. Errors: the share of
each run's calls per error category (``client_disconnected`` included: an abandoned call is a
failure); with no error at all the panel says so on a 0–5 % axis.

Example:
    >>> calls_over_time_figure(calls_over_time(calls), ["a"])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.figures._validation import new_figure, subplots, trace
from ngcapture_viz.figures.bars import COVERAGE_HOVER
from ngcapture_viz.figures.style import run_colors
from ngcapture_viz.interop import accepts_pandas
from ngcapture_viz.stats.over_time import OVER_TIME_SCHEMA
from ngcapture_viz.stats.rates import ANY_ERROR, ERROR_SCHEMA

__all__ = ["calls_over_time_figure", "error_figure", "with_gaps"]


def with_gaps(rows: pl.DataFrame, interval: str | None) -> pl.DataFrame:
    """``rows`` (one run's buckets) with a null row for every bucket in between with no call."""
    if rows.height < 2 or interval is None:
        return rows
    first, last = rows["bucket"].min(), rows["bucket"].max()
    if not isinstance(first, datetime) or not isinstance(last, datetime):
        return rows
    buckets = pl.datetime_range(first, last, interval, time_unit="us", time_zone="UTC", eager=True)
    if buckets.len() > 20_000:  # a few active spells far apart: mark only the idle edges
        return rows
    full = pl.DataFrame({"bucket": buckets}).cast({"bucket": rows.schema["bucket"]})
    return full.join(rows, on="bucket", how="left", maintain_order="left")


@accepts_pandas(table=OVER_TIME_SCHEMA)
def calls_over_time_figure(
    table: pl.DataFrame, runs: Sequence[str], *, interval: str | None = None
) -> go.Figure:
    """Calls and reported total tokens per time bucket, one line per run (``calls_over_time``).

    Args:
        table: ``stats.calls_over_time`` output.
        runs: run labels, in order (one trace each in both panels, even when empty).
        interval: the table's bucket width (``"1s"``...): buckets without calls become gaps.
    """
    fig = subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
        subplot_titles=("calls started", "tokens_total reported (sum; gap: none reported)"),
    )
    colors = run_colors(runs)
    for run in runs:
        rows = with_gaps(table.filter(pl.col("run") == run).drop("run"), interval)
        x = rows["bucket"].to_list()
        fig.add_trace(
            trace(
                go.Scatter,
                x=x,
                y=rows["calls"].to_list(),
                name=run,
                legendgroup=run,
                mode="lines+markers",
                line_color=colors[run],
                connectgaps=False,
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            trace(
                go.Scatter,
                x=x,
                y=rows["tokens_total"].to_list(),
                name=run,
                legendgroup=run,
                showlegend=False,
                mode="lines+markers",
                line_color=colors[run],
                connectgaps=False,
                customdata=rows.select("tokens_reported", "calls").rows(),
                hovertemplate="%{x}<br>%{y:,} tokens<br>"
                + COVERAGE_HOVER
                + f"<extra>{run}</extra>",
            ),
            row=2,
            col=1,
        )
    every = f" every {interval}" if interval else ""
    fig.update_layout(
        title={
            "text": "Calls and tokens over time",
            "subtitle": {"text": f"bucketed by start time{every}; no line where no call started"},
        },
        height=520,
        margin={"t": 100},
    )
    fig.update_yaxes(rangemode="tozero")
    # The first time label sits at the corner; off the axis line, it clears the y axis' "0".
    fig.update_xaxes(ticklabelstandoff=6)
    return fig


@accepts_pandas(table=ERROR_SCHEMA)
def error_figure(table: pl.DataFrame, runs: Sequence[str]) -> go.Figure:
    """Share of each run's calls that failed, by error category (``stats.error_rates``)."""
    categories = [ANY_ERROR, *sorted(set(table["error_category"]) - {ANY_ERROR})]
    fig = new_figure()
    colors = run_colors(runs)
    for run in runs:
        rows = table.filter(pl.col("run").cast(pl.String) == run)
        by_category = {r["error_category"]: r for r in rows.iter_rows(named=True)}
        present = [c for c in categories if c in by_category]
        fig.add_trace(
            trace(
                go.Bar,
                x=present,
                y=[by_category[c]["rate"] for c in present],
                name=run,
                marker_color=colors[run],
                customdata=[[by_category[c]["errors"], by_category[c]["calls"]] for c in present],
                hovertemplate="%{x}: %{y:.2%}<br>%{customdata[0]:,} of %{customdata[1]:,} calls"
                f"<extra>{run}</extra>",
            )
        )
    rates = [r for r in table["rate"].to_list() if r is not None]
    axis: dict[str, Any] = {
        "tickformat": ".1%",
        "rangemode": "tozero",
        "title": {"text": "share of calls"},
    }
    if not rates or max(rates) == 0:
        calls = int(table.filter(pl.col("error_category") == ANY_ERROR)["calls"].sum())
        axis["range"] = [0, 0.05]
        fig.add_annotation(
            text=f"no errors in {calls:,} calls",
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.6,
            showarrow=False,
            font={"size": 14},
            name="no-errors",
        )
    fig.update_layout(
        title={"text": "Error rate by category", "subtitle": {"text": "share of each run's calls"}},
        barmode="group",
        yaxis=axis,
        xaxis={"categoryorder": "array", "categoryarray": categories},
        margin={"t": 100},
    )
    return fig
