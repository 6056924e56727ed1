"""Checkpoint diff: calibration of the task bootstrap, pairing, null handling and the gate.

Most runs here are built in memory (calls and rollouts frames wrapped in a ``CaptureRun``) so
hundreds of simulated checkpoint pairs stay fast; the end-to-end tests write real stores.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import polars as pl
import pytest

from capture_core.testing import RunSpec, write_run
from ngcapture_viz import CALLS, GAPS, ROLLOUTS, TOOL_CALLS, CaptureRun, open_run, stack_runs
from ngcapture_viz.diff import DIFF_SCHEMA, METRIC_NAMES, assert_no_regression, diff
from ngcapture_viz.diff.bootstrap import (
    holm,
    quantile_replicates,
    ratio_replicates,
    resample_clusters,
)
from ngcapture_viz.exceptions import RegressionError


def make_run(
    label: str,
    effects: dict[int, float],
    *,
    scale: float = 1.0,
    seed: int = 0,
    repeats: int = 2,
    calls: tuple[int, int] = (1, 6),
    tokens: bool = True,
) -> CaptureRun:
    """A run over ``effects`` (task → slowness): latency = 100 ms × slowness × noise × scale."""
    rng = random.Random(seed)
    c: dict[str, list[object]] = {
        k: [] for k in ("rollout_id", "call_index", "latency_total_ms", "tokens_in", "outcome")
    }
    r: dict[str, list[object]] = {
        k: [] for k in ("rollout_id", "task_id", "task_index", "rollout_index", "num_gaps")
    }
    for task, effect in effects.items():
        for repeat in range(repeats):
            rollout_id = f"{task}-{repeat}"
            for key, value in zip(
                r, (rollout_id, f"task-{task:03d}", task, repeat, 0), strict=True
            ):
                r[key].append(value)
            for index in range(rng.randint(*calls)):
                latency = 100.0 * effect * rng.lognormvariate(0.0, 0.5) * scale
                row = (rollout_id, index, latency, rng.randint(10, 99) if tokens else None, "ok")
                for key, value in zip(c, row, strict=True):
                    c[key].append(value)
    run = pl.lit(label, dtype=pl.Categorical())
    return CaptureRun(
        label,
        calls=CALLS.conform(pl.DataFrame(c).with_columns(run=run)),
        rollouts=ROLLOUTS.conform(pl.DataFrame(r).with_columns(run=run)),
        gaps=GAPS.empty(),
        tool_calls=TOOL_CALLS.empty(),
    )


def population(rng: random.Random, tasks: int) -> dict[int, float]:
    """Tasks drawn from a population: each task's slowness is lognormal (σ = 0.35)."""
    return {task: rng.lognormvariate(0.0, 0.35) for task in range(tasks)}


CALIBRATED = ("latency_mean_ms", "latency_p50_ms")


def simulated_pairs(shift: float, trials: int, *, first_seed: int) -> list[dict[str, dict]]:
    """``trials`` checkpoint pairs on fresh tasks: b's latencies are a's population × shift."""
    return [simulated_pair(shift, first_seed, trial) for trial in range(trials)]


@functools.cache  # the same trials serve two tests: computed once (they are not changed)
def simulated_pair(shift: float, first_seed: int, trial: int) -> dict[str, dict]:
    rng = random.Random(first_seed + trial)
    effects = population(rng, 100)
    a = make_run("a", effects, seed=rng.randrange(1 << 30))
    b = make_run("b", effects, seed=rng.randrange(1 << 30), scale=shift)
    d = diff(a, b, metrics=CALIBRATED, n_boot=300, seed=trial)
    return {m: d.row(m) for m in CALIBRATED}


