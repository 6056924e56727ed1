"""Reward against per-rollout totals (tokens, latency, calls), with binned mean rewards.

One point per rollout (sampled above a cap; SVG up to ``SVG_MAX_POINTS`` points a trace, WebGL
above), one colour per run. Over the points, each
run's mean reward per bin: rollouts ordered by the total and cut into equal-count bins of at
least ``MIN_PER_BIN`` rollouts (at most ten bins), each drawn at its mean total with a 95 %
normal interval of its mean reward. Few rollouts make few bins: the line does not zig-zag
through a handful of points.

Example:
    >>> reward_figure(run.rollouts, run.labels)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.figures._validation import subplots, trace
from ngcapture_viz.figures.style import array, run_colors
from ngcapture_viz.frames.rollouts import ROLLOUTS
from ngcapture_viz.interop import accepts_pandas

__all__ = [
    "KNOWN",
    "MAX_BINS",
    "MIN_PER_BIN",
    "REWARD_METRICS",
    "SVG_MAX_POINTS",
    "reward_bins",
    "reward_figure",
]

REWARD_METRICS: Final = ("tokens_total", "latency_total_ms", "num_calls")
#: Under each panel's title: how many rollouts it shows (reward and total known) of how many.
KNOWN: Final = "rollouts known"
MIN_PER_BIN: Final = 20
MAX_BINS: Final = 10
#: Point traces up to this size are SVG (``scatter``): drawn by every plotly.js bundle, quick
#: to draw at this size, and they need no WebGL context; larger ones are ``scattergl``.
SVG_MAX_POINTS: Final = 2_000


@accepts_pandas(rollouts=ROLLOUTS)
def reward_figure(
    rollouts: pl.DataFrame, runs: Sequence[str], *, max_points: int = 20_000
) -> go.Figure:
    """Per-rollout totals (tokens, latency, calls) against reward; sampled above a cap.

    Rollouts with no reward or no reported total are left out; each panel's title says how
    many rollouts it shows of how many there are. Traces per panel and run: the points, then the
    binned means (computed over all rollouts, never sampled).
    """
    budget = max(1, max_points // max(1, len(runs)))
    known_by_metric = {
        metric: rollouts.filter(pl.col("reward").is_not_null() & pl.col(metric).is_not_null())
        for metric in REWARD_METRICS
    }
    # Each panel's coverage under its title (as the token panels do): three axis titles of
    # this length ran into each other in a narrow output.
    fig = subplots(
        rows=1,
        cols=len(REWARD_METRICS),
        subplot_titles=[
            f"{metric}<br><sup>{known.height:,} / {rollouts.height:,} {KNOWN}</sup>"
            for metric, known in known_by_metric.items()
        ],
        shared_yaxes=True,
        horizontal_spacing=0.06,
    )
    was_sampled = False
    colors = run_colors(runs)
    for col, (metric, known_all) in enumerate(known_by_metric.items(), start=1):
        for run in runs:
            known = known_all.filter(pl.col("run").cast(pl.String) == run)
            was_sampled = was_sampled or known.height > budget
            shown = known.sample(n=budget, seed=0) if known.height > budget else known
            points = go.Scattergl if shown.height > SVG_MAX_POINTS else go.Scatter
            fig.add_trace(
                trace(
                    points,
                    x=array(shown[metric]),
                    y=array(shown["reward"]),
                    text=array(shown["rollout_id"]),
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
            means = reward_bins(known, metric)
            fig.add_trace(
                trace(
                    go.Scatter,
                    x=means["value"].to_list(),
                    y=means["reward"].to_list(),
                    error_y={"type": "data", "array": means["half_width"].to_list()},
                    customdata=means["rollouts"].to_list(),
                    mode="lines+markers",
                    line={"color": colors[run], "width": 1, "dash": "dot"},
                    marker={"color": colors[run], "size": 9, "symbol": "square"},
                    name=f"{run} binned mean",
                    legendgroup=run,
                    showlegend=col == 1,
                    hovertemplate=f"mean {metric} %{{x:,.1f}}<br>mean reward %{{y:.3f}}"
                    f"<br>%{{customdata:,}} rollouts<extra>{run}</extra>",
                ),
                row=1,
                col=col,
            )
    sampled = " (points sampled)" if was_sampled else ""
    fig.update_layout(
        title={
            "text": f"Reward against per-rollout totals{sampled}",
            "subtitle": {
                "text": f"squares: mean reward of equal-count bins (≥ {MIN_PER_BIN} rollouts, "
                f"≤ {MAX_BINS} bins) ± 95% interval"
            },
        },
        height=480,
        margin={"t": 125},
        legend={"orientation": "h", "yanchor": "top", "y": -0.12, "x": 0},
    )
    fig.update_yaxes(title_text="reward", row=1, col=1)
    return fig


def reward_bins(known: pl.DataFrame, metric: str) -> pl.DataFrame:
    """Mean value and mean reward (with a 95 % half-width) of equal-count bins by ``metric``.

    ``min(MAX_BINS, n // MIN_PER_BIN)`` bins (at least one) of rollouts ordered by ``metric``.
    """
    bins = max(1, min(MAX_BINS, known.height // MIN_PER_BIN))
    slice_ = (pl.col(metric).rank("ordinal").cast(pl.Int64) - 1) * bins // pl.len()
    return (
        known.group_by(slice_.alias("bin"))
        .agg(
            pl.col(metric).cast(pl.Float64).mean().alias("value"),
            pl.col("reward").mean().alias("reward"),
            (1.96 * pl.col("reward").std() / pl.len().sqrt()).fill_null(0.0).alias("half_width"),
            pl.len().cast(pl.Int64).alias("rollouts"),
        )
        .sort("bin")
    )
