"""The task-cluster bootstrap of a checkpoint diff: draws, replicates, intervals, estimates.

A resample draws ``n`` tasks (clusters) with replacement out of ``n``; each drawn task brings
all of its rollouts and calls, once per draw. All resamples are one long frame of draws,
``(boot, cluster)``; resample ``-1`` is the original sample (every task once), so point
estimates and replicates come out of the same code and always agree. Everything is vectorised
in Polars (NumPy is not a dependency).

Two kinds of statistic (``METRICS``, defined in :mod:`ngcapture_viz.diff.metrics` and
re-exported here, lists the metrics of each kind):

* ratios of sums, ``Σ num / Σ den`` over the drawn tasks (means per call or per rollout,
  rates): ``ratio_replicates`` gathers per-task sums and adds them up per resample;
* quantiles of call-level values: ``quantile_replicates`` gathers each drawn task's values and
  takes ``quantile(q, interpolation="linear")`` per resample, exactly as on the original data.

``estimate`` runs both for the two samples of a comparison, paired or not;
``difference_intervals`` turns the replicates into percentile intervals.

Example:
    >>> sums = pl.DataFrame({"cluster": [0, 1], "num": [3.0, 5.0], "den": [1, 1]})
    >>> draws = resample_clusters(2, n_boot=100, seed=0)
    >>> reps = ratio_replicates(sums, draws, {"mean": ("num", "den")})
    >>> reps.filter(pl.col("boot") == -1)["mean"].item()
    4.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import polars as pl

from ngcapture_viz.diff.metrics import METRICS, ROLLOUT_PARTS, Metric

__all__ = [
    "BOOT",
    "CLUSTER",
    "METRICS",
    "Estimates",
    "Metric",
    "Sample",
    "difference_intervals",
    "difference_p_values",
    "estimate",
    "holm",
    "quantile_replicates",
    "ratio_replicates",
    "resample_clusters",
]

BOOT: Final = "boot"
CLUSTER: Final = "cluster"
_DRAWS: Final = pl.Schema({BOOT: pl.Int64(), CLUSTER: pl.UInt32()})
#: Digits kept of a bootstrap ratio (far below any statistical resolution).
SIGNIFICANT_DIGITS: Final = 12
#: Values materialised at once by ``quantile_replicates`` (bounds its memory, ~8 bytes each).
CHUNK_VALUES: Final = 4_000_000


def resample_clusters(n_clusters: int, *, n_boot: int, seed: int) -> pl.DataFrame:
    """``n_boot`` resamples of ``n_clusters`` clusters drawn with replacement, plus the original.

    Clusters are numbered ``0 .. n_clusters - 1``. Row ``(b, c)`` means resample ``b`` drew
    cluster ``c`` once (a cluster drawn twice has two rows); resample ``-1`` is every cluster
    once. The same ``seed`` gives the same draws.

    Example:
        >>> draws = resample_clusters(3, n_boot=10, seed=1)
        >>> draws.group_by("boot").len()["len"].unique().to_list()
        [3]
    """
    original = pl.DataFrame({BOOT: [-1] * n_clusters, CLUSTER: range(n_clusters)}, schema=_DRAWS)
    if n_clusters == 0 or n_boot <= 0:
        return original
    total = n_boot * n_clusters
    drawn = pl.int_range(0, n_clusters, dtype=pl.UInt32, eager=True).sample(
        total, with_replacement=True, seed=seed
    )
    boots = pl.int_range(0, total, dtype=pl.Int64, eager=True) // n_clusters
    return pl.concat([original, pl.DataFrame({BOOT: boots, CLUSTER: drawn}, schema=_DRAWS)])


def ratio_replicates(
    sums: pl.DataFrame,
    draws: pl.DataFrame,
    ratios: Mapping[str, tuple[str, str]],
) -> pl.DataFrame:
    """``Σ num / Σ den`` over each resample's drawn clusters, for every ``name: (num, den)``.

    Args:
        sums: one row per cluster (``cluster``: UInt32) with the numerator and denominator
            columns; a cluster without a row adds nothing.
        draws: from ``resample_clusters``.

    Returns:
        ``boot`` and one Float64 column per ratio (null where the denominator is 0: nothing
        to average), for every resample that drew a cluster with a row (in no particular
        order).
    """
    columns = sorted({c for pair in ratios.values() for c in pair})
    per_cluster = sums.lazy().select(CLUSTER, *(pl.col(c).cast(pl.Float64) for c in columns))
    totals = (
        draws.lazy()
        .join(per_cluster, on=CLUSTER, how="inner")
        .group_by(BOOT)
        .agg(pl.col(columns).sum())
        .collect()
    )
    # Threads add partial sums in whatever order they finish, so the last bits of a sum vary
    # from run to run; 12 significant digits make the same seed give the same intervals.
    return totals.select(
        BOOT,
        *(
            pl.when(pl.col(den) > 0)
            .then(pl.col(num) / pl.col(den))
            .round_sig_figs(SIGNIFICANT_DIGITS)
            .alias(name)
            for name, (num, den) in ratios.items()
        ),
    )


def quantile_replicates(
    values: pl.DataFrame, draws: pl.DataFrame, quantiles: Mapping[str, float], *, n_clusters: int
) -> pl.DataFrame:
    """``value.quantile(q, interpolation="linear")`` over each resample's drawn clusters.

    Args:
        values: ``cluster`` (UInt32) and ``value`` columns, one row per observation; nulls
            (unknown values) are left out.
        draws: from ``resample_clusters(n_clusters, ...)``.

    Returns:
        ``boot`` and one Float64 column per quantile, for every resample holding a value
        (in no particular order).
    """
    known = values.select(CLUSTER, pl.col("value").cast(pl.Float64)).drop_nulls("value")
    lists = _dense(known.group_by(CLUSTER).agg("value"), n_clusters)["value"]
    # A resample holds about as many values as the sample: work through the resamples in
    # chunks so memory stays near CHUNK_VALUES values, whatever n_boot × n_calls is.
    per_boot = max(1, known.height)
    step = max(1, CHUNK_VALUES // per_boot)
    boots = draws[BOOT]
    first = int(boots.min()) if boots.len() else 0  # type: ignore[arg-type]
    last = int(boots.max()) if boots.len() else -1  # type: ignore[arg-type]
    parts = [pl.DataFrame(schema={BOOT: pl.Int64(), **dict.fromkeys(quantiles, pl.Float64())})]
    for low in range(first, last + 1, step):
        chunk = draws.filter(pl.col(BOOT).is_between(low, low + step - 1))
        rows = pl.DataFrame({BOOT: chunk[BOOT], "value": lists.gather(chunk[CLUSTER])})
        parts.append(
            rows.lazy()
            .explode("value")
            .drop_nulls("value")
            .group_by(BOOT)
            .agg(
                pl.col("value").quantile(q, interpolation="linear").alias(name)
                for name, q in quantiles.items()
            )
            .collect()
        )
    return pl.concat(parts)


def _dense(per_cluster: pl.DataFrame, n_clusters: int) -> pl.DataFrame:
    """``per_cluster`` with exactly one row per cluster number, in order (missing: nulls)."""
    index = pl.DataFrame({CLUSTER: range(n_clusters)}, schema={CLUSTER: pl.UInt32()})
    return index.join(per_cluster, on=CLUSTER, how="left", maintain_order="left")


def difference_intervals(
    replicates: pl.DataFrame, names: Sequence[str], confidence: float
) -> dict[str, tuple[float | None, ...]]:
    """Percentile intervals of ``b − a`` and ``b / a − 1`` for every metric in ``names``.

    ``replicates`` holds the resamples (``boot`` ≥ 0) with columns ``a|<name>`` and
    ``b|<name>``. Bounds interpolate linearly between order statistics. An interval is
    unknown (``None``) when any resample lacks it (no value there, or ``a`` is 0 for the
    relative one): a partial interval would look narrower than the truth.

    Returns:
        name → ``(low, high, rel_low, rel_high)``.

    Example:
        >>> reps = pl.DataFrame({"a|m": [1.0, 2.0, 4.0], "b|m": [2.0, 2.0, 6.0]})
        >>> difference_intervals(reps, ["m"], 0.5)["m"]
        (0.5, 1.5, 0.25, 0.75)
    """
    tail = (1.0 - confidence) / 2
    exprs = []
    for name in names:
        a, b = pl.col(f"a|{name}"), pl.col(f"b|{name}")
        spreads = (b - a, pl.when(a != 0).then(b / a - 1))
        for i, spread in enumerate(spreads):
            known = spread.is_not_null().all() & (pl.len() > 0)
            for end, q in (("low", tail), ("high", 1.0 - tail)):
                bound = spread.quantile(q, interpolation="linear")
                exprs.append(pl.when(known).then(bound).alias(f"{name}|{i}|{end}"))
    if not exprs:
        return {}
    row = replicates.select(exprs).row(0)
    return {name: tuple(row[4 * k : 4 * k + 4]) for k, name in enumerate(names)}


def difference_p_values(replicates: pl.DataFrame, names: Sequence[str]) -> dict[str, float | None]:
    """Two-sided bootstrap p-value of ``b − a`` for every metric in ``names``.

    ``2 · min(#{δ* ≤ 0} + 1, #{δ* ≥ 0} + 1) / (B + 1)``, capped at 1, over the ``B``
    resamples: the smallest level at which the percentile interval would reach zero, with
    the usual +1 so that no finite bootstrap claims p = 0. Unknown (``None``) under the
    same rule as the intervals: some resample has no difference.

    Example:
        >>> reps = pl.DataFrame({"a|m": [1.0, 1.0, 1.0], "b|m": [2.0, 3.0, 0.5]})
        >>> difference_p_values(reps, ["m"])["m"]
        1.0
    """
    exprs = []
    for name in names:
        spread = pl.col(f"b|{name}") - pl.col(f"a|{name}")
        below = (spread <= 0).sum() + 1
        above = (spread >= 0).sum() + 1
        share = 2 * pl.min_horizontal(below, above) / (pl.len() + 1)
        known = spread.is_not_null().all() & (pl.len() > 0)
        exprs.append(pl.when(known).then(pl.min_horizontal(share, 1.0)).alias(name))
    if not exprs:
        return {}
    return dict(zip(names, replicates.select(exprs).row(0), strict=True))


def holm(p_values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjustment over the known p-values (unknown ones stay ``None``).

    With ``m`` known p-values sorted ascending, the ``i``-th (from 1) becomes
    ``max_{j ≤ i} min(1, (m − j + 1) · p_(j))``: rejecting where the adjusted value is below
    α keeps the chance of *any* false alarm across the metrics at most α.

    Example:
        >>> holm({"x": 0.01, "y": 0.04, "z": 0.03, "w": None})
        {'x': 0.03, 'y': 0.06, 'z': 0.06, 'w': None}
    """
    known = sorted((p, name) for name, p in p_values.items() if p is not None)
    adjusted: dict[str, float | None] = dict.fromkeys(p_values)
    running = 0.0
    for rank, (p, name) in enumerate(known):
        running = max(running, min(1.0, (len(known) - rank) * p))
        adjusted[name] = running
    return adjusted


# -- estimating the diff metrics of two samples --------------------------------------------


@dataclass(frozen=True)
class Sample:
    """The part of one run a comparison uses.

    Attributes:
        rollouts: ``rollout_id``, ``cluster`` (UInt32 task number), ``num_gaps``, the
            ``ng_perf`` parts (``metrics.PERF_PARTS``; null: the rollout has none) and the
            token-capture verdict (``metrics.TOKEN_PARTS``; null: none).
        calls: the calls of those rollouts (calls-frame columns; others are ignored).
        n_clusters: how many tasks; clusters are numbered ``0 .. n_clusters - 1``.
    """

    rollouts: pl.DataFrame
    calls: pl.DataFrame
    n_clusters: int


@dataclass(frozen=True)
class Estimates:
    """Replicates of every metric for both sides, and how many units each value rests on.

    Attributes:
        replicates: ``boot`` (−1: the original sample) and one column ``"a|<metric>"`` /
            ``"b|<metric>"`` per side and metric.
        n: ``"a|<metric>"`` → units (calls or rollouts) that reported the metric.
        eligible: ``"a|<metric>"`` → units that could have reported it (coverage's base).
    """

    replicates: pl.DataFrame
    n: dict[str, int]
    eligible: dict[str, int]


def estimate(
    a: Sample, b: Sample, metrics: Sequence[Metric], *, paired: bool, n_boot: int, seed: int
) -> Estimates:
    """Point estimates and task-bootstrap replicates of ``metrics`` for both samples.

    Paired samples share their cluster numbering and every resample draws the same tasks
    for both; unpaired samples are resampled independently (``seed`` and ``seed + 1``).
    """
    if paired and a.n_clusters != b.n_clusters:
        raise ValueError("paired samples must have the same tasks")
    draws_a = resample_clusters(a.n_clusters, n_boot=n_boot, seed=seed)
    draws_b = draws_a if paired else resample_clusters(b.n_clusters, n_boot=n_boot, seed=seed + 1)
    n: dict[str, int] = {}
    eligible: dict[str, int] = {}
    parts = []
    ratios = [m for m in metrics if m.num is not None and m.den is not None]
    if ratios:
        sums = {side: _cluster_sums(s, ratios, side) for side, s in (("a", a), ("b", b))}
        pairs = {
            f"{side}|{m.name}": (f"{side}|{m.name}|num", f"{side}|{m.name}|den")
            for side in ("a", "b")
            for m in ratios
        }
        if paired:  # one frame, so identical inputs give bit-identical sums on both sides
            both = sums["a"].join(sums["b"], on=CLUSTER, how="full", coalesce=True)
            parts.append(ratio_replicates(both, draws_a, pairs))
        else:
            for side, draws in (("a", draws_a), ("b", draws_b)):
                mine = {k: v for k, v in pairs.items() if k.startswith(f"{side}|")}
                parts.append(ratio_replicates(sums[side], draws, mine))
        for name, (_, den) in pairs.items():
            n[name] = int(sums[name[0]][den].sum())
    for side, sample, draws in (("a", a, draws_a), ("b", b, draws_b)):
        calls = sample.calls.join(sample.rollouts.select("rollout_id", CLUSTER), on="rollout_id")
        for column in dict.fromkeys(m.column for m in metrics if m.column is not None):
            chosen = {
                f"{side}|{m.name}": m.q for m in metrics if m.column == column and m.q is not None
            }
            values = calls.select(CLUSTER, pl.col(column).alias("value"))
            parts.append(quantile_replicates(values, draws, chosen, n_clusters=sample.n_clusters))
            n.update(dict.fromkeys(chosen, values["value"].count()))
        for m in metrics:
            units = calls.height if m.per == "call" else sample.rollouts.height
            eligible[f"{side}|{m.name}"] = units
    replicates = pl.DataFrame({BOOT: range(-1, max(n_boot, 0))}, schema={BOOT: pl.Int64()})
    for part in parts:
        replicates = replicates.join(part, on=BOOT, how="left")
    return Estimates(replicates, n, eligible)


def _cluster_sums(sample: Sample, metrics: Sequence[Metric], side: str) -> pl.DataFrame:
    """Per task: the numerator and denominator of every ratio metric, summed over rollouts."""
    parts = sample.calls.group_by("rollout_id").agg(ROLLOUT_PARTS)
    rows = sample.rollouts.join(parts, on="rollout_id", how="left")
    rows = rows.with_columns(pl.col("n_calls").fill_null(0))
    sums = []
    for m in metrics:
        for part, expr in (("num", m.num), ("den", m.den)):
            assert expr is not None
            sums.append(expr.cast(pl.Float64).sum().alias(f"{side}|{m.name}|{part}"))
    return rows.group_by(CLUSTER).agg(sums)