def test_intervals_cover_a_known_shift_at_the_stated_rate() -> None:
    # Every latency of b is 1.1 × a draw from a's distribution on the same tasks (fresh
    # per-call noise and call counts), so the population mean and median both rise by
    # exactly 10 %: the estimand of rel_diff is 0.10 for both metrics.
    pairs = simulated_pairs(1.1, 200, first_seed=10_000)
    for metric in CALIBRATED:
        covered = sum(p[metric]["rel_ci_low"] <= 0.10 <= p[metric]["rel_ci_high"] for p in pairs)
        assert 0.90 <= covered / len(pairs) <= 0.98, (metric, covered)
        # ...and they are informative: 100 tasks detect +10 % in most trials.
        assert sum(p[metric]["ci_excludes_zero"] for p in pairs) / len(pairs) > 0.5, metric


def test_without_a_shift_few_intervals_exclude_zero() -> None:
    pairs = simulated_pairs(1.0, 200, first_seed=50_000)
    for metric in CALIBRATED:
        excluded = sum(p[metric]["ci_excludes_zero"] for p in pairs)
        assert excluded / len(pairs) <= 0.08, (metric, excluded)
        assert excluded > 0  # the intervals are not trivially wide
        rejected = sum(p[metric]["p_value"] < 0.05 for p in pairs)
        assert 0 < rejected / len(pairs) <= 0.08, (metric, rejected)
    _p_values_agree_with_the_intervals(pairs)


def _p_values_agree_with_the_intervals(pairs: list[dict[str, dict]], n_boot: int = 300) -> None:
    """p < 5 % exactly when the 95 % interval excludes 0, away from the resolution 1/(B+1)."""
    checked = 0
    for pair in pairs:
        for row in pair.values():
            assert 0 < row["p_value"] <= row["p_holm"] <= 1
            if abs(row["p_value"] - 0.05) > 3 / (n_boot + 1):
                assert (row["p_value"] < 0.05) == row["ci_excludes_zero"], row
                checked += 1
    assert checked > 0.8 * 2 * len(pairs)


def test_p_values_track_a_real_shift() -> None:
    pairs = simulated_pairs(1.1, 60, first_seed=10_000)
    for metric in CALIBRATED:
        assert sum(p[metric]["p_value"] < 0.05 for p in pairs) / len(pairs) > 0.5, metric
    _p_values_agree_with_the_intervals(pairs)


def test_holm_keeps_the_family_wise_error_rate() -> None:
    # 16 metrics with no real change (independent uniform p-values): raw p < 5 % somewhere in
    # most families; after Holm, in at most ~5 % of them.
    rng = random.Random(5)
    families = 2000
    raw_any = holm_any = 0
    for _ in range(families):
        p = {f"m{i}": rng.random() for i in range(16)}
        adjusted = holm(p)
        raw_any += min(p.values()) < 0.05
        holm_any += min(v for v in adjusted.values() if v is not None) < 0.05
        assert all(adjusted[k] is not None and adjusted[k] >= p[k] for k in p)
        order = sorted(p, key=p.__getitem__)  # monotone in the raw order
        assert [adjusted[k] for k in order] == sorted(adjusted[k] for k in order)
    assert raw_any / families > 0.5
    assert holm_any / families <= 0.065, holm_any
    assert holm({"a": 0.01, "b": None, "c": 0.04}) == {"a": 0.02, "b": None, "c": 0.04}


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory: pytest.TempPathFactory) -> CaptureRun:
    root = tmp_path_factory.mktemp("self")
    written = write_run(root, RunSpec(tasks=12, repeats=2, seed=3))
    return open_run(written.capture_dir, written.rollouts, label="ckpt")


