"""Token counts per call (in, out, reasoning, cached): pre-binned histograms, one trace per run.

A metric whose reported values are all the same (often: every call reported 0 reasoning
tokens) draws no bar: its panel says "all N" instead, since a single one-wide bar would fill
the axis and read as a distribution.

Example:
    >>> token_figure(token_histogram(calls), coverage(calls), ["a"])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.figures._validation import subplots, trace
from ngcapture_viz.figures.style import run_colors
from ngcapture_viz.interop import accepts_pandas
from ngcapture_viz.stats.histogram import HISTOGRAM_SCHEMA
from ngcapture_viz.stats.rates import COVERAGE_SCHEMA
from ngcapture_viz.stats.tokens import TOKEN_METRICS

__all__ = ["constant_value", "token_figure"]


def constant_value(histogram: pl.DataFrame, metric: str) -> float | None:
    """The one value every reporting call had for ``metric``, or None when they differ.

    Counts are whole numbers, so the histogram of a constant is one bin of width 1.
    """
    rows = histogram.filter(pl.col("metric") == metric)
    starts = rows["bin_start"].unique()
    if starts.len() != 1:
        return None
    if (rows["bin_end"] - rows["bin_start"]).max() != 1:
        return None
    value = starts[0]
    return float(value) if value is not None else None


@accepts_pandas(histogram=HISTOGRAM_SCHEMA, coverage=COVERAGE_SCHEMA)
def token_figure(histogram: pl.DataFrame, coverage: pl.DataFrame, runs: Sequence[str]) -> go.Figure:
    """Token distributions (in, out, reasoning, cached), pre-binned, one bar trace per run.

    Args:
        histogram: ``stats.token_histogram`` output.
        coverage: ``stats.coverage(calls)`` (or ``token_summary(calls, ["run"])``): counts of
            the calls that reported each metric, per run (titles and hover).
        runs: run labels, in order: every run gets a trace in every panel, even an empty one.
    """
    totals = coverage.group_by("metric").agg(pl.col("n_reported").sum(), pl.col("n_calls").sum())
    reported = {r["metric"]: (r["n_reported"], r["n_calls"]) for r in totals.iter_rows(named=True)}
    titles = [
        f"{m}<br><sup>{reported.get(m, (0, 0))[0]:,}/{reported.get(m, (0, 0))[1]:,} reported</sup>"
        for m in TOKEN_METRICS
    ]
    fig = subplots(
        rows=2,
        cols=2,
        subplot_titles=titles,
        vertical_spacing=0.22,
        horizontal_spacing=0.12,
    )
    per_run = {
        (str(r["run"]), r["metric"]): (r["n_reported"], r["n_calls"])
        for r in coverage.iter_rows(named=True)
    }
    colors = run_colors(runs)
    for i, metric in enumerate(TOKEN_METRICS):
        row, col = i // 2 + 1, i % 2 + 1
        constant = constant_value(histogram, metric)
        rows = histogram.filter(pl.col("metric") == metric)
        for run in runs:
            bins = rows.filter(pl.col("run") == run) if constant is None else rows.clear()
            n, total = per_run.get((run, metric), (0, 0))
            fig.add_trace(
                trace(
                    go.Bar,
                    x=bins["bin_start"].to_list(),
                    y=bins["count"].to_list(),
                    width=(bins["bin_end"] - bins["bin_start"]).to_list(),
                    customdata=bins["bin_end"].to_list(),
                    offset=0,
                    name=run,
                    legendgroup=run,
                    showlegend=i == 0,
                    marker_color=colors[run],
                    opacity=0.65 if len(runs) > 1 else 1.0,
                    hovertemplate=(
                        f"{run}<br>{metric} %{{x}}–%{{customdata}}<br>%{{y:,}} calls"
                        f"<br>run: reported by {n:,} / {total:,} calls<extra></extra>"
                    ),
                ),
                row=row,
                col=col,
            )
        if constant is not None or rows.height == 0:
            text = (
                "no call reported it"
                if constant is None
                else f"all {constant:,.0f}<br>(every call that reported it)"
            )
            axis = "" if i == 0 else str(i + 1)
            fig.add_annotation(
                text=text,
                xref=f"x{axis} domain",
                yref=f"y{axis} domain",
                x=0.5,
                y=0.5,
                showarrow=False,
                font={"size": 13},
                name=f"constant:{metric}",
            )
            fig.update_xaxes(visible=False, row=row, col=col)
            fig.update_yaxes(visible=False, row=row, col=col)
        else:
            fig.update_yaxes(title_text="calls", row=row, col=col)
    fig.update_layout(
        title={
            "text": "Token counts per call",
            "subtitle": {"text": "calls that did not report a count are in no bin"},
        },
        barmode="overlay",
        bargap=0,
        height=620,
        margin={"t": 140},
        legend={"orientation": "h", "yanchor": "top", "y": -0.08, "x": 0},
    )
    return fig
