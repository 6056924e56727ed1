"""ngcapture_viz: capture stores and rollout JSONL as Polars frames, figures and reports.

Open a run and explore it::

    import ngcapture_viz as ngv

    run = ngv.open_run("results/demo/ckpt-100/model-calls", "results/demo/ckpt-100/rollouts.jsonl")
    run.calls        # one row per model call
    run.rollouts     # one row per rollout, with reward
    run.gaps         # every piece of missing or damaged evidence, and where
    run.payload(run.calls["model_call_id"][0]).request

Null always means unknown, never zero.
"""

from ngcapture_viz.exceptions import (
    CaptureIndexError,
    DamagedSourceError,
    ExportError,
    MissingExtraError,
    PayloadUnavailableError,
    RegressionError,
    SourceError,
    VizError,
)
from ngcapture_viz.frames import (
    CALLS,
    GAP_MEANINGS,
    GAPS,
    ROLLOUTS,
    TOOL_CALLS,
    AnalysisGap,
    Column,
    FrameSchema,
    gap_meaning,
)
from ngcapture_viz.index import CaptureIndex, IndexStats
from ngcapture_viz.run import (
    CaptureRun,
    calls_df,
    gaps_df,
    open_run,
    open_runs,
    rollouts_df,
    stack_runs,
    tool_calls_df,
)

__all__ = [
    "CALLS",
    "GAPS",
    "GAP_MEANINGS",
    "ROLLOUTS",
    "TOOL_CALLS",
    "AnalysisGap",
    "CaptureIndex",
    "CaptureIndexError",
    "CaptureRun",
    "Column",
    "DamagedSourceError",
    "ExportError",
    "FrameSchema",
    "IndexStats",
    "MissingExtraError",
    "PayloadUnavailableError",
    "RegressionError",
    "SourceError",
    "VizError",
    "calls_df",
    "gap_meaning",
    "gaps_df",
    "open_run",
    "open_runs",
    "rollouts_df",
    "stack_runs",
    "tool_calls_df",
]
