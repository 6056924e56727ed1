"""The interactive dashboard: filters for run, model, dialect, outcome and time over live figures.

Changing a filter recomputes the aggregates in Polars and writes the new trace data into the
same ``go.FigureWidget`` objects (inside ``batch_update``): no widget is replaced, so the
notebook layout, zoom and legend state stay where the user left them.

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

from ngcapture_viz.dashboard import (
    calls_over_time_figure,
    error_figure,
    latency_figure,
    token_figure,
)
from ngcapture_viz.exceptions import MissingExtraError
from ngcapture_viz.run import CaptureRun, stack_runs
from ngcapture_viz.stats import (
    DEFAULT_BY,
    LATENCY_METRICS,
    TOKEN_METRICS,
    calls_over_time,
    error_rates,
    latency_percentiles,
    time_interval,
    token_histogram,
    token_summary,
)

__all__ = ["CaptureDashboard"]

CHOICE_FILTERS: Final = ("run", "model", "dialect", "outcome")


class CaptureDashboard:
    """Filterable latency, token, over-time and error figures over one or several runs.

    An empty selection, or the full time range, means "no filter" on that column.

    Attributes:
        filters: ``run``, ``model``, ``dialect``, ``outcome`` (``SelectMultiple``) and ``time``
            (``SelectionRangeSlider`` over ``started_at``); set their ``value`` to filter.
        figure_widgets: ``latency``, ``tokens``, ``over_time``, ``errors`` (``go.FigureWidget``).
        summary: an ``HTML`` widget with the calls shown and each metric's coverage.

    Example:
        >>> dash = CaptureDashboard([run_a, run_b])  # doctest: +SKIP
        >>> dash.filters["run"].value = ("ckpt-200",)  # doctest: +SKIP
        >>> dash.figure_widgets["latency"].data[0].y  # doctest: +SKIP
    """

    def __init__(self, runs: CaptureRun | Sequence[CaptureRun], *, time_steps: int = 100) -> None:
        if importlib.util.find_spec("anywidget") is None:
            raise MissingExtraError(
                "the interactive dashboard needs plotly's FigureWidget, which needs anywidget: "
                "pip install anywidget"
            )
        run = runs if isinstance(runs, CaptureRun) else stack_runs(list(runs))
        self.calls: pl.DataFrame = run.calls
        self.runs: list[str] = run.labels
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

    def refresh(self) -> None:
        """Recompute every figure and the summary from the current filters, in place."""
        calls = self.filtered_calls()
        for name, fresh in self._figures(calls).items():
            _update_in_place(self.figure_widgets[name], fresh)
        self.summary.value = self._summary(calls)

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
        return {
            "latency": latency_figure(latency_percentiles(calls, by), by),
            "tokens": token_figure(histogram, token_summary(calls, ("run",)), self.runs),
            "over_time": calls_over_time_figure(
                calls_over_time(calls, interval=self._interval), self.runs
            ),
            "errors": error_figure(error_rates(calls, ("run",)), self.runs),
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
    """Write ``fresh``'s trace data, subplot titles and categories into ``target``."""
    with target.batch_update():
        for old, new in zip(target.data, fresh.data, strict=True):
            props = new.to_plotly_json()
            props.pop("type", None)
            old.update(props, overwrite=True)
        target.layout.annotations = fresh.layout.annotations
        target.layout.xaxis.categoryarray = fresh.layout.xaxis.categoryarray
        # Percentile bars lie down past a number of groups: follow the axes and the height.
        target.layout.height = fresh.layout.height
        for axis in ("xaxis", "yaxis", "xaxis2", "yaxis2"):
            if axis in target.layout and axis in fresh.layout:
                target.layout[axis].title = fresh.layout[axis].title
                target.layout[axis].autorange = fresh.layout[axis].autorange
