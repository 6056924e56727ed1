"""The token and latency dashboard: static Plotly figures beside the tables they plot.

Every figure is drawn from an aggregate computed in Polars (pre-binned histograms, percentile
tables, time buckets), so a run of 100,000 calls draws as fast as one of 100. The only per-item
figure, reward against per-rollout totals, uses WebGL and samples above ``max_points``.
Every metric states its coverage: how many calls reported it. Unknown is not zero.

Example:
    >>> import ngcapture_viz as ngv  # doctest: +SKIP
    >>> dash = ngv.dashboard(ngv.open_run("results/demo/ckpt-100/model-calls"))  # doctest: +SKIP
    >>> dash.figures["latency"]  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import plotly
import plotly.colors
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from ngcapture_viz.display.figure import Figure
from ngcapture_viz.figures.bars import (
    COVERAGE_HOVER,
    HORIZONTAL_FROM,
    group_labels,
    latency_figure,
    throughput_figure,
)
from ngcapture_viz.run import CaptureRun, stack_runs
from ngcapture_viz.stats import (
    ANY_ERROR,
    DEFAULT_BY,
    TOKEN_METRICS,
    calls_over_time,
    error_rates,
    latency_percentiles,
    throughput_summary,
    time_interval,
    token_histogram,
    token_summary,
)

__all__ = [
    "HORIZONTAL_FROM",
    "Dashboard",
    "calls_over_time_figure",
    "dashboard",
    "error_figure",
    "group_labels",
    "latency_figure",
    "reward_figure",
    "run_colors",
    "throughput_figure",
    "token_figure",
]

REWARD_METRICS: Final = ("tokens_total", "latency_total_ms", "num_calls")


@dataclass(frozen=True)
class Dashboard:
    """Figures and the tables they were drawn from.

    Attributes:
        figures: ``tokens``, ``latency``, ``throughput``, ``over_time``, ``errors``, ``reward``.
        tables: ``latency``, ``tokens``, ``throughput``, ``errors``, ``token_histogram``,
            ``over_time`` (see ``ngcapture_viz.stats``).
    """

    figures: dict[str, go.Figure] = field(default_factory=dict)
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<Dashboard: figures {list(self.figures)}; tables {list(self.tables)}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from ngcapture_viz.display.cards import dashboard_html, html_bundle

        return html_bundle(repr(self), lambda js: dashboard_html(self, plotlyjs=js))

    def _repr_html_(self) -> str:
        return self._repr_mimebundle_()["text/html"]


def dashboard(
    run_or_runs: CaptureRun | Sequence[CaptureRun], *, max_points: int = 20_000
) -> Dashboard:
    """Build every dashboard figure and table for one run, a stack, or a list of runs.

    Args:
        run_or_runs: a ``CaptureRun`` (single or stacked) or a list of them (stacked here).
        max_points: the most points any one trace may hold (rollouts are sampled above it).

    Example:
        >>> dash = dashboard([run_a, run_b])  # doctest: +SKIP
        >>> dash.tables["latency"].filter(pl.col("metric") == "latency_ttft_ms")  # doctest: +SKIP
    """
    run = run_or_runs if isinstance(run_or_runs, CaptureRun) else stack_runs(list(run_or_runs))
    calls, runs = run.calls, run.labels
    by = [c for c in DEFAULT_BY if c in calls.columns]
    tables = {
        "latency": latency_percentiles(calls, by),
        "tokens": token_summary(calls, by),
        "throughput": throughput_summary(calls, by),
        "errors": error_rates(calls, ("run",)),
        "token_histogram": token_histogram(calls),
        "over_time": calls_over_time(calls, interval=time_interval(calls)),
    }
    figures = {
        "tokens": token_figure(tables["token_histogram"], token_summary(calls, ("run",)), runs),
        "latency": latency_figure(tables["latency"], by),
        "throughput": throughput_figure(tables["throughput"], by),
        "over_time": calls_over_time_figure(tables["over_time"], runs),
        "errors": error_figure(tables["errors"], runs),
        "reward": reward_figure(run.rollouts, runs, max_points=max_points),
    }
    return Dashboard(figures=figures, tables=tables)


def token_figure(histogram: pl.DataFrame, coverage: pl.DataFrame, runs: Sequence[str]) -> go.Figure:
    """Token distributions (in, out, reasoning, cached), pre-binned, one bar trace per run.

    Args:
        histogram: ``stats.token_histogram`` output.
        coverage: ``stats.token_summary(calls, ("run",))`` output (titles and hover).
        runs: run labels, in order: every run gets a trace in every panel, even an empty one.
    """
    totals = coverage.group_by("metric").agg(pl.col("n_reported").sum(), pl.col("n_calls").sum())
    reported = {r["metric"]: (r["n_reported"], r["n_calls"]) for r in totals.iter_rows(named=True)}
    titles = [
        f"{m} (reported by {reported.get(m, (0, 0))[0]:,} / {reported.get(m, (0, 0))[1]:,} calls)"
        for m in TOKEN_METRICS
    ]
    fig = make_subplots(figure=Figure(), rows=2, cols=2, subplot_titles=titles)
    per_run = {
        (str(r["run"]), r["metric"]): (r["n_reported"], r["n_calls"])
        for r in coverage.iter_rows(named=True)
    }
    colors = run_colors(runs)
    for i, metric in enumerate(TOKEN_METRICS):
        rows = histogram.filter(pl.col("metric") == metric)
        for run in runs:
            bins = rows.filter(pl.col("run") == run)
            n, total = per_run.get((run, metric), (0, 0))
            fig.add_trace(
                go.Bar(
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
                row=i // 2 + 1,
                col=i % 2 + 1,
            )
    fig.update_layout(
        title="Token counts per call (calls that did not report a count are in no bin)",
        barmode="overlay",
        bargap=0,
    )
    fig.update_yaxes(title_text="calls")
    return fig


def run_colors(runs: Sequence[str]) -> dict[str, str]:
    """One colour per run, the same in every panel and figure of a dashboard."""
    palette = plotly.colors.qualitative.Plotly
    return {run: palette[n % len(palette)] for n, run in enumerate(runs)}


def calls_over_time_figure(table: pl.DataFrame, runs: Sequence[str]) -> go.Figure:
    """Calls and reported total tokens per time bucket, one line per run (``calls_over_time``)."""
    fig = make_subplots(
        figure=Figure(),
        rows=2,
        cols=1,
        shared_xaxes=True,
        subplot_titles=("calls started", "tokens_total reported (sum; gap: none reported)"),
    )
    colors = run_colors(runs)
    for run in runs:
        rows = table.filter(pl.col("run") == run)
        x = rows["bucket"].to_list()
        fig.add_trace(
            go.Scatter(
                x=x,
                y=rows["calls"].to_list(),
                name=run,
                legendgroup=run,
                mode="lines+markers",
                line_color=colors[run],
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=rows["tokens_total"].to_list(),
                name=run,
                legendgroup=run,
                showlegend=False,
                mode="lines+markers",
                line_color=colors[run],
                customdata=rows.select("tokens_reported", "calls").rows(),
                hovertemplate="%{x}<br>%{y:,} tokens<br>"
                + COVERAGE_HOVER
                + f"<extra>{run}</extra>",
            ),
            row=2,
            col=1,
        )
    fig.update_layout(title="Calls and tokens over time (bucketed by start time)")
    return fig


def error_figure(table: pl.DataFrame, runs: Sequence[str]) -> go.Figure:
    """Share of each run's calls that failed, by error category (``stats.error_rates``)."""
    categories = [ANY_ERROR, *sorted(set(table["error_category"]) - {ANY_ERROR})]
    fig = Figure()
    for run in runs:
        rows = table.filter(pl.col("run").cast(pl.String) == run)
        by_category = {r["error_category"]: r for r in rows.iter_rows(named=True)}
        present = [c for c in categories if c in by_category]
        fig.add_trace(
            go.Bar(
                x=present,
                y=[by_category[c]["rate"] for c in present],
                name=run,
                marker_color=run_colors(runs)[run],
                customdata=[[by_category[c]["errors"], by_category[c]["calls"]] for c in present],
                hovertemplate="%{x}: %{y:.2%}<br>%{customdata[0]:,} of %{customdata[1]:,} calls"
                f"<extra>{run}</extra>",
            )
        )
    fig.update_layout(
        title="Error rate by category (share of each run's calls)",
        barmode="group",
        yaxis_tickformat=".1%",
        xaxis={"categoryorder": "array", "categoryarray": categories},
    )
    return fig


