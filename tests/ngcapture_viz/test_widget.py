"""The interactive dashboard reacts to its filters by rewriting trace data in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core.testing import RunSpec, write_run
from ngcapture_viz.figures.dashboard import REWARD_METRICS
from ngcapture_viz.figures.widget import REWARD_SELECTION_NOTE, CaptureDashboard
from ngcapture_viz.stats import (
    PERCENTILES,
    calls_over_time,
    latency_percentiles,
    throughput_summary,
    token_histogram,
)
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
    assert list(dash.figure_widgets) == [
        "latency",
        "throughput",
        "tokens",
        "over_time",
        "errors",
        "reward",
    ]
    assert all(isinstance(f, go.FigureWidget) for f in dash.figure_widgets.values())
    assert list(box.children[-6:]) == list(dash.figure_widgets.values())
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


def _reward_index(dash: CaptureDashboard, run: str, metric: str = "tokens_total") -> int:
    """Where the scatter of ``run``'s rollouts in ``metric``'s panel is (its mean line next)."""
    return 2 * (REWARD_METRICS.index(metric) * len(dash.runs) + dash.runs.index(run))


def _reward_trace(dash: CaptureDashboard, run: str, metric: str = "tokens_total") -> Any:
    return dash.figure_widgets["reward"].data[_reward_index(dash, run, metric)]


def _same(traces: tuple[Any, ...], others: tuple[Any, ...]) -> bool:
    """The same trace objects (``==`` on traces compares their content)."""
    return len(traces) == len(others) and all(a is b for a, b in zip(traces, others, strict=True))


def _known(rollouts: pl.DataFrame, run: str, metric: str = "tokens_total") -> pl.DataFrame:
    return rollouts.filter(
        (pl.col("run") == run) & pl.col("reward").is_not_null() & pl.col(metric).is_not_null()
    )


def _points(trace: Any) -> dict[str, tuple[Any, Any]]:
    return {i: (x, y) for i, x, y in zip(trace.text, trace.x, trace.y, strict=True)}


def _expected_points(rollouts: pl.DataFrame, metric: str = "tokens_total") -> dict[str, Any]:
    return {r["rollout_id"]: (r[metric], r["reward"]) for r in rollouts.iter_rows(named=True)}


def test_model_filter_rewrites_throughput_traces_in_place(dash: CaptureDashboard) -> None:
    figure = dash.figure_widgets["throughput"]
    p50, p95 = figure.data
    full = throughput_summary(dash.calls, dash._by)
    assert full.height >= 7 and p50.orientation == "h"  # 2 runs x 2 models x 3 dialects
    assert bar_values(p50) == full["p50"].to_list()
    assert bar_values(p95) == full["p95"].to_list()

    dash.filters["model"].value = ("sim-model-2",)

    assert dash.figure_widgets["throughput"] is figure and _same(figure.data, (p50, p95))
    kept = throughput_summary(dash.calls.filter(pl.col("model") == "sim-model-2"), dash._by)
    assert 0 < kept.height < full.height
    assert p50.orientation == "v" and figure.layout.yaxis.autorange is None
    assert bar_values(p50) == kept["p50"].to_list()
    assert bar_values(p95) == kept["p95"].to_list()
    assert all(" · sim-model-2 · " in label for label in bar_labels(p95))


def test_model_filter_keeps_the_rollouts_with_a_matching_call_and_their_totals(
    dash: CaptureDashboard,
) -> None:
    figure = dash.figure_widgets["reward"]
    traces = figure.data
    trace_a = _reward_trace(dash, "a")
    assert _points(trace_a) == _expected_points(_known(dash.rollouts, "a"))
    assert REWARD_SELECTION_NOTE not in figure.layout.title.text

    dash.filters["model"].value = ("sim-model-1",)

    assert dash.figure_widgets["reward"] is figure and _same(figure.data, traces)
    matching = dash.calls.filter(pl.col("model") == "sim-model-1")
    ids = {run: set(matching.filter(pl.col("run") == run)["rollout_id"]) for run in ("a", "b")}
    # The same rollout ids in both runs: a rollout is matched within its own run.
    assert ids["a"] != ids["b"] and ids["a"] & ids["b"]
    for run in ("a", "b"):
        kept = _known(dash.rollouts, run).filter(pl.col("rollout_id").is_in(ids[run]))
        assert 0 < kept.height < _known(dash.rollouts, run).height
        for metric in REWARD_METRICS:
            expected = _expected_points(kept, metric)
            assert _points(_reward_trace(dash, run, metric)) == expected
    assert dash.filtered_rollouts().height == len(ids["a"]) + len(ids["b"])
    # Whole-rollout totals, not the totals of the matching calls alone.
    partial = matching.group_by("run", "rollout_id").agg(pl.len().alias("n"))
    whole = dash.rollouts.join(partial, on=["run", "rollout_id"])
    assert (whole["num_calls"] > whole["n"]).any()
    assert figure.layout.title.text.endswith(REWARD_SELECTION_NOTE)
    titles = [a.text for a in figure.layout.annotations]
    assert titles[2] == f"num_calls ({whole.height} / {whole.height} rollouts known)"

    dash.filters["model"].value = ()
    assert _points(trace_a) == _expected_points(_known(dash.rollouts, "a"))
    assert REWARD_SELECTION_NOTE not in figure.layout.title.text


def test_run_filter_keeps_the_runs_rollouts(dash: CaptureDashboard) -> None:
    dash.filters["run"].value = ("b",)

    assert _points(_reward_trace(dash, "a")) == {}
    assert _points(_reward_trace(dash, "b")) == _expected_points(_known(dash.rollouts, "b"))
    assert dash.filtered_rollouts().equals(dash.rollouts.filter(pl.col("run") == "b"))
    assert REWARD_SELECTION_NOTE not in dash.figure_widgets["reward"].layout.title.text


def test_filters_that_leave_a_run_or_everything_empty_keep_valid_traces(
    dash: CaptureDashboard,
) -> None:
    traces = {name: figure.data for name, figure in dash.figure_widgets.items()}
    first = dash.calls.sort("started_at").row(0, named=True)
    other_run = next(r for r in dash.runs if r != first["run"])

    dash.filters["time"].index = (0, 0)  # the first call alone: one rollout, one run
    assert dash.filtered_calls().height == 1
    assert _points(_reward_trace(dash, other_run)) == {}
    own = _reward_trace(dash, first["run"], "num_calls")
    assert list(own.text) == [first["rollout_id"]]
    assert bar_labels(dash.figure_widgets["throughput"].data[0])[0].startswith(first["run"])

    other_model = next(m for m in dash.filters["model"].options if m != first["model"])
    dash.filters["model"].value = (other_model,)  # and no call left at all

    assert dash.filtered_calls().height == 0 and dash.filtered_rollouts().height == 0
    for name, figure in dash.figure_widgets.items():
        assert _same(figure.data, traces[name]), name  # the same trace objects, none added
    assert all(list(t.x) == [] and list(t.y) == [] for t in dash.figure_widgets["throughput"].data)
    reward = dash.figure_widgets["reward"]
    assert all(list(t.x) == [] and list(t.y) == [] for t in reward.data)
    assert reward.layout.annotations[0].text == "tokens_total (0 / 0 rollouts known)"


def test_reward_points_are_sampled_above_max_points(runs: list[ngv.CaptureRun]) -> None:
    dash = CaptureDashboard(runs, max_points=20)  # 10 points per run and panel
    n_traces = len(dash.figure_widgets["reward"].data)

    dash.filters["dialect"].value = ("chat", "messages")

    figure = dash.figure_widgets["reward"]
    assert len(figure.data) == n_traces
    kept = dash.filtered_rollouts()
    for run in ("a", "b"):
        known = _known(kept, run)
        assert known.height > 10
        shown = _points(_reward_trace(dash, run))
        assert len(shown) == 10
        assert shown.items() <= _expected_points(known).items()
        mean_line = figure.data[_reward_index(dash, run) + 1]
        assert sum(mean_line.customdata) == known.height  # the means use every rollout
    assert figure.layout.title.text.startswith("Reward against per-rollout totals (sampled)")
