"""The regression gate of a checkpoint diff: fail CI only when a metric rose, with confidence.

Example:
    >>> d = diff(run_100, run_200)  # doctest: +SKIP
    >>> assert_no_regression(d, "latency_p95_ms", 0.10)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ngcapture_viz.diff.render import number_text, percent_text
from ngcapture_viz.exceptions import RegressionError

if TYPE_CHECKING:
    from ngcapture_viz.diff.compare import CheckpointDiff

__all__ = ["assert_no_regression"]


def assert_no_regression(
    diff: CheckpointDiff, metric: str, max_increase: float, *, relative: bool = True
) -> None:
    """Fail when ``metric`` rose by more than ``max_increase``, with confidence.

    The gate fails only when the *lower* bound of the interval is above ``max_increase``:
    the data are then incompatible (at the diff's confidence level) with an increase of
    ``max_increase`` or less. A noisy point estimate above the limit alone does not fail it.
    An interval that could not be computed (the metric was not reported, fewer than two
    tasks, no resamples) fails too: the gate cannot vouch for the metric.

    Args:
        diff: from ``diff(a, b)``; an increase is ``b`` above ``a``.
        metric: a metric of the diff (``ValueError`` lists them).
        max_increase: the allowed increase: relative (``0.10`` is +10 %) or, with
            ``relative=False``, in the metric's own unit.

    Raises:
        RegressionError: (an ``AssertionError``) naming the metric, the observed difference,
            its interval and the limit.
        ValueError: an unknown metric, or a limit that is not a finite number.

    Example:
        >>> assert_no_regression(d, "latency_p95_ms", 0.10)  # doctest: +SKIP
        >>> assert_no_regression(d, "error_rate", 0.02, relative=False)  # doctest: +SKIP
    """
    if not math.isfinite(max_increase):
        raise ValueError(f"max_increase must be a finite number, not {max_increase!r}")
    row = diff.row(metric)
    point, low, high = (
        (row["rel_diff"], row["rel_ci_low"], row["rel_ci_high"])
        if relative
        else (row["diff"], row["ci_low"], row["ci_high"])
    )
    show = percent_text if relative else (lambda v: number_text(v, row["unit"], sign=True))
    where = f"{metric} ({diff.label_b} vs {diff.label_a})"
    limit = f"allowed increase {show(max_increase)}"
    if low is None or high is None:
        values = " → ".join(number_text(row[k], row["unit"]) for k in ("value_a", "value_b"))
        hint = (
            "; gate it in absolute terms (relative=False, or --gate-abs on the command line)"
            if relative and row["ci_low"] is not None
            else ""
        )
        raise RegressionError(
            f"{where}: cannot be checked, the {'relative ' if relative else ''}interval is "
            f"unknown ({values}, tasks {row['tasks_a']}/{row['tasks_b']}); {limit}{hint}"
        )
    if low > max_increase:
        level = f"{diff.confidence:.0%}"
        raise RegressionError(
            f"{where} regressed: {show(point)} ({level} interval {show(low)} to {show(high)}) "
            f"lies entirely above the {limit}"
        )
