"""The dashboard tables equal independent Polars computations, and the figures plot the tables."""

from __future__ import annotations

import time
from pathlib import Path

import plotly.graph_objects as go
import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core.testing import RunSpec, write_run
from ngcapture_viz.figures.dashboard import (
    HORIZONTAL_FROM,
    dashboard,
    latency_figure,
    throughput_figure,
)
from ngcapture_viz.figures.reward import MAX_BINS, MIN_PER_BIN, SVG_MAX_POINTS, reward_figure
from ngcapture_viz.figures.tokens import constant_value
from ngcapture_viz.frames import CALLS
from ngcapture_viz.stats import (
    ANY_ERROR,
    PERCENTILES,
    TOKEN_METRICS,
    error_rates,
    latency_percentiles,
    throughput_summary,
    token_histogram,
    token_summary,
)
from tests.ngcapture_viz.conftest import bar_values


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[ngv.CaptureRun, ngv.CaptureRun]:
    root: Path = tmp_path_factory.mktemp("dash")
    opened = []
    for label, seed, scale in (("a", 1, 1.0), ("b", 2, 1.3)):
        spec = RunSpec(tasks=25, repeats=2, calls=(1, 6), seed=seed, latency_scale=scale)
        written = write_run(root / label, spec)
        opened.append(ngv.open_run(written.capture_dir, written.rollouts, label=label, index=False))
    return opened[0], opened[1]


@pytest.fixture(scope="module")
def stacked(runs: tuple[ngv.CaptureRun, ngv.CaptureRun]) -> ngv.CaptureRun:
    return ngv.stack_runs(list(runs))


def _group_filter(row: dict[str, object], keys: list[str]) -> pl.Expr:
    expr = pl.lit(True)
    for key in keys:
        value = row[key]
        column = pl.col(key).cast(pl.String)
        expr = expr & (column.is_null() if value is None else column == value)
    return expr


def test_latency_percentiles_equal_polars_quantiles(stacked: ngv.CaptureRun) -> None:
    calls = stacked.calls
    keys = ["run", "model", "dialect"]
    table = latency_percentiles(calls)
    assert table.height == 2 * calls.select(keys).unique().height
    for row in table.iter_rows(named=True):
        group = calls.filter(_group_filter(row, keys))
        values = group[row["metric"]].drop_nulls()
        assert row["n_calls"] == group.height
        assert row["n_reported"] == values.len()
        assert row["coverage"] == pytest.approx(values.len() / group.height)
        streamed = group.filter(pl.col("stream"))
        assert row["n_streamed"] == streamed.height
        assert row["n_reported_streamed"] == streamed[row["metric"]].is_not_null().sum()
        for name, q in PERCENTILES.items():
            assert row[name] == values.quantile(q, interpolation="linear"), (row, name)
        assert row["mean"] == pytest.approx(values.mean())


def test_token_coverage_counts_what_was_reported(stacked: ngv.CaptureRun) -> None:
    calls = stacked.calls
    table = token_summary(calls, by=("run",))
    assert table.schema["sum"] == pl.Int64 and table.schema["coverage"] == pl.Float64
    partial = 0
    for row in table.iter_rows(named=True):
        values = calls.filter(pl.col("run") == row["run"])[row["metric"]]
        assert row["n_reported"] == values.is_not_null().sum()
        assert row["sum"] == values.sum()
        expected = values.drop_nulls().quantile(0.95, interpolation="linear")
        assert row["p95"] == pytest.approx(expected, rel=1e-12)  # int → float rounding only
        partial += row["coverage"] < 1
    # the synthetic runs leave some counts unreported: coverage must show it
    assert partial > 0
    reasoning = table.filter(pl.col("metric") == "tokens_reasoning")["n_reported"].sum()
    assert reasoning == calls["tokens_reasoning"].is_not_null().sum() < calls.height


