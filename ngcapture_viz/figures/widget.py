"""The interactive dashboard: filters for run, model, dialect, outcome and time over live figures.

The widget draws the static dashboard's figures (``ngcapture_viz.figures.dashboard``) in one
light :class:`~ngcapture_viz.figures.panel.FigurePanel`: its state is the figures' JSON, and
plotly.js crosses the websocket at most once per page. A filter change recomputes the
aggregates in Polars and sends the new figures; the panel redraws them in place
(``Plotly.react``), so zoom and legend clicks of an unchanged figure stay. The time slider
sends its value when released, not at every step.

Example:
    >>> dash = CaptureDashboard(ngv.open_run("results/demo/ckpt-100/model-calls"))  # doctest: +SKIP
    >>> dash  # the widget  # doctest: +SKIP
    >>> dash.filters["model"].value = ("sim-model-1",)  # the figures follow  # doctest: +SKIP
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import ipywidgets as widgets
import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.display.bundles import Bundle
from ngcapture_viz.figures._validation import unvalidated
from ngcapture_viz.figures.bars import throughput_figure
from ngcapture_viz.figures.latency import latency_figure
from ngcapture_viz.figures.over_time import calls_over_time_figure, error_figure
from ngcapture_viz.figures.panel import FigurePanel
from ngcapture_viz.figures.reward import SVG_MAX_POINTS, reward_figure
from ngcapture_viz.figures.tokens import token_figure
from ngcapture_viz.run import CaptureRun, stack_runs
from ngcapture_viz.stats import (
    DEFAULT_BY,
    LATENCY_METRICS,
    TOKEN_METRICS,
    calls_over_time,
    coverage,
    error_rates,
    latency_distribution,
    latency_percentiles,
    throughput_summary,
    time_interval,
    token_histogram,
)
from ngcapture_viz.stats.tokens import THROUGHPUT_METRIC

__all__ = ["CaptureDashboard"]

CHOICE_FILTERS: Final = ("run", "model", "dialect", "outcome")
#: The calls columns the figures and the summary read (``stats`` raises on a missing one).
_DRAWN_COLUMNS: Final = (
    *CHOICE_FILTERS,
    "rollout_id",
    "stream",
    "started_at",
    "error_category",
    "tokens_total",
    THROUGHPUT_METRIC,
    *TOKEN_METRICS,
    *LATENCY_METRICS,
)
#: Title note of the reward figure while a filter other than ``run`` selects its rollouts.
REWARD_SELECTION_NOTE: Final = (
    "rollouts with a call matching the filters; totals over all their calls"
)


class CaptureDashboard:
    """Filterable latency, throughput, token, over-time, error and reward figures over runs.

    An empty selection, or the full time range, means "no filter" on that column. Every figure
    but ``reward`` is recomputed from the calls the filters keep (``filtered_calls``).

    ``reward`` plots one point per rollout, so the filters select rollouts there
    (``filtered_rollouts``): the ``run`` filter keeps the rollouts of the chosen runs; the
    ``model``, ``dialect``, ``outcome`` and ``time`` filters keep the rollouts with at least one
    call that passes every filter. A kept rollout keeps its whole-rollout totals (tokens,
    latency, calls over all its calls, as in ``CaptureRun.rollouts``): totals over a part of a
    rollout would not be what its reward rewards. The figure's title says so while such a filter
    is set.

    Args:
        runs: a ``CaptureRun`` (single or stacked) or a list of them (stacked here).
        time_steps: the positions of the time-range slider.
        max_points: the most points any one reward trace may hold (rollouts are sampled above
            it, as in ``dashboard``; lower than there, to keep the widget's state small).

    Attributes:
        filters: ``run``, ``model``, ``dialect``, ``outcome`` (``SelectMultiple``) and ``time``
            (``SelectionRangeSlider`` over ``started_at``); set their ``value`` to filter.
        figures: ``latency``, ``throughput``, ``tokens``, ``over_time``, ``errors``,
            ``reward``: the figures drawn now (``go.Figure``, in the order the widget shows them;
            built without plotly's validation, their JSON that of the public figure functions).
        panel: the :class:`FigurePanel` that draws them.
        time_readout: the chosen time range, in full (the slider shows no readout of its own).
        summary: an ``HTML`` widget with the calls shown and each metric's coverage.

    Example:
        >>> dash = CaptureDashboard([run_a, run_b])  # doctest: +SKIP
        >>> dash.filters["run"].value = ("ckpt-200",)  # doctest: +SKIP
        >>> dash.figures["latency"].data[1].x  # the percentile marks  # doctest: +SKIP
    """

    def __init__(
        self,
        runs: CaptureRun | Sequence[CaptureRun],
        *,
        time_steps: int = 100,
        max_points: int = 5_000,
    ) -> None:
        run = runs if isinstance(runs, CaptureRun) else stack_runs(list(runs))
        self.calls: pl.DataFrame = run.calls
        self.rollouts: pl.DataFrame = run.rollouts
        self.runs: list[str] = run.labels
        self._max_points = max_points
        self._by = [c for c in DEFAULT_BY if c in self.calls.columns]
        self._interval = time_interval(self.calls)
        # The columns the figures and the summary read: a filter copies these only (the frame
        # has ~40, the widest of them strings the figures never show).
        self._drawn = self.calls.select(c for c in _DRAWN_COLUMNS if c in self.calls.columns)
        self.filters: dict[str, Any] = {
            name: widgets.SelectMultiple(
                options=self._choices(name), value=(), description=name, rows=4
            )
            for name in CHOICE_FILTERS
        }
        self.filters["time"] = _time_slider(self.calls, steps=time_steps)
        self.time_readout = widgets.HTML()
        # The panel first: its opening state can carry plotly.js to the page, which takes it
        # in while the figures are computed here.
        self.panel = FigurePanel(
            prefetch=self._likely_bundle(), layout=widgets.Layout(width="100%")
        )
        self.figures: dict[str, go.Figure] = {}
        self.summary = widgets.HTML()
        self.refresh()
        for control in self.filters.values():
            control.observe(self._on_change, names="value")
        self._box: widgets.VBox | None = None

    def widget(self) -> widgets.VBox:
        """The dashboard as one ``VBox``: filters, time range, coverage summary, the figures."""
        if self._box is None:
            choices = widgets.HBox(
                [self.filters[name] for name in CHOICE_FILTERS],
                layout=widgets.Layout(flex_flow="row wrap"),
            )
            self._box = widgets.VBox(
                [choices, self.filters["time"], self.time_readout, self.summary, self.panel],
                layout=widgets.Layout(width="100%"),
            )
        return self._box

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        bundle: dict[str, Any] | None = self.widget()._repr_mimebundle_(**kwargs)
        return bundle

    def filtered_calls(self) -> pl.DataFrame:
        """The calls the current filters keep."""
        return self.calls.filter(self._keep())

    def _keep(self) -> pl.Expr:
        keep = pl.lit(True)
        for name in CHOICE_FILTERS:
            chosen = list(self.filters[name].value)
            if chosen:
                keep = keep & pl.col(name).cast(pl.String).is_in(chosen)
        slider = self.filters["time"]
        if slider.index != (0, len(slider.options) - 1):
            start, end = slider.value
            keep = keep & pl.col("started_at").is_between(start, end)
        return keep

    def filtered_rollouts(self) -> pl.DataFrame:
        """The rollouts the reward figure shows, with their whole-rollout totals.

        Those of the runs chosen in ``run``; while ``model``, ``dialect``, ``outcome`` or
        ``time`` is set, only those with a call in ``filtered_calls()``.
        """
        return self._rollouts_of(self.filtered_calls())

    def refresh(self) -> None:
        """Recompute every figure and the summary from the current filters, and send them."""
        calls = self._drawn.filter(self._keep())
        with unvalidated():  # only their JSON leaves the kernel: a test checks it is the same
            self.figures = self._figures(calls)
        self.panel.show(self.figures)
        self.summary.value = self._summary(calls)
        self.time_readout.value = self._time_text()

    def _likely_bundle(self) -> Bundle:
        """The plotly.js bundle the figures will need: WebGL reward points need the full one."""
        counts = self.rollouts.group_by("run").len()["len"].to_list()
        points = min(max(counts, default=0), self._max_points // max(1, len(self.runs)))
        return "full" if points > SVG_MAX_POINTS else "basic"

    def _time_text(self) -> str:
        slider = self.filters["time"]
        start, end = slider.value
        if start is None:
            return "<i>no call has a start time</i>"
        whole = slider.index == (0, len(slider.options) - 1)
        return (
            f"started_at from <b>{html.escape(start.isoformat(sep=' '))}</b> to "
            f"<b>{html.escape(end.isoformat(sep=' '))}</b>" + (" (every call)" if whole else "")
        )

    def _selects_by_call(self) -> bool:
        """Whether a filter other than ``run`` is set (it selects rollouts by their calls)."""
        slider = self.filters["time"]
        chosen = any(self.filters[name].value for name in CHOICE_FILTERS if name != "run")
        return chosen or slider.index != (0, len(slider.options) - 1)

    def _rollouts_of(self, calls: pl.DataFrame) -> pl.DataFrame:
        rollouts = self.rollouts
        runs = list(self.filters["run"].value)
        if runs:
            rollouts = rollouts.filter(pl.col("run").cast(pl.String).is_in(runs))
        if self._selects_by_call():
            # Rollout ids repeat across runs (same tasks at each checkpoint): match on both.
            keys = calls.select(pl.col("run").cast(pl.String), "rollout_id").unique()
            rollouts = rollouts.join(
                keys,
                left_on=[pl.col("run").cast(pl.String), pl.col("rollout_id")],
                right_on=["run", "rollout_id"],
                how="semi",
                maintain_order="left",
            )
        return rollouts

    def _on_change(self, change: dict[str, Any]) -> None:
        self.refresh()

    def _choices(self, name: str) -> list[str]:
        if name == "run":
            return list(self.runs)
        values = self.calls[name].cast(pl.String).drop_nulls().unique()
        return sorted(values.to_list())

    def _figures(self, calls: pl.DataFrame) -> dict[str, go.Figure]:
        by = self._by
        histogram = token_histogram(calls)
        reward = reward_figure(self._rollouts_of(calls), self.runs, max_points=self._max_points)
        if self._selects_by_call():
            subtitle = reward.layout.title.subtitle
            subtitle.text = f"{subtitle.text}<br>{REWARD_SELECTION_NOTE}"
        return {
            "latency": latency_figure(
                latency_percentiles(calls, by), by, distribution=latency_distribution(calls, by)
            ),
            "throughput": throughput_figure(throughput_summary(calls, by), by),
            "tokens": token_figure(histogram, coverage(calls), self.runs),
            "over_time": calls_over_time_figure(
                calls_over_time(calls, interval=self._interval), self.runs, interval=self._interval
            ),
            "errors": error_figure(error_rates(calls, ("run",)), self.runs),
            "reward": reward,
        }

    def _summary(self, calls: pl.DataFrame) -> str:
        metrics = (*TOKEN_METRICS, *LATENCY_METRICS)
        streamed = pl.col("stream").fill_null(False)
        reported = calls.select(  # one pass for every count
            *(pl.col(m).is_not_null().sum() for m in metrics),
            streamed.sum().alias("_streamed"),
            (streamed & pl.col("latency_ttft_ms").is_not_null()).sum().alias("_ttft"),
        ).row(0, named=True)
        counts = [f"{m}: {reported[m]:,} / {calls.height:,}" for m in metrics]
        counts.append(
            f"latency_ttft_ms among streamed calls: "
            f"{reported['_ttft']:,} / {reported['_streamed']:,}"
        )
        items = "".join(f"<li>{html.escape(c)}</li>" for c in counts)
        return (
            f"<b>{calls.height:,} of {self.calls.height:,} calls shown</b>"
            f"<br>Reported by (calls that reported each metric / calls shown):<ul>{items}</ul>"
        )


def _time_slider(calls: pl.DataFrame, *, steps: int) -> widgets.SelectionRangeSlider:
    first, last = calls["started_at"].min(), calls["started_at"].max()
    if not isinstance(first, datetime) or not isinstance(last, datetime) or first == last:
        points = [first] if isinstance(first, datetime) else []
    else:
        n = max(2, steps)
        points = [first + (last - first) * i / (n - 1) for i in range(n - 1)] + [last]
    options: list[tuple[str, datetime | None]] = [
        (p.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], p) for p in points
    ] or [("no start times", None)]
    return widgets.SelectionRangeSlider(
        options=options,
        index=(0, len(options) - 1),
        description="started_at",
        readout=False,  # cut at the slider's width: the dashboard's time_readout says it all
        continuous_update=False,  # dragging recomputes once, on release
        layout=widgets.Layout(width="95%"),
    )
