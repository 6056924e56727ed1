"""pandas at the edge: frames out round-trip, frames in give the Polars result."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core.testing import RunSpec, write_run
from ngcapture_viz import stats
from ngcapture_viz.figures.bars import throughput_figure
from ngcapture_viz.figures.latency import latency_figure
from ngcapture_viz.figures.over_time import calls_over_time_figure, error_figure
from ngcapture_viz.figures.reward import reward_figure
from ngcapture_viz.figures.tokens import token_figure
from ngcapture_viz.interop import PANDAS_HINT, to_polars

BY = ["run", "model", "dialect"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ngv.CaptureRun:
    root: Path = tmp_path_factory.mktemp("pandas")
    written = write_run(root, RunSpec(tasks=12, repeats=2, calls=(1, 5), seed=9))
    return ngv.open_run(written.capture_dir, written.rollouts, label="p", index=False)


def test_to_pandas_round_trips_every_frame_its_columns_and_nulls(run: ngv.CaptureRun) -> None:
    frames = run.to_pandas()
    assert list(frames) == ["calls", "rollouts", "gaps", "tool_calls", "invocations",
                            "tool_executions", "compactions", "sandboxes", "perf",
                            "tokens"]  # fmt: skip
    for name, pdf in frames.items():
        original = getattr(run, name)
        assert isinstance(pdf, pd.DataFrame)
        assert list(pdf.columns) == original.columns
        assert len(pdf) == original.height
        for column in original.columns:  # null stays null (never 0 or NaN-as-number)
            assert int(pdf[column].isna().sum()) == original[column].null_count(), column
        back = pl.from_pandas(pdf)
        assert back.schema == original.schema, name
        assert back.equals(original), name
    assert run.calls["tokens_in"].null_count() > 0  # the check above saw real nulls


@pytest.mark.parametrize("pyarrow_backed", [True, False])
def test_public_functions_give_the_polars_result_for_a_pandas_input(
    run: ngv.CaptureRun, pyarrow_backed: bool
) -> None:
    calls, rollouts = run.calls, run.rollouts
    pcalls = calls.to_pandas(use_pyarrow_extension_array=pyarrow_backed)
    prollouts = rollouts.to_pandas(use_pyarrow_extension_array=pyarrow_backed)
    for function in (
        stats.latency_percentiles,
        stats.token_summary,
        stats.throughput_summary,
        stats.latency_distribution,
    ):
        assert function(pcalls, BY).equals(function(calls, BY)), function.__name__
    assert stats.error_rates(pcalls).equals(stats.error_rates(calls))
    assert stats.coverage(pcalls).equals(stats.coverage(calls))
    assert stats.token_histogram(pcalls).equals(stats.token_histogram(calls))
    assert stats.calls_over_time(pcalls).equals(stats.calls_over_time(calls))
    assert stats.time_interval(pcalls) == stats.time_interval(calls)
    assert ngv.assign_lanes(pcalls)["lane"].to_list() == ngv.assign_lanes(calls)["lane"].to_list()
    histogram, coverage = stats.token_histogram(calls), stats.coverage(calls)
    same = [
        (
            token_figure(histogram.to_pandas(), coverage.to_pandas(), ["p"]),
            token_figure(histogram, coverage, ["p"]),
        ),
        (
            latency_figure(
                stats.latency_percentiles(calls, BY).to_pandas(),
                BY,
                distribution=stats.latency_distribution(calls, BY).to_pandas(),
            ),
            latency_figure(
                stats.latency_percentiles(calls, BY),
                BY,
                distribution=stats.latency_distribution(calls, BY),
            ),
        ),
        (
            throughput_figure(stats.throughput_summary(calls, BY).to_pandas(), BY),
            throughput_figure(stats.throughput_summary(calls, BY), BY),
        ),
        (
            error_figure(stats.error_rates(calls).to_pandas(), ["p"]),
            error_figure(stats.error_rates(calls), ["p"]),
        ),
        (
            calls_over_time_figure(stats.calls_over_time(calls).to_pandas(), ["p"]),
            calls_over_time_figure(stats.calls_over_time(calls), ["p"]),
        ),
        (reward_figure(prollouts, ["p"]), reward_figure(rollouts, ["p"])),
    ]
    for from_pandas, from_polars in same:
        assert isinstance(from_pandas, go.Figure)
        assert from_pandas.to_json() == from_polars.to_json()
    rebuilt = ngv.CaptureRun(
        "p",
        calls=pcalls,
        rollouts=prollouts,
        gaps=run.gaps.to_pandas(use_pyarrow_extension_array=pyarrow_backed),
        tool_calls=run.tool_calls.to_pandas(use_pyarrow_extension_array=pyarrow_backed),
    )
    assert rebuilt.calls.schema == calls.schema
    assert ngv.summary_metrics(rebuilt) == ngv.summary_metrics(run)


def test_without_the_extra_the_error_names_it(
    run: ngv.CaptureRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a)
    )
    with pytest.raises(ngv.MissingExtraError, match=PANDAS_HINT.replace("[", r"\[")):
        run.to_pandas()
    with pytest.raises(TypeError, match="Polars or pandas"):
        to_polars([1, 2, 3])
