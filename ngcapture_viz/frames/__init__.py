"""Frame schemas: every column of every frame, with its Polars dtype and meaning."""

from ngcapture_viz.frames._columns import UTC_TIME, Column, FrameSchema
from ngcapture_viz.frames.agent import COMPACTIONS, INVOCATIONS, SANDBOXES, TOOL_EXECUTIONS
from ngcapture_viz.frames.calls import CALLS, LENGTH_FINISH_REASONS, call_outcome
from ngcapture_viz.frames.gaps import GAP_MEANINGS, GAPS, AnalysisGap, gap_meaning
from ngcapture_viz.frames.perf import PERF, PERF_FIGURES
from ngcapture_viz.frames.rollouts import ROLLOUTS, TOKEN_TOTALS
from ngcapture_viz.frames.tool_calls import TOOL_CALLS

__all__ = [
    "CALLS",
    "COMPACTIONS",
    "GAPS",
    "GAP_MEANINGS",
    "INVOCATIONS",
    "LENGTH_FINISH_REASONS",
    "PERF",
    "PERF_FIGURES",
    "ROLLOUTS",
    "SANDBOXES",
    "TOKEN_TOTALS",
    "TOOL_CALLS",
    "TOOL_EXECUTIONS",
    "UTC_TIME",
    "AnalysisGap",
    "Column",
    "FrameSchema",
    "call_outcome",
    "gap_meaning",
]
