"""The interactive dashboard reacts to its filters by rewriting trace data in place."""

from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go
import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core.testing import RunSpec, write_run
from ngcapture_viz.stats import PERCENTILES, calls_over_time, latency_percentiles, token_histogram
from ngcapture_viz.widget import CaptureDashboard
from tests.ngcapture_viz.conftest import bar_labels, bar_values


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[ngv.CaptureRun]:
    root: Path = tmp_path_factory.mktemp("widget")
    opened = []
    for label, seed in (("a", 3), ("b", 4)):
        written = write_run(root / label, RunSpec(tasks=15, repeats=2, calls=(1, 6), seed=seed))
        opened.append(ngv.open_run(written.capture_dir, written.rollouts, label=label, index=False))
    return opened


@pytest.fixture
def dash(runs: list[ngv.CaptureRun]) -> CaptureDashboard:
    return CaptureDashboard(runs)


def _latency_y(dash: CaptureDashboard, percentile: str = "p95") -> list[float | None]:
    index = list(PERCENTILES).index(percentile)
    return bar_values(dash.figure_widgets["latency"].data[index])


def test_widget_is_a_vbox_holding_the_filters_and_figure_widgets(dash: CaptureDashboard) -> None:
    box = dash.widget()
    assert isinstance(box, widgets.VBox)
    assert dash.widget() is box
    assert set(dash.filters) == {"run", "model", "dialect", "outcome", "time"}
    assert set(dash.figure_widgets) == {"latency", "tokens", "over_time", "errors"}
    assert all(isinstance(f, go.FigureWidget) for f in dash.figure_widgets.values())
    assert all(f in box.children for f in dash.figure_widgets.values())
    assert dash.filters["run"].options == ("a", "b")


def test_model_filter_rewrites_latency_traces_in_place(dash: CaptureDashboard) -> None:
    figure = dash.figure_widgets["latency"]
    trace = figure.data[2]
    before = bar_values(trace)
    full = latency_percentiles(dash.calls)
    assert before == full.filter(pl.col("metric") == "latency_total_ms")["p95"].to_list()

    dash.filters["model"].value = ("sim-model-1",)

    assert dash.figure_widgets["latency"] is figure and figure.data[2] is trace
    expected = latency_percentiles(dash.calls.filter(pl.col("model") == "sim-model-1"))
    total = expected.filter(pl.col("metric") == "latency_total_ms")
    assert _latency_y(dash) == total["p95"].to_list() != before
    assert all("sim-model-1" in label for label in bar_labels(trace))
    # Fewer groups: the bars stood up again, and the axes followed.
    assert trace.orientation == "v" and figure.layout.yaxis.autorange is None
    ttft = expected.filter(pl.col("metric") == "latency_ttft_ms")
    assert bar_values(figure.data[4]) == ttft["p50"].to_list()

    dash.filters["model"].value = ()  # empty selection: no filter
    assert _latency_y(dash) == before


def test_run_filter_empties_the_other_runs_traces(dash: CaptureDashboard) -> None:
    tokens = dash.figure_widgets["tokens"]
    assert [t.name for t in tokens.data[:2]] == ["a", "b"]
    assert len(tokens.data[0].y) > 0

    dash.filters["run"].value = ("b",)

    kept = dash.calls.filter(pl.col("run") == "b")
    histogram = token_histogram(kept).filter(pl.col("metric") == "tokens_in")
    assert list(tokens.data[0].y) == []
    assert list(tokens.data[1].y) == histogram["count"].to_list()
    n = kept["tokens_in"].is_not_null().sum()
    assert tokens.layout.annotations[0].text == f"tokens_in (reported by {n} / {kept.height} calls)"
    errors = dash.figure_widgets["errors"]
    assert list(errors.data[0].y) == []
    assert errors.data[1].y[0] == pytest.approx(kept["error_category"].is_not_null().mean())


def test_time_range_and_outcome_filters_follow_the_filtered_calls(dash: CaptureDashboard) -> None:
    slider = dash.filters["time"]
    last = len(slider.options) - 1
    slider.index = (last // 4, last // 2)
    start, end = slider.value
    kept = dash.calls.filter(pl.col("started_at").is_between(start, end))
    assert 0 < kept.height < dash.calls.height
    assert dash.filtered_calls().equals(kept)
    over_time = dash.figure_widgets["over_time"]
    calls_a, calls_b = over_time.data[0], over_time.data[2]
    assert sum(calls_a.y) + sum(calls_b.y) == kept.height
    buckets = calls_over_time(kept, interval=dash._interval)
    assert list(calls_a.y) == buckets.filter(pl.col("run") == "a")["calls"].to_list()
    assert f"<b>{kept.height:,} of {dash.calls.height:,} calls shown</b>" in dash.summary.value

    dash.filters["outcome"].value = ("ok",)
    kept = kept.filter(pl.col("outcome") == "ok")
    assert dash.filtered_calls().equals(kept)
    errors = dash.figure_widgets["errors"]
    assert all(y == 0 for trace in errors.data for y in trace.y)
    assert f"<b>{kept.height:,} of" in dash.summary.value


def test_dialect_filter_changes_coverage_in_summary(dash: CaptureDashboard) -> None:
    dash.filters["dialect"].value = ("chat",)
    chat = dash.calls.filter(pl.col("dialect") == "chat")
    reasoning = chat["tokens_reasoning"].is_not_null().sum()
    assert f"tokens_reasoning: {reasoning:,} / {chat.height:,}" in dash.summary.value
    assert all(" · chat<br>" in x for x in dash.figure_widgets["latency"].data[0].x)