def test_group_that_reported_nothing_is_null_not_zero() -> None:
    calls = CALLS.from_rows(
        [
            {"run": "a", "model": "m1", "tokens_reasoning": 7, "latency_total_ms": 10.0},
            {"run": "a", "model": "m1", "tokens_reasoning": None, "latency_total_ms": 30.0},
            {"run": "a", "model": "m2", "tokens_reasoning": None, "output_tokens_per_s": None},
        ]
    )
    tokens = token_summary(calls, by=("model",)).filter(pl.col("metric") == "tokens_reasoning")
    assert tokens.select("model", "n_calls", "n_reported", "coverage", "sum").rows() == [
        ("m1", 2, 1, 0.5, 7),
        ("m2", 1, 0, 0.0, None),
    ]
    assert tokens.filter(pl.col("model") == "m2")[["mean", "p50", "p95"]].row(0) == (None,) * 3
    latency = latency_percentiles(calls, by=("model",))
    m2 = latency.filter((pl.col("model") == "m2") & (pl.col("metric") == "latency_total_ms"))
    assert (
        m2.select("n_reported", "coverage", "p50", "p99", "mean").row(0) == (0, 0.0) + (None,) * 3
    )
    m1 = latency.filter((pl.col("model") == "m1") & (pl.col("metric") == "latency_total_ms"))
    assert m1.select("p50", "p90", "mean").row(0) == pytest.approx((20.0, 28.0, 20.0))
    speed = throughput_summary(calls, by=("model",))
    assert speed.select("n_reported", "p50").rows() == [(0, None), (0, None)]


def test_error_rates_count_each_category(stacked: ngv.CaptureRun) -> None:
    calls = stacked.calls
    table = error_rates(calls, by=("run",))
    for row in table.iter_rows(named=True):
        run_calls = calls.filter(pl.col("run") == row["run"])
        failed = run_calls["error_category"].cast(pl.String)
        expected = (
            failed.is_not_null().sum()
            if row["error_category"] == ANY_ERROR
            else (failed == row["error_category"]).sum()
        )
        assert (row["calls"], row["errors"]) == (run_calls.height, expected)
        assert row["rate"] == pytest.approx(expected / run_calls.height)
    assert table.filter(pl.col("error_category") != ANY_ERROR)["errors"].sum() == (
        calls["error_category"].is_not_null().sum()
    )


def test_unknown_group_column_is_refused(stacked: ngv.CaptureRun) -> None:
    with pytest.raises(ValueError, match="nope"):
        latency_percentiles(stacked.calls, by=("run", "nope"))


def test_token_figure_bars_equal_histogram_with_coverage_titles(stacked: ngv.CaptureRun) -> None:
    dash = dashboard(stacked)
    fig, histogram = dash.figures["tokens"], dash.tables["token_histogram"]
    calls = stacked.calls
    titles = [a.text for a in fig.layout.annotations][: len(TOKEN_METRICS)]
    for metric, title in zip(TOKEN_METRICS, titles, strict=True):
        n = calls[metric].is_not_null().sum()
        assert title == f"{metric}<br><sup>{n:,}/{calls.height:,} reported</sup>"
    traces = iter(fig.data)
    for metric in TOKEN_METRICS:
        for run in ("a", "b"):
            trace = next(traces)
            assert trace.name == run
            rows = histogram.filter((pl.col("metric") == metric) & (pl.col("run") == run))
            if constant_value(histogram, metric) is not None:  # "all N" instead of a bar
                assert list(trace.x) == []
                continue
            assert list(trace.x) == rows["bin_start"].to_list()
            assert list(trace.y) == rows["count"].to_list()
            reported = calls.filter(pl.col("run") == run)[metric].is_not_null().sum()
            assert sum(trace.y) == reported


def test_token_histogram_bins_hold_every_reported_value(stacked: ngv.CaptureRun) -> None:
    histogram = token_histogram(stacked.calls, ("tokens_out",), bins=7)
    values = stacked.calls.filter(pl.col("run") == "a")["tokens_out"].drop_nulls()
    rows = histogram.filter(pl.col("run") == "a")
    for row in rows.iter_rows(named=True):
        inside = ((values >= row["bin_start"]) & (values < row["bin_end"])).sum()
        assert inside == row["count"]
    assert rows["count"].sum() == values.len()


