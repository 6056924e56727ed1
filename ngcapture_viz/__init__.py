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

from ngcapture_viz.diff import CheckpointDiff, assert_no_regression, diff
from ngcapture_viz.exceptions import (
    CaptureIndexError,
    DamagedSourceError,
    ExportError,
    MissingExtraError,
    PayloadUnavailableError,
    RegressionError,
    RolloutFileWarning,
    SourceError,
    VizError,
)
from ngcapture_viz.export import (
    ExportResult,
    export_to_wandb,
    payload_free_tables,
    summary_metrics,
    to_parquet,
)
from ngcapture_viz.figures import (
    CaptureDashboard,
    Dashboard,
    GapReport,
    assign_lanes,
    dashboard,
    gap_report,
    timeline,
)
from ngcapture_viz.frames import (
    CALLS,
    COMPACTIONS,
    GAP_MEANINGS,
    GAPS,
    INVOCATIONS,
    PERF,
    ROLLOUTS,
    SANDBOXES,
    TOOL_CALLS,
    TOOL_EXECUTIONS,
    AnalysisGap,
    Column,
    FrameSchema,
    gap_meaning,
)
from ngcapture_viz.load import CaptureIndex, IndexStats
from ngcapture_viz.report import TimelinePicks, pick_timelines, render_report, write_report
from ngcapture_viz.run import (
    CaptureRun,
    calls_df,
    gaps_df,
    open_run,
    open_runs,
    rollouts_df,
    scan_calls,
    stack_runs,
    tool_calls_df,
)
from ngcapture_viz.stats import error_rates, latency_percentiles, throughput_summary, token_summary

__all__ = [
    "CALLS",
    "COMPACTIONS",
    "GAPS",
    "GAP_MEANINGS",
    "INVOCATIONS",
    "PERF",
    "ROLLOUTS",
    "SANDBOXES",
    "TOOL_CALLS",
    "TOOL_EXECUTIONS",
    "AnalysisGap",
    "CaptureDashboard",
    "CaptureIndex",
    "CaptureIndexError",
    "CaptureRun",
    "CheckpointDiff",
    "Column",
    "DamagedSourceError",
    "Dashboard",
    "ExportError",
    "ExportResult",
    "FrameSchema",
    "GapReport",
    "IndexStats",
    "MissingExtraError",
    "PayloadUnavailableError",
    "RegressionError",
    "RolloutFileWarning",
    "SourceError",
    "TimelinePicks",
    "VizError",
    "assert_no_regression",
    "assign_lanes",
    "calls_df",
    "dashboard",
    "diff",
    "error_rates",
    "export_to_wandb",
    "gap_meaning",
    "gap_report",
    "gaps_df",
    "latency_percentiles",
    "open_run",
    "open_runs",
    "payload_free_tables",
    "pick_timelines",
    "render_report",
    "rollouts_df",
    "scan_calls",
    "stack_runs",
    "summary_metrics",
    "throughput_summary",
    "timeline",
    "to_parquet",
    "token_summary",
    "tool_calls_df",
    "write_report",
]
