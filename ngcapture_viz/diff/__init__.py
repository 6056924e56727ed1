"""Checkpoint diff: metrics, pairing, the task bootstrap, the regression gate and rendering.

``diff(run_a, run_b)`` (in :mod:`ngcapture_viz.diff.compare`) returns a ``CheckpointDiff``;
``assert_no_regression`` turns one into a CI gate.
"""

from ngcapture_viz.diff.compare import (
    DIFF_SCHEMA,
    METRIC_NAMES,
    PAIR_MIN_SHARE,
    CheckpointDiff,
    diff,
)
from ngcapture_viz.diff.gate import assert_no_regression

__all__ = [
    "DIFF_SCHEMA",
    "METRIC_NAMES",
    "PAIR_MIN_SHARE",
    "CheckpointDiff",
    "assert_no_regression",
    "diff",
]