def test_latency_figure_draws_each_groups_ecdf_with_its_percentiles(
    stacked: ngv.CaptureRun,
) -> None:
    dash = dashboard(stacked)
    table, fig = dash.tables["latency"], dash.figures["latency"]
    distribution = dash.tables["latency_distribution"]
    colors = {"a": fig.data[0].line.color}
    traces = iter(fig.data)
    for metric in ("latency_total_ms", "latency_ttft_ms"):
        rows = table.filter(pl.col("metric") == metric)
        for group in rows.iter_rows(named=True):
            curve, marks = next(traces), next(traces)
            label = f"{group['run']} · {group['model']} · {group['dialect']}"
            assert curve.meta == {"kind": "ecdf", "group": label, "metric": metric}
            assert label in curve.name and f"{group['n_reported']:,}/" in curve.name
            points = distribution.filter(
                pl.col("metric") == metric,
                pl.col("run") == group["run"],
                pl.col("model") == group["model"],
                pl.col("dialect") == group["dialect"],
                pl.col("value").is_not_null(),
            )
            assert list(curve.x) == points["value"].to_list()
            assert list(curve.y) == points["share"].to_list()
            assert list(curve.y) == sorted(curve.y) and list(curve.x) == sorted(curve.x)
            assert marks.meta["kind"] == "percentiles"
            assert list(marks.x) == [group[p] for p in PERCENTILES]
            assert list(marks.y) == list(PERCENTILES.values())
            if curve.x:  # each mark lies on its curve: p50 is the curve at 50 %
                assert marks.x[0] == pytest.approx(
                    points.filter(pl.col("share") == 0.5)["value"][0]
                )
            colors.setdefault(group["run"], curve.line.color)
            assert curve.line.color == marks.marker.color == colors[group["run"]]
    assert len(set(colors.values())) == 2  # one colour per run
    # The distribution matches Polars' own quantiles at every share.
    calls = stacked.calls.filter(pl.col("run") == "a")
    for share in (0.0, 0.3, 0.5, 0.9, 1.0):
        got = distribution.filter(
            pl.col("run") == "a", pl.col("metric") == "latency_total_ms", pl.col("share") == share
        )["value"].sort()
        expected = (
            calls.group_by("model", "dialect")
            .agg(pl.col("latency_total_ms").quantile(share, "linear"))["latency_total_ms"]
            .sort()
        )
        assert got.to_list() == pytest.approx(expected.to_list())


def test_stacked_runs_get_one_trace_per_run(
    runs: tuple[ngv.CaptureRun, ngv.CaptureRun], stacked: ngv.CaptureRun
) -> None:
    from_list = dashboard(list(runs))
    from_stack = dashboard(stacked)
    assert from_list.tables["latency"].equals(from_stack.tables["latency"])
    errors, table = from_list.figures["errors"], from_list.tables["errors"]
    assert [t.name for t in errors.data] == ["a", "b"]
    for trace in errors.data:
        rows = table.filter(pl.col("run") == trace.name)
        expected = dict(zip(rows["error_category"], rows["rate"], strict=True))
        assert dict(zip(trace.x, trace.y, strict=True)) == expected
    over_time, buckets = from_list.figures["over_time"], from_list.tables["over_time"]
    assert [t.name for t in over_time.data] == ["a", "a", "b", "b"]
    for run, calls_trace, tokens_trace in (
        ("a", over_time.data[0], over_time.data[1]),
        ("b", over_time.data[2], over_time.data[3]),
    ):
        run_calls = stacked.calls.filter(pl.col("run") == run)
        assert sum(y for y in calls_trace.y if y is not None) == run_calls.height
        mine = buckets.filter(pl.col("run") == run)
        drawn = [(x, y) for x, y in zip(calls_trace.x, calls_trace.y, strict=True) if y is not None]
        assert drawn == list(zip(mine["bucket"], mine["calls"], strict=True))
        assert sum(y for y in tokens_trace.y if y is not None) == run_calls["tokens_total"].sum()
    reward = from_list.figures["reward"]
    scatter = [t for t in reward.data if t.mode == "markers"]
    assert [t.name for t in scatter] == ["a", "b"] * 3


def test_throughput_figure_plots_the_table(stacked: ngv.CaptureRun) -> None:
    dash = dashboard(stacked)
    table, fig = dash.tables["throughput"], dash.figures["throughput"]
    assert bar_values(fig.data[0]) == table["p50"].to_list()
    assert bar_values(fig.data[1]) == table["p95"].to_list()
    reported = stacked.calls["output_tokens_per_s"].is_not_null().sum()
    assert table["n_reported"].sum() == reported