def reward_figure(
    rollouts: pl.DataFrame, runs: Sequence[str], *, max_points: int = 20_000
) -> go.Figure:
    """Per-rollout totals (tokens, latency, calls) against reward; WebGL, sampled above a cap.

    Rollouts with no reward or no reported total are left out; each panel title says how many
    rollouts it shows of how many there are. A line per run gives the mean reward of each
    tenth of its rollouts ordered by the total (computed over all of them, never sampled).
    """
    budget = max(1, max_points // max(1, len(runs)))
    titles = []
    for metric in REWARD_METRICS:
        known = rollouts.filter(pl.col("reward").is_not_null() & pl.col(metric).is_not_null())
        titles.append(f"{metric} ({known.height:,} / {rollouts.height:,} rollouts known)")
    fig = make_subplots(
        figure=Figure(), rows=1, cols=len(REWARD_METRICS), subplot_titles=titles, shared_yaxes=True
    )
    was_sampled = False
    colors = run_colors(runs)
    for col, metric in enumerate(REWARD_METRICS, start=1):
        for run in runs:
            known = rollouts.filter(
                (pl.col("run").cast(pl.String) == run)
                & pl.col("reward").is_not_null()
                & pl.col(metric).is_not_null()
            )
            was_sampled = was_sampled or known.height > budget
            shown = known.sample(n=budget, seed=0) if known.height > budget else known
            fig.add_trace(
                go.Scattergl(
                    x=shown[metric].to_list(),
                    y=shown["reward"].to_list(),
                    text=shown["rollout_id"].to_list(),
                    mode="markers",
                    marker={"size": 5, "opacity": 0.5, "color": colors[run]},
                    name=run,
                    legendgroup=run,
                    showlegend=col == 1,
                    hovertemplate=f"%{{text}}<br>{metric} %{{x:,}}<br>reward %{{y}}"
                    f"<extra>{run}</extra>",
                ),
                row=1,
                col=col,
            )
            means = _reward_by_bin(known, metric)
            fig.add_trace(
                go.Scatter(
                    x=means["value"].to_list(),
                    y=means["reward"].to_list(),
                    customdata=means["rollouts"].to_list(),
                    mode="lines+markers",
                    line_color=colors[run],
                    name=f"{run} mean reward",
                    legendgroup=run,
                    showlegend=col == 1,
                    hovertemplate=f"mean {metric} %{{x:,.1f}}<br>mean reward %{{y:.3f}}"
                    f"<br>%{{customdata:,}} rollouts<extra>{run}</extra>",
                ),
                row=1,
                col=col,
            )
    sampled = " (sampled)" if was_sampled else ""
    fig.update_layout(title=f"Reward against per-rollout totals{sampled}")
    fig.update_yaxes(title_text="reward", row=1, col=1)
    return fig


def _reward_by_bin(known: pl.DataFrame, metric: str, *, bins: int = 10) -> pl.DataFrame:
    """Mean value and mean reward of each of ``bins`` equal-count slices ordered by ``metric``."""
    slice_ = (pl.col(metric).rank("ordinal").cast(pl.Int64) - 1) * bins // pl.len()
    return (
        known.group_by(slice_.alias("bin"))
        .agg(
            pl.col(metric).cast(pl.Float64).mean().alias("value"),
            pl.col("reward").mean().alias("reward"),
            pl.len().cast(pl.Int64).alias("rollouts"),
        )
        .sort("bin")
    )
