"""latency_distribution against Polars' own linear quantiles, group by group."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ngcapture_viz.stats import LATENCY_METRICS, latency_distribution


def _calls(n: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ttft = pl.Series(rng.gamma(2.0, 30.0, n)).set(pl.Series(rng.random(n) < 0.3), None)
    return pl.DataFrame(
        {
            "run": rng.choice(["a", "b", "c"], n).tolist(),
            "model": rng.choice(["m1", "m2", None], n).tolist(),
            "latency_total_ms": rng.gamma(2.0, 100.0, n).round(2),
            "latency_ttft_ms": ttft,
        },
        schema_overrides={"model": pl.String()},
    ).with_columns(  # run "c" never reports a TTFT
        pl.when(pl.col("run") != "c").then(pl.col("latency_ttft_ms")).alias("latency_ttft_ms")
    )


def _oracle(calls: pl.DataFrame, by: list[str], shares: list[float]) -> dict[tuple, list]:
    """Each group's quantiles as Polars computes them, one quantile at a time."""
    out: dict[tuple, list] = {}
    for metric in LATENCY_METRICS:
        for key, group in calls.group_by(by):
            values = group[metric].drop_nulls()
            out[(*key, metric)] = [
                values.quantile(q, "linear") if values.len() else None for q in shares
            ]
    return out


@pytest.mark.parametrize("n", [1, 2, 5, 400])
@pytest.mark.parametrize("by", [["run"], ["run", "model"]])
def test_each_share_is_the_groups_linear_quantile(n: int, by: list[str]) -> None:
    calls = _calls(n, seed=n)
    table = latency_distribution(calls, by, points=11)
    shares = [i / 10 for i in range(11)]
    expected = _oracle(calls, by, shares)
    got: dict[tuple, list] = {}
    for row in table.iter_rows(named=True):
        got.setdefault((*(row[k] for k in by), row["metric"]), []).append(row["value"])
        assert (
            row["n_reported"]
            == calls.filter(*(pl.col(k).eq_missing(row[k]) for k in by))[row["metric"]].count()
        )
    assert got.keys() == expected.keys()
    for key, values in expected.items():
        if values[0] is None:  # the group reported none: null at every share, never 0
            assert got[key] == values, key
        else:
            assert got[key] == pytest.approx(values, rel=1e-12, abs=1e-9), key


def test_without_keys_all_calls_are_one_group() -> None:
    calls = _calls(300, seed=7)
    whole = latency_distribution(calls, (), points=21)
    one = latency_distribution(calls.with_columns(pl.lit("x").alias("run")), ["run"], points=21)
    assert_frame_equal(whole, one.drop("run"), check_exact=True)
    assert whole.columns == ["metric", "share", "value", "n_reported"]


def test_no_calls_gives_no_rows() -> None:
    empty = _calls(0, seed=1)
    assert latency_distribution(empty, ["run"]).height == 0