def test_a_run_diffed_with_itself_is_exactly_zero(stored_run: CaptureRun) -> None:
    d = diff(stored_run, stored_run, n_boot=300)
    frame = d.frame
    assert frame.schema == DIFF_SCHEMA
    assert frame["metric"].to_list() == list(METRIC_NAMES)
    assert d.paired and d.only_a == () and d.only_b == () and d.excluded_a == 0
    known = frame.filter(pl.col("value_a").is_not_null())
    assert known.height >= 12  # the synthetic run reports every metric but a few
    assert (known["value_a"] == known["value_b"]).all()
    assert (known["diff"] == 0.0).all()
    assert (known["ci_low"] == 0.0).all() and (known["ci_high"] == 0.0).all()
    rel = known.filter(pl.col("rel_ci_low").is_not_null())
    assert rel.height >= 8 and (rel["rel_ci_low"] == 0).all() and (rel["rel_ci_high"] == 0).all()
    assert not known["ci_excludes_zero"].any()
    assert (known["p_value"] == 1.0).all() and (known["p_holm"] == 1.0).all()
    assert frame.filter(pl.col("value_a").is_null())["p_value"].is_null().all()
    assert (known["n_a"] == known["n_b"]).all()
    fig = d.figure()
    for trace in fig.data:
        assert set(trace.x) == {0.0}
        assert set(trace.error_x.array) == {0.0} and set(trace.error_x.arrayminus) == {0.0}


def test_rollouts_of_one_run_only_are_reported_and_left_out() -> None:
    rng = random.Random(1)
    effects = population(rng, 12)
    a = make_run("a", {t: effects[t] for t in range(10)}, seed=1)
    b = make_run("b", {t: effects[t] for t in range(2, 12)}, seed=2)
    d = diff(a, b, metrics=["latency_mean_ms", "calls_per_rollout"], n_boot=200)
    assert d.paired
    assert d.only_a == ("task-000", "task-001")
    assert d.only_b == ("task-010", "task-011")
    assert (d.excluded_a, d.excluded_b) == (4, 4)
    row = d.row("latency_mean_ms")
    assert (row["tasks_a"], row["tasks_b"]) == (8, 8)
    shared = a.calls.filter(~pl.col("rollout_id").str.starts_with("0-"))
    shared = shared.filter(~pl.col("rollout_id").str.starts_with("1-"))
    assert row["value_a"] == pytest.approx(shared["latency_total_ms"].mean())
    assert row["n_a"] == shared.height
    text = str(d)
    assert "only in a: 2 tasks, left out (4 rollouts): task-000, task-001" in text
    assert "only in b: 2 tasks, left out (4 rollouts): task-010, task-011" in text


def test_by_rollout_matches_repeats() -> None:
    effects = population(random.Random(2), 6)
    a = make_run("a", effects, seed=1, repeats=3)
    b = make_run("b", effects, seed=2, repeats=2)
    by_task = diff(a, b, metrics=["calls_per_rollout"], n_boot=50)
    assert by_task.only_a == () and by_task.excluded_a == 0
    by_rollout = diff(a, b, by="rollout", metrics=["calls_per_rollout"], n_boot=50)
    assert by_rollout.only_a == tuple(sorted(f"{t}-2" for t in range(6)))
    assert by_rollout.excluded_a == 6 and by_rollout.only_b == ()
    assert by_rollout.row("calls_per_rollout")["n_a"] == 12


def test_disjoint_task_sets_fall_back_to_unpaired() -> None:
    effects = population(random.Random(3), 20)
    a = make_run("a", {t: effects[t] for t in range(10)}, seed=1)
    b = make_run("b", {t: effects[t] for t in range(10, 20)}, seed=2)
    d = diff(a, b, metrics=["latency_mean_ms"], n_boot=200)
    assert not d.paired
    assert len(d.only_a) == 10 and len(d.only_b) == 10 and d.excluded_a == 0
    row = d.row("latency_mean_ms")
    assert (row["tasks_a"], row["tasks_b"]) == (10, 10)
    assert row["value_a"] == pytest.approx(a.calls["latency_total_ms"].mean())
    assert row["ci_low"] < row["diff"] < row["ci_high"]
    assert "unpaired" in str(d).splitlines()[0] and "compared unpaired" in str(d)
    with pytest.raises(ValueError, match="share no task"):
        diff(a, b, paired=True)


