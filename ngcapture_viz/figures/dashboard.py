"""The token and latency dashboard: static Plotly figures beside the tables they plot.

The figures live in their own modules (``tokens``, ``latency``, ``bars``, ``over_time``,
``reward``); this one builds them all for a run and keeps the tables they were drawn from.

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
from typing import Any

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.figures.bars import HORIZONTAL_FROM, group_labels, throughput_figure
from ngcapture_viz.figures.latency import latency_figure
from ngcapture_viz.figures.over_time import calls_over_time_figure, error_figure
from ngcapture_viz.figures.reward import REWARD_METRICS, reward_figure
from ngcapture_viz.figures.style import run_colors
from ngcapture_viz.figures.time_split import time_split, time_split_figure
from ngcapture_viz.figures.tokens import token_figure
from ngcapture_viz.frames.tokens import token_capture_summary
from ngcapture_viz.run import CaptureRun, stack_runs
from ngcapture_viz.stats import (
    DEFAULT_BY,
    calls_over_time,
    coverage,
    error_rates,
    latency_distribution,
    latency_percentiles,
    throughput_summary,
    time_interval,
    token_histogram,
    token_summary,
)

__all__ = [
    "HORIZONTAL_FROM",
    "REWARD_METRICS",
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


@dataclass(frozen=True)
class Dashboard:
    """Figures and the tables they were drawn from.

    Attributes:
        figures: ``tokens``, ``latency``, ``throughput``, ``over_time``, ``errors``, ``reward``,
            ``time`` (where the rollouts' wall time goes, from ``ng_perf``).
        tables: ``latency``, ``latency_distribution``, ``tokens``, ``throughput``, ``errors``,
            ``token_histogram``, ``over_time`` (see ``ngcapture_viz.stats``), ``time_split``
            (``ngcapture_viz.figures.time_split``) and, when the run has token-id capture,
            ``token_capture`` (masked fraction per run with reasons and store states:
            ``ngcapture_viz.frames.tokens.token_capture_summary``).
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
    interval = time_interval(calls)
    tables = {
        "latency": latency_percentiles(calls, by),
        "latency_distribution": latency_distribution(calls, by),
        "tokens": token_summary(calls, by),
        "throughput": throughput_summary(calls, by),
        "errors": error_rates(calls, ("run",)),
        "token_histogram": token_histogram(calls),
        "over_time": calls_over_time(calls, interval=interval),
        "time_split": time_split(run.perf),
    }
    if run.tokens.height:
        tables["token_capture"] = token_capture_summary(run.tokens, runs)
    figures = {
        "tokens": token_figure(tables["token_histogram"], coverage(calls), runs),
        "latency": latency_figure(
            tables["latency"], by, distribution=tables["latency_distribution"]
        ),
        "throughput": throughput_figure(tables["throughput"], by),
        "over_time": calls_over_time_figure(tables["over_time"], runs, interval=interval),
        "errors": error_figure(tables["errors"], runs),
        "reward": reward_figure(run.rollouts, runs, max_points=max_points),
        "time": time_split_figure(tables["time_split"], runs),
    }
    return Dashboard(figures=figures, tables=tables)