def test_reward_scatter_matches_rollouts_and_samples_above_cap(stacked: ngv.CaptureRun) -> None:
    full = dashboard(stacked).figures["reward"]
    rollouts = stacked.rollouts.filter(pl.col("run") == "a")
    trace = next(t for t in full.data if t.name == "a" and t.xaxis == "x")
    known = rollouts.filter(pl.col("reward").is_not_null() & pl.col("tokens_total").is_not_null())
    assert sorted(zip(trace.x, trace.y, strict=True)) == sorted(
        known.select("tokens_total", "reward").rows()
    )
    mean_line = next(t for t in full.data if t.name == "a binned mean" and t.xaxis == "x")
    assert list(mean_line.x) == sorted(mean_line.x)
    assert sum(mean_line.customdata) == known.height
    assert len(mean_line.x) == max(1, min(MAX_BINS, known.height // MIN_PER_BIN))
    assert min(mean_line.customdata) >= min(MIN_PER_BIN, known.height)  # no bin of a few points
    weighted = sum(y * n for y, n in zip(mean_line.y, mean_line.customdata, strict=True))
    assert weighted / known.height == pytest.approx(known["reward"].mean())
    assert all(w >= 0 for w in mean_line.error_y.array)
    capped = dashboard(stacked, max_points=20).figures["reward"]
    scatter = [t for t in capped.data if t.mode == "markers"]
    assert len(scatter) == 6
    assert {t.type for t in scatter} == {"scatter"}  # few points: SVG, any plotly.js bundle
    assert all(len(t.x) == 10 for t in scatter)  # 20 points shared by two runs
    assert all(len(t.x) <= MAX_BINS for t in capped.data if t.name.endswith("binned mean"))
    assert capped.layout.title.text.endswith("(points sampled)")
    # A budget that holds every run's rollouts samples nothing, though all runs together
    # exceed one run's share.
    largest = stacked.rollouts.group_by("run").len()["len"].max()
    exact = dashboard(stacked, max_points=2 * largest).figures["reward"]
    assert "sampled" not in exact.layout.title.text


def _points(trace: go.Figure) -> int:
    return max(len(v) if (v := getattr(trace, axis)) is not None else 0 for axis in ("x", "y"))


def test_100k_calls_build_fast_without_a_marker_per_call(runs: tuple[ngv.CaptureRun, ...]) -> None:
    base = runs[0]
    n = 100_000
    calls = pl.concat([base.calls] * (n // base.calls.height + 1)).head(n)
    rollouts = pl.concat([base.rollouts] * (n // base.rollouts.height + 1)).head(n // 3)
    big = ngv.CaptureRun(
        "a", calls=calls, rollouts=rollouts, gaps=base.gaps, tool_calls=base.tool_calls
    )
    started = time.perf_counter()
    dash = dashboard(big, max_points=5_000)
    elapsed = time.perf_counter() - started
    assert elapsed < 15, elapsed  # measured ~0.3 s; generous for a shared box
    for name, fig in dash.figures.items():
        for trace in fig.data:
            assert _points(trace) <= 5_000, (name, trace.name)
    assert sum(dash.figures["tokens"].data[1].y) == calls["tokens_out"].is_not_null().sum()
    assert dash.tables["latency"]["n_calls"].sum() == 2 * n
    assert dash.tables["latency_distribution"].height <= 2 * 51 * dash.tables["latency"].height


def test_many_groups_lie_down_with_every_value_on_the_value_axis(stacked: ngv.CaptureRun) -> None:
    models = [f"model-{i}" for i in range(6)]
    calls = stacked.calls.with_columns(
        pl.Series("model", [models[i % 6] for i in range(stacked.calls.height)]).cast(
            pl.Categorical()
        )
    )
    by = ["run", "model", "dialect"]
    table = latency_percentiles(calls, by)
    groups = table.filter(pl.col("metric") == "latency_total_ms").height
    assert groups >= HORIZONTAL_FROM
    fig = latency_figure(table, by)  # marks only: one trace per group and panel
    assert len(fig.data) == 2 * groups
    assert {t.meta["kind"] for t in fig.data} == {"percentiles"}
    throughput = throughput_summary(calls, by)
    lying = throughput_figure(throughput, by)
    assert [t.orientation for t in lying.data] == ["h", "h"]
    assert list(lying.data[0].x) == throughput["p50"].to_list()
    few = throughput_figure(throughput.head(HORIZONTAL_FROM - 1), by)
    assert [t.orientation for t in few.data] == ["v", "v"]
    assert list(few.data[1].y) == throughput.head(HORIZONTAL_FROM - 1)["p95"].to_list()


def test_constant_tokens_error_free_runs_and_idle_spells_draw_honestly(
    stacked: ngv.CaptureRun,
) -> None:
    """All-zero reasoning: 'all 0', no bar; no errors: 0-5 % axis; idle buckets: gaps."""
    calls = stacked.calls.with_columns(
        pl.lit(0, pl.Int64).alias("tokens_reasoning"),
        pl.lit(None, pl.String)
        .cast(stacked.calls.schema["error_category"])
        .alias("error_category"),
    )
    # Half of run a's calls start an hour later: an idle spell inside run a's span.
    late = (pl.col("run") == "a") & (pl.col("call_index") % 2 == 1)
    calls = calls.with_columns(
        pl.when(late)
        .then(pl.col("started_at") + pl.duration(hours=1))
        .otherwise(pl.col("started_at"))
        .alias("started_at")
    )
    run = ngv.CaptureRun(
        None, calls=calls, rollouts=stacked.rollouts, gaps=stacked.gaps,
        tool_calls=stacked.tool_calls, runs=stacked.runs,
    )  # fmt: skip
    board = dashboard(run)
    tokens = board.figures["tokens"]
    note = next(a for a in tokens.layout.annotations if a.name == "constant:tokens_reasoning")
    assert note.text.startswith("all 0")
    reasoning = [t for t in tokens.data if t.xaxis == "x3"]
    assert reasoning and all(list(t.x) == [] for t in reasoning)
    errors = board.figures["errors"]
    assert list(errors.layout.yaxis.range) == [0, 0.05]
    assert any(a.name == "no-errors" and a.text.startswith("no errors in") for a in
               errors.layout.annotations)  # fmt: skip
    a_calls = board.figures["over_time"].data[0]
    assert a_calls.connectgaps is False
    ys = list(a_calls.y)
    drawn = [i for i, y in enumerate(ys) if y is not None]
    # Between the early and the late calls every bucket is a gap (null), not a line.
    assert ys[drawn[0] : drawn[-1]].count(None) > 10
    assert sum(y for y in ys if y is not None) == calls.filter(pl.col("run") == "a").height


def test_coverage_counts_each_metric_in_one_pass(stacked: ngv.CaptureRun) -> None:
    from ngcapture_viz.stats import coverage, token_summary

    for by in (("run",), ("run", "model"), ()):
        counted = coverage(stacked.calls, by=by)
        summary = token_summary(stacked.calls, by).select(*by, "metric", "n_calls", "n_reported")
        assert counted.drop("coverage").equals(summary), by
        for row in counted.iter_rows(named=True):
            assert row["coverage"] == pytest.approx(row["n_reported"] / row["n_calls"])


def test_reward_points_turn_webgl_only_above_the_svg_limit() -> None:
    def figure(n: int) -> go.Figure:
        rollouts = pl.DataFrame(
            {
                "run": ["a"] * n,
                "rollout_id": [f"r{i}" for i in range(n)],
                "reward": [i % 2 for i in range(n)],
                "tokens_total": list(range(n)),
                "latency_total_ms": [float(i) for i in range(n)],
                "num_calls": [1 + i % 3 for i in range(n)],
            }
        )
        return reward_figure(rollouts, ["a"])

    at_limit = [t for t in figure(SVG_MAX_POINTS).data if t.mode == "markers"]
    above = [t for t in figure(SVG_MAX_POINTS + 1).data if t.mode == "markers"]
    assert {t.type for t in at_limit} == {"scatter"}
    assert {t.type for t in above} == {"scattergl"}
    assert all(len(t.x) == SVG_MAX_POINTS + 1 for t in above)