def test_a_small_overlap_is_compared_unpaired_not_on_the_overlap_alone() -> None:
    effects = population(random.Random(6), 40)
    a = make_run("a", {t: effects[t] for t in range(20)}, seed=1)
    b = make_run("b", {t: effects[t] for t in range(19, 40)}, seed=2, scale=1.5)
    d = diff(a, b, metrics=["latency_mean_ms"], n_boot=200)
    assert not d.paired and d.shared == 1
    assert (d.excluded_a, d.excluded_b) == (0, 0)  # every rollout is used
    assert len(d.only_a) == 19 and len(d.only_b) == 20
    row = d.row("latency_mean_ms")
    assert (row["tasks_a"], row["tasks_b"]) == (20, 21)
    assert row["value_a"] == pytest.approx(a.calls["latency_total_ms"].mean())
    assert row["ci_low"] is not None and row["ci_low"] < row["diff"] < row["ci_high"]
    assert "shared tasks: 1, too few to pair" in d.summary
    chosen = diff(a, b, metrics=["latency_mean_ms"], n_boot=50, paired=False)
    assert "shared tasks: 1, unpaired by choice" in chosen.summary
    forced = diff(a, b, metrics=["latency_mean_ms"], n_boot=200, paired=True)
    assert forced.paired and forced.tasks_a == 1 and forced.excluded_a == 38
    # Half of the larger run shared: paired on the shared half, the rest listed.
    c = make_run("c", {t: effects[t] for t in range(10, 30)}, seed=3)
    half = diff(a, c, metrics=["latency_mean_ms"], n_boot=200)
    assert half.paired and half.tasks_a == 10 and half.shared == 10
    assert len(half.only_a) == 10 and len(half.only_b) == 10


def test_unknown_values_are_left_out_not_counted_as_zero() -> None:
    effects = population(random.Random(4), 10)
    a = make_run("a", effects, seed=1)
    # Half of b's tasks did not report tokens: their calls leave the token means alone.
    b = make_run("b", effects, seed=1)
    silent = pl.col("rollout_id").str.extract(r"^(\d+)-").cast(pl.Int64) < 5
    b.calls = b.calls.with_columns(pl.when(~silent).then(pl.col("tokens_in")).alias("tokens_in"))
    d = diff(a, b, metrics=["tokens_in_per_call", "tokens_in_per_rollout"], n_boot=200)
    per_call = d.row("tokens_in_per_call")
    reported = b.calls.filter(~silent)
    assert per_call["value_b"] == pytest.approx(reported["tokens_in"].mean())
    assert per_call["n_b"] == reported.height
    assert per_call["coverage_b"] == pytest.approx(reported.height / b.calls.height)
    assert per_call["coverage_a"] == 1.0
    per_rollout = d.row("tokens_in_per_rollout")
    assert per_rollout["n_b"] == 10 and per_rollout["coverage_b"] == 0.5
    totals = reported.group_by("rollout_id").agg(pl.col("tokens_in").sum())
    assert per_rollout["value_b"] == pytest.approx(totals["tokens_in"].mean())


def test_regression_gate_fails_only_when_confident() -> None:
    effects = population(random.Random(5), 40)
    a = make_run("a", effects, seed=1)
    b = make_run("b", effects, seed=2, scale=1.5, tokens=False)
    d = diff(a, b, n_boot=500)
    row = d.row("latency_mean_ms")
    assert row["rel_ci_low"] > 0.2
    with pytest.raises(RegressionError) as caught:
        assert_no_regression(d, "latency_mean_ms", 0.10)
    message = str(caught.value)
    assert isinstance(caught.value, AssertionError)
    assert "latency_mean_ms" in message and "+10.0%" in message
    assert f"{row['rel_diff']:+.1%}" in message and f"{row['rel_ci_low']:+.1%}" in message
    # The point estimate exceeds this limit but the interval does not lie above it: passes.
    limit = (row["rel_ci_low"] + row["rel_diff"]) / 2
    assert_no_regression(d, "latency_mean_ms", limit)
    assert_no_regression(d, "latency_mean_ms", 1.0)
    assert_no_regression(d, "latency_mean_ms", row["ci_low"] + 1.0, relative=False)
    with pytest.raises(RegressionError, match="ms"):
        assert_no_regression(d, "latency_mean_ms", row["ci_low"] - 1.0, relative=False)
    with pytest.raises(RegressionError, match="cannot be checked") as caught:
        assert_no_regression(d, "tokens_in_per_call", 0.5)  # b reported no tokens
    assert "unknown (" in str(caught.value) and "relative=False" not in str(caught.value)
    with pytest.raises(ValueError, match="latency_p95_ms"):
        assert_no_regression(d, "latency", 0.1)


