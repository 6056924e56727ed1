"""The interactive dashboard: filters for run, model, dialect, outcome and time over live figures.

The widget holds the static dashboard's figures (``ngcapture_viz.figures.dashboard``). A filter
change recomputes the aggregates in Polars and writes the new trace data into the same
``go.FigureWidget`` objects (inside ``batch_update``): no widget is replaced, so the notebook
layout, zoom and legend state stay where the user left them.

Example:
    >>> dash = CaptureDashboard(ngv.open_run("results/demo/ckpt-100/model-calls"))  # doctest: +SKIP
    >>> dash.widget()  # doctest: +SKIP
    >>> dash.filters["model"].value = ("sim-model-1",)  # the figures follow  # doctest: +SKIP
"""

from __future__ import annotations

import html
import importlib.util
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import ipywidgets as widgets
import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.exceptions import MissingExtraError
from ngcapture_viz.figures.dashboard import (
    calls_over_time_figure,
    error_figure,
    latency_figure,
    reward_figure,
    throughput_figure,
    token_figure,
)
from ngcapture_viz.run import CaptureRun, stack_runs
from ngcapture_viz.stats import (
    DEFAULT_BY,
    LATENCY_METRICS,
    TOKEN_METRICS,
    calls_over_time,
    error_rates,
    latency_percentiles,
    throughput_summary,
    time_interval,
    token_histogram,
    token_summary,
)

__all__ = ["CaptureDashboard"]

CHOICE_FILTERS: Final = ("run", "model", "dialect", "outcome")
#: Title note of the reward figure while a filter other than ``run`` selects its rollouts.
REWARD_SELECTION_NOTE: Final = (
    "<br><sup>rollouts with a call matching the filters; totals over all their calls</sup>"
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
            it, as in ``dashboard``).

    Attributes:
        filters: ``run``, ``model``, ``dialect``, ``outcome`` (``SelectMultiple``) and ``time``
            (``SelectionRangeSlider`` over ``started_at``); set their ``value`` to filter.
        figure_widgets: ``latency``, ``throughput``, ``tokens``, ``over_time``, ``errors``,
            ``reward`` (``go.FigureWidget``, in the order the widget shows them).
        summary: an ``HTML`` widget with the calls shown and each metric's coverage.

    Example:
        >>> dash = CaptureDashboard([run_a, run_b])  # doctest: +SKIP
        >>> dash.filters["run"].value = ("ckpt-200",)  # doctest: +SKIP
        >>> dash.figure_widgets["latency"].data[0].y  # doctest: +SKIP
    """

    def __init__(
        self,
        runs: CaptureRun | Sequence[CaptureRun],
        *,
        time_steps: int = 100,
        max_points: int = 20_000,
    ) -> None:
        if importlib.util.find_spec("anywidget") is None:
            raise MissingExtraError(
                "the interactive dashboard needs plotly's FigureWidget, which needs anywidget: "
                "pip install anywidget"
            )
        run = runs if isinstance(runs, CaptureRun) else stack_runs(list(runs))
        self.calls: pl.DataFrame = run.calls
        self.rollouts: pl.DataFrame = run.rollouts
        self.runs: list[str] = run.labels
        self._max_points = max_points
        self._by = [c for c in DEFAULT_BY if c in self.calls.columns]
        self._interval = time_interval(self.calls)
        self.filters: dict[str, Any] = {
            name: widgets.SelectMultiple(
                options=self._choices(name), value=(), description=name, rows=4
            )
            for name in CHOICE_FILTERS
        }
        self.filters["time"] = _time_slider(self.calls, steps=time_steps)
        self.figure_widgets: dict[str, go.FigureWidget] = {
            name: go.FigureWidget(fig) for name, fig in self._figures(self.calls).items()
        }
        self.summary = widgets.HTML(self._summary(self.calls))
        for control in self.filters.values():
            control.observe(self._on_change, names="value")
        self._box: widgets.VBox | None = None

    def widget(self) -> widgets.VBox:
        """The dashboard as one ``VBox``: filters, coverage summary, then the figures."""
        if self._box is None:
            choices = widgets.HBox([self.filters[name] for name in CHOICE_FILTERS])
            self._box = widgets.VBox(
                [choices, self.filters["time"], self.summary, *self.figure_widgets.values()]
            )
        return self._box

    def filtered_calls(self) -> pl.DataFrame:
        """The calls the current filters keep."""
        keep = pl.lit(True)
        for name in CHOICE_FILTERS:
            chosen = list(self.filters[name].value)
            if chosen:
                keep = keep & pl.col(name).cast(pl.String).is_in(chosen)
        slider = self.filters["time"]
        if slider.index != (0, len(slider.options) - 1):
            start, end = slider.value
            keep = keep & pl.col("started_at").is_between(start, end)
        return self.calls.filter(keep)

    def filtered_rollouts(self) -> pl.DataFrame:
        """The rollouts the reward figure shows, with their whole-rollout totals.

        Those of the runs chosen in ``run``; while ``model``, ``dialect``, ``outcome`` or
        ``time`` is set, only those with a call in ``filtered_calls()``.
        """
        return self._rollouts_of(self.filtered_calls())

    def refresh(self) -> None:
        """Recompute every figure and the summary from the current filters, in place."""
        calls = self.filtered_calls()
        for name, fresh in self._figures(calls).items():
            _update_in_place(self.figure_widgets[name], fresh)
        self.summary.value = self._summary(calls)

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
            reward.update_layout(title_text=reward.layout.title.text + REWARD_SELECTION_NOTE)
        return {
            "latency": latency_figure(latency_percentiles(calls, by), by),
            "throughput": throughput_figure(throughput_summary(calls, by), by),
            "tokens": token_figure(histogram, token_summary(calls, ("run",)), self.runs),
            "over_time": calls_over_time_figure(
                calls_over_time(calls, interval=self._interval), self.runs
            ),
            "errors": error_figure(error_rates(calls, ("run",)), self.runs),
            "reward": reward,
        }

    def _summary(self, calls: pl.DataFrame) -> str:
        streamed = calls.filter(pl.col("stream").fill_null(False))
        counts = [
            f"{m}: {calls[m].is_not_null().sum():,} / {calls.height:,}"
            for m in (*TOKEN_METRICS, *LATENCY_METRICS)
        ]
        counts.append(
            f"latency_ttft_ms among streamed calls: "
            f"{streamed['latency_ttft_ms'].is_not_null().sum():,} / {streamed.height:,}"
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
        layout=widgets.Layout(width="95%"),
    )


def _update_in_place(target: go.FigureWidget, fresh: go.Figure) -> None:
    """Write ``fresh``'s trace data, titles and categories into ``target``.

    The figure builders draw the same traces whatever the data (one per run, percentile...,
    empty when nothing is left), so old and new traces pair one to one.
    """
    with target.batch_update():
        for old, new in zip(target.data, fresh.data, strict=True):
            props = new.to_plotly_json()
            props.pop("type", None)
            old.update(props, overwrite=True)
        target.layout.title = fresh.layout.title
        target.layout.annotations = fresh.layout.annotations
        target.layout.xaxis.categoryarray = fresh.layout.xaxis.categoryarray
        # Percentile bars lie down past a number of groups: follow the axes and the height.
        target.layout.height = fresh.layout.height
        for axis in ("xaxis", "yaxis", "xaxis2", "yaxis2"):
            if axis in target.layout and axis in fresh.layout:
                target.layout[axis].title = fresh.layout[axis].title
                target.layout[axis].autorange = fresh.layout[axis].autorange
