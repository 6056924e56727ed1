"""Checkpoint diff: capture metrics of two runs side by side, with task-bootstrap intervals.

``diff(run_a, run_b)`` compares tokens, latency, TTFT, errors, truncations, tool calls, calls
and gaps of two runs (for example two checkpoints on the same tasks). Each metric gets both
values, the difference ``b − a``, the relative difference ``b / a − 1`` and a percentile
bootstrap interval that resamples *tasks* (all rollouts and calls of a task move together).

Pairing: when the runs ran mostly the same tasks (``PAIR_MIN_SHARE``), the comparison is
paired: only tasks (``by="task"``) or ``(task, repeat)`` rollouts (``by="rollout"``) present in
both runs are compared, and every resample draws one set of tasks for both runs. Runs that
share little or nothing are compared unpaired (each run's tasks are resampled on their own).
What was left out is listed in ``only_a`` / ``only_b``, never dropped silently. Null means
unknown: a call that did not report a metric is left out of that metric (``coverage_*`` says
how many did), it never counts as 0.

Example:
    >>> import ngcapture_viz as ngv  # doctest: +SKIP
    >>> both = ngv.open_runs({"ckpt-100": ("results/demo/ckpt-100/model-calls", None),
    ...                       "ckpt-200": ("results/demo/ckpt-200/model-calls", None)})
    >>> d = diff(both)  # doctest: +SKIP
    >>> print(d)  # doctest: +SKIP
    >>> assert_no_regression(d, "latency_p95_ms", 0.10)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.diff.bootstrap import (
    BOOT,
    CLUSTER,
    METRICS,
    Estimates,
    Metric,
    Sample,
    difference_intervals,
    difference_p_values,
    estimate,
    holm,
)
from ngcapture_viz.diff.gate import assert_no_regression
from ngcapture_viz.diff.metrics import PERF_PARTS, TOKEN_PARTS
from ngcapture_viz.diff.pairing import pair_key, rollout_keys, unmatched, with_units
from ngcapture_viz.diff.render import diff_figure, format_diff

if TYPE_CHECKING:
    from ngcapture_viz.run import CaptureRun

__all__ = [
    "DIFF_SCHEMA",
    "METRIC_NAMES",
    "PAIR_MIN_SHARE",
    "CheckpointDiff",
    "assert_no_regression",
    "diff",
]

#: Pairing needs this share of the larger run's units in both runs (``paired=None``): a
#: paired diff compares only shared units, and a small overlap would discard most data.
PAIR_MIN_SHARE: Final = 0.5

#: Every metric ``diff`` can report, in report order (``bootstrap.METRICS`` defines them).
METRIC_NAMES: Final = tuple(m.name for m in METRICS)

_FLOAT, _INT = pl.Float64(), pl.Int64()
DIFF_SCHEMA: Final = pl.Schema(
    {
        **dict.fromkeys(("metric", "per", "unit"), pl.String()),
        **dict.fromkeys(("value_a", "value_b", "diff", "rel_diff"), _FLOAT),
        **dict.fromkeys(("ci_low", "ci_high", "rel_ci_low", "rel_ci_high"), _FLOAT),
        "ci_excludes_zero": pl.Boolean(),
        **dict.fromkeys(("p_value", "p_holm"), _FLOAT),
        **dict.fromkeys(("n_a", "n_b"), _INT),
        **dict.fromkeys(("coverage_a", "coverage_b"), _FLOAT),
        **dict.fromkeys(("tasks_a", "tasks_b"), _INT),
    }
)


@dataclass(frozen=True)
class CheckpointDiff:
    """The result of ``diff``: one row per metric, and how the runs were matched.

    Attributes:
        frame: one row per metric (schema ``DIFF_SCHEMA``): ``value_a``, ``value_b``,
            ``diff`` (b − a), ``rel_diff`` (b / a − 1), the bootstrap interval of each
            (``ci_*``, ``rel_ci_*``; null when it cannot be computed), the two-sided bootstrap
            p-value of the difference (``p_value``) and its Holm adjustment across the
            metrics of this diff (``p_holm``: below α, the change holds even after looking at
            every metric at once), the units each value
            rests on (``n_*``), the share of units that reported the metric (``coverage_*``)
            and the tasks resampled (``tasks_*``).
        label_a, label_b: the runs compared (differences are b − a).
        paired: tasks were matched across runs (one resample of tasks for both runs).
        by: ``"task"`` or ``"rollout"``: the unit matched across runs.
        pair_key: the rollouts column that identified tasks (``task_id``, ``task_index`` or
            ``mixed``: task id, else task index, else the rollout id).
        only_a, only_b: units without a partner (task keys for ``by="task"``, rollout ids for
            ``by="rollout"``). Paired: left out of every value. Unpaired: every unit.
        excluded_a, excluded_b: rollouts of each run left out of the comparison.
        tasks_a, tasks_b: tasks (clusters) resampled for each run.
        n_boot, confidence, seed: how the intervals were computed.
        shared: units both runs have (paired or not).
        auto_paired: pairing was decided by the overlap (``paired=None``), not forced.
    """

    frame: pl.DataFrame
    label_a: str
    label_b: str
    paired: bool
    by: str
    pair_key: str
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    excluded_a: int
    excluded_b: int
    tasks_a: int
    tasks_b: int
    n_boot: int
    confidence: float
    seed: int
    shared: int = 0
    auto_paired: bool = True

    def __str__(self) -> str:
        return self.format()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from ngcapture_viz.display.cards import diff_html, html_bundle

        return html_bundle(self.format(), lambda js: diff_html(self, plotlyjs=js))

    def _repr_html_(self) -> str:
        return self._repr_mimebundle_()["text/html"]

    @property
    def summary(self) -> str:
        """One line: what was compared with what, and how."""
        if self.paired:
            how = f"paired by {self.by} on {self.pair_key}, {self.tasks_a} shared tasks"
        else:
            how = f"unpaired ({self.tasks_a} vs {self.tasks_b} tasks resampled independently"
            units = "tasks" if self.by == "task" else "rollouts"
            if not self.auto_paired:
                how += f"; shared {units}: {self.shared}, unpaired by choice)"
            elif self.shared:
                how += f"; shared {units}: {self.shared}, too few to pair)"
            else:
                how += ")"
        level = f"{self.confidence:.0%}"
        return (
            f"{self.label_b} vs {self.label_a}: {how}; {level} intervals from "
            f"{self.n_boot} task resamples"
        )

    def row(self, metric: str) -> dict[str, Any]:
        """The frame's row of ``metric`` as a dict (``ValueError`` names the valid metrics)."""
        rows = self.frame.filter(pl.col("metric") == metric)
        if rows.height == 0:
            valid = ", ".join(self.frame["metric"].to_list())
            raise ValueError(f"unknown metric {metric!r}; this diff has: {valid}")
        return rows.row(0, named=True)

    def format(self) -> str:
        """A readable text table: values, differences, intervals, counts and coverage.

        Example:
            >>> print(d.format())  # doctest: +SKIP
        """
        return format_diff(self)

    def figure(self) -> go.Figure:
        """Forest plot: relative difference per metric with its interval and a zero line.

        Metrics whose relative interval excludes 0 are coloured; metrics without a relative
        difference (no value in run a, or a zero one) are left out and named in the title.

        Example:
            >>> d.figure()  # doctest: +SKIP
        """
        return diff_figure(self)