def test_a_limit_that_is_not_a_finite_number_is_refused() -> None:
    effects = population(random.Random(8), 6)
    d = diff(make_run("a", effects, seed=1), make_run("b", effects, seed=2), n_boot=50)
    for limit in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number"):
            assert_no_regression(d, "latency_mean_ms", limit)


def test_rates_from_zero_are_gated_in_absolute_terms() -> None:
    effects = population(random.Random(9), 30)
    a, b = make_run("a", effects, seed=1), make_run("b", effects, seed=2)
    first = pl.when(pl.col("call_index") == 0).then(pl.lit("timeout"))
    b.calls = b.calls.with_columns(first.cast(pl.Categorical).alias("error_category"))
    d = diff(a, b, metrics=["error_rate"], n_boot=300)
    row = d.row("error_rate")
    assert row["value_a"] == 0.0 and row["rel_diff"] is None and row["ci_low"] > 0.2
    with pytest.raises(RegressionError, match="relative=False"):
        assert_no_regression(d, "error_rate", 0.5)
    with pytest.raises(RegressionError, match=r"allowed increase \+5\.00 pp"):
        assert_no_regression(d, "error_rate", 0.05, relative=False)
    assert_no_regression(d, "error_rate", 0.9, relative=False)


def test_end_to_end_latency_scale(tmp_path: Path) -> None:
    slow = write_run(tmp_path / "slow", RunSpec(tasks=40, latency_scale=1.3, seed=1, task_seed=0))
    base = write_run(tmp_path / "base", RunSpec(tasks=40, latency_scale=1.0, seed=2, task_seed=0))
    both = stack_runs(
        [
            open_run(base.capture_dir, base.rollouts, label="base", index=False),
            open_run(slow.capture_dir, slow.rollouts, label="slow", index=False),
        ]
    )
    d = diff(both, n_boot=1000)
    assert (d.label_a, d.label_b, d.pair_key) == ("base", "slow", "task_id") and d.paired
    for metric in ("latency_mean_ms", "latency_p50_ms"):
        row = d.row(metric)
        assert row["ci_excludes_zero"], row
        assert row["rel_ci_low"] < 0.30 < row["rel_ci_high"], row
    assert not d.row("tokens_in_per_call")["ci_excludes_zero"]
    with pytest.raises(RegressionError, match="latency_mean_ms"):
        assert_no_regression(d, "latency_mean_ms", 0.05)


def test_forest_plot_draws_the_frame() -> None:
    effects = population(random.Random(6), 30)
    d = diff(make_run("a", effects, seed=1), make_run("b", effects, seed=2, scale=1.4))
    fig = d.figure()
    shown = d.frame.filter(pl.col("rel_diff").is_not_null())
    points = {
        y: (x, hi, lo)
        for t in fig.data
        for y, x, hi, lo in zip(t.y, t.x, t.error_x.array, t.error_x.arrayminus, strict=True)
    }
    assert set(points) == set(shown["metric"])
    for row in shown.iter_rows(named=True):
        x, hi, lo = points[row["metric"]]
        assert x == pytest.approx(row["rel_diff"] * 100)
        assert x + hi == pytest.approx(row["rel_ci_high"] * 100)
        assert x - lo == pytest.approx(row["rel_ci_low"] * 100)
    red = next(t for t in fig.data if t.name == "interval excludes 0")
    assert "latency_p50_ms" in red.y and "tokens_in_per_call" not in red.y
    assert [s.x0 for s in fig.layout.shapes] == [0]
    assert "tokens_out_per_call" in fig.layout.title.text  # not shown: no value


def test_inputs_are_checked() -> None:
    effects = population(random.Random(7), 4)
    a, b = make_run("a", effects), make_run("b", effects, seed=1)
    with pytest.raises(ValueError, match="valid metrics: tokens_in_per_call"):
        diff(a, b, metrics=["latency"])
    with pytest.raises(ValueError, match="by must be"):
        diff(a, b, by="call")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="confidence"):
        diff(a, b, confidence=95)
    stack = stack_runs([a, b, make_run("c", effects)])
    with pytest.raises(ValueError, match="labels="):
        diff(stack)
    picked = diff(stack, labels=("c", "a"), metrics=["calls_per_rollout"], n_boot=10)
    assert (picked.label_a, picked.label_b) == ("c", "a")
    with pytest.raises(ValueError, match="stack of runs"):
        diff(stack, a)


def test_one_task_gives_no_interval() -> None:
    a, b = make_run("a", {0: 1.0}), make_run("b", {0: 1.0}, seed=1)
    row = diff(a, b, metrics=["latency_mean_ms"], n_boot=100).row("latency_mean_ms")
    assert row["value_a"] is not None and row["ci_low"] is None and row["rel_ci_low"] is None


def test_replicates_equal_statistics_of_the_expanded_resample() -> None:
    rng = random.Random(8)
    values = pl.DataFrame(
        {"cluster": [t for t in range(30) for _ in range(t % 4 + 1)]},
        schema={"cluster": pl.UInt32()},
    )
    values = values.with_columns(
        value=pl.Series([rng.random() * 100 for _ in range(values.height)])
    )
    draws = resample_clusters(30, n_boot=50, seed=1)
    assert draws.filter(pl.col("boot") == -1)["cluster"].to_list() == list(range(30))
    quantiles = quantile_replicates(values, draws, {"p50": 0.5, "p95": 0.95}, n_clusters=30)
    sums = values.group_by("cluster").agg(pl.col("value").sum().alias("s"), pl.len().alias("n"))
    means = ratio_replicates(sums, draws, {"mean": ("s", "n")})
    for boot in (-1, 0, 17, 49):
        expanded = draws.filter(pl.col("boot") == boot).join(values, on="cluster")["value"]
        got = quantiles.filter(pl.col("boot") == boot).row(0, named=True)
        assert got["p50"] == pytest.approx(expanded.quantile(0.5, "linear"))
        assert got["p95"] == pytest.approx(expanded.quantile(0.95, "linear"))
        mean = means.filter(pl.col("boot") == boot)["mean"].item()
        assert mean == pytest.approx(expanded.mean())
    assert resample_clusters(30, n_boot=50, seed=1).equals(draws)
    assert not resample_clusters(30, n_boot=50, seed=2).equals(draws)


def test_the_same_seed_gives_the_same_intervals_to_the_bit(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", RunSpec(tasks=40, repeats=2, seed=0, task_seed=0))
    b = write_run(tmp_path / "b", RunSpec(tasks=40, repeats=2, seed=1, latency_scale=1.1))
    run_a = open_run(a.capture_dir, a.rollouts, label="a")
    run_b = open_run(b.capture_dir, b.rollouts, label="b")
    first = diff(run_a, run_b, n_boot=500).frame
    # Multi-threaded sums finish in varying order; the result must not depend on it.
    for _ in range(6):
        assert diff(run_a, run_b, n_boot=500).frame.equals(first)
    assert not diff(run_a, run_b, n_boot=500, seed=1).frame.equals(first)