def diff(
    run_a: CaptureRun,
    run_b: CaptureRun | None = None,
    *,
    labels: tuple[str, str] | None = None,
    by: Literal["task", "rollout"] = "task",
    metrics: Sequence[str] | None = None,
    paired: bool | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> CheckpointDiff:
    """Compare the capture metrics of two runs, with task-bootstrap confidence intervals.

    Args:
        run_a, run_b: the runs (differences are ``b − a``). Or ``run_a`` alone: a stack of
            two runs, or of more with ``labels=(label_a, label_b)``.
        by: the unit matched across runs: ``"task"`` (every rollout of tasks both runs ran)
            or ``"rollout"`` (only ``(task, repeat)`` rollouts both runs have).
        metrics: names from ``METRIC_NAMES`` (default: all).
        paired: ``None`` pairs when the runs ran mostly the same units (at least two, and
            at least ``PAIR_MIN_SHARE`` of the larger run's); ``False`` forces independent
            resampling; ``True`` pairs on whatever is shared and raises when nothing is.
        n_boot: bootstrap resamples of tasks (0: no intervals).
        seed: seed of the resampling (same seed, same intervals).
        confidence: level of the percentile intervals.

    Raises:
        ValueError: unknown metric, ``by`` or labels; ``confidence`` outside (0, 1).

    Example:
        >>> d = diff(run_100, run_200, metrics=["latency_p50_ms"])  # doctest: +SKIP
        >>> d.row("latency_p50_ms")["rel_ci_low"]  # doctest: +SKIP
    """
    first, second = _two_runs(run_a, run_b, labels)
    chosen = _chosen(metrics)
    if by not in ("task", "rollout"):
        raise ValueError(f"by must be 'task' or 'rollout', not {by!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence!r}")
    base_a, base_b = rollout_keys(first), rollout_keys(second)
    key = pair_key(base_a, base_b)
    base_a, base_b = (with_units(f, key, by) for f in (base_a, base_b))
    shared = set(base_a["unit"]) & set(base_b["unit"])
    chosen_by_overlap = paired is None
    if paired is None:
        most = max(base_a["unit"].n_unique(), base_b["unit"].n_unique())
        paired = len(shared) >= 2 and len(shared) >= PAIR_MIN_SHARE * most
    elif paired and not shared:
        raise ValueError(f"paired=True, but the runs share no {by} (matched on {key})")
    kept_a, kept_b = base_a, base_b
    if paired:
        kept_a, kept_b = (f.filter(pl.col("unit").is_in(list(shared))) for f in (base_a, base_b))
    tasks_a = sorted(set(kept_a["task"]))
    tasks_b = tasks_a if paired else sorted(set(kept_b["task"]))
    estimates = estimate(
        _sample(first.calls, kept_a, tasks_a, first.perf, first.tokens),
        _sample(second.calls, kept_b, tasks_b, second.perf, second.tokens),
        chosen,
        paired=paired,
        n_boot=n_boot,
        seed=seed,
    )
    frame = _summarise(estimates, chosen, confidence, len(tasks_a), len(tasks_b))
    return CheckpointDiff(
        frame=frame,
        label_a=str(first.label),
        label_b=str(second.label),
        paired=paired,
        by=by,
        pair_key=key,
        only_a=unmatched(base_a, shared, by),
        only_b=unmatched(base_b, shared, by),
        excluded_a=base_a.height - kept_a.height,
        excluded_b=base_b.height - kept_b.height,
        tasks_a=len(tasks_a),
        tasks_b=len(tasks_b),
        n_boot=n_boot,
        confidence=confidence,
        seed=seed,
        shared=len(shared),
        auto_paired=chosen_by_overlap,
    )


# -- matching rollouts across runs ---------------------------------------------------------


def _two_runs(
    run_a: CaptureRun, run_b: CaptureRun | None, labels: tuple[str, str] | None
) -> tuple[CaptureRun, CaptureRun]:
    if run_b is not None:
        for run in (run_a, run_b):
            if run.label is None:
                raise ValueError(f"{run!r} is a stack of runs: pass single runs, or labels=")
        return run_a, run_b
    members = run_a.runs
    if labels is None:
        if len(members) != 2:
            raise ValueError(f"pass two runs, or labels= to pick two of {list(members)}")
        first, second = members
        labels = (first, second)
    unknown = [label for label in labels if label not in members]
    if unknown:
        raise ValueError(f"unknown label(s) {unknown}; the runs are {list(members)}")
    return members[labels[0]], members[labels[1]]


def _chosen(metrics: Sequence[str] | None) -> list[Metric]:
    if metrics is None:
        return list(METRICS)
    if isinstance(metrics, str):
        metrics = [metrics]
    unknown = [m for m in metrics if m not in METRIC_NAMES]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; valid metrics: {', '.join(METRIC_NAMES)}")
    return [m for m in METRICS if m.name in metrics]


def _sample(
    calls: pl.DataFrame,
    kept: pl.DataFrame,
    tasks: list[str],
    perf: pl.DataFrame,
    tokens: pl.DataFrame,
) -> Sample:
    numbers = pl.DataFrame(
        {"task": tasks, CLUSTER: range(len(tasks))},
        schema={"task": pl.String(), CLUSTER: pl.UInt32()},
    )
    rollouts = kept.join(numbers, on="task").select("rollout_id", CLUSTER, "num_gaps")
    parts = perf.select("rollout_id", *PERF_PARTS).unique("rollout_id", keep="last")
    rollouts = rollouts.join(parts, on="rollout_id", how="left", maintain_order="left")
    verdicts = tokens.select("rollout_id", *TOKEN_PARTS).unique("rollout_id", keep="last")
    rollouts = rollouts.join(verdicts, on="rollout_id", how="left", maintain_order="left")
    mine = calls.join(rollouts.select("rollout_id"), on="rollout_id", how="semi")
    return Sample(rollouts, mine, len(tasks))


# -- the table -----------------------------------------------------------------------------


def _summarise(
    estimates: Estimates, metrics: Sequence[Metric], confidence: float, tasks_a: int, tasks_b: int
) -> pl.DataFrame:
    reps = estimates.replicates
    original = reps.filter(pl.col(BOOT) == -1).row(0, named=True)
    resampled = reps.filter(pl.col(BOOT) >= 0)
    intervals: dict[str, tuple[float | None, ...]] = {}
    p_values: dict[str, float | None] = {}
    if resampled.height > 0 and min(tasks_a, tasks_b) >= 2:
        names = [m.name for m in metrics]
        intervals = difference_intervals(resampled, names, confidence)
        p_values = difference_p_values(resampled, names)
    for m in metrics:  # no difference, no p-value (and it takes no part in Holm's count)
        if original[f"a|{m.name}"] is None or original[f"b|{m.name}"] is None:
            p_values[m.name] = None
    adjusted = holm(p_values)
    rows = []
    for m in metrics:
        a_name, b_name = f"a|{m.name}", f"b|{m.name}"
        value_a, value_b = original[a_name], original[b_name]
        change = value_b - value_a if value_a is not None and value_b is not None else None
        rel = change / value_a if change is not None and value_a else None
        low, high, rel_low, rel_high = intervals.get(m.name, (None,) * 4)
        if change is None:
            low = high = None
        if rel is None:
            rel_low = rel_high = None
        n_a, n_b = estimates.n.get(a_name, 0), estimates.n.get(b_name, 0)
        rows.append(
            {
                "metric": m.name,
                "per": m.per,
                "unit": m.unit,
                "value_a": value_a,
                "value_b": value_b,
                "diff": change,
                "rel_diff": rel,
                "ci_low": low,
                "ci_high": high,
                "rel_ci_low": rel_low,
                "rel_ci_high": rel_high,
                "ci_excludes_zero": _excludes_zero(low, high),
                "p_value": p_values.get(m.name),
                "p_holm": adjusted.get(m.name),
                "n_a": n_a,
                "n_b": n_b,
                "coverage_a": _share(n_a, estimates.eligible.get(a_name, 0)),
                "coverage_b": _share(n_b, estimates.eligible.get(b_name, 0)),
                "tasks_a": tasks_a,
                "tasks_b": tasks_b,
            }
        )
    return pl.DataFrame(rows, schema=DIFF_SCHEMA)


def _excludes_zero(low: float | None, high: float | None) -> bool | None:
    if low is None or high is None:
        return None
    return low > 0 or high < 0


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None
