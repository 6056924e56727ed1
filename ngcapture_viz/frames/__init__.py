"""Frame schemas: every column of every frame, with its Polars dtype and meaning."""

from ngcapture_viz.frames._columns import UTC_TIME, Column, FrameSchema
from ngcapture_viz.frames.calls import CALLS, LENGTH_FINISH_REASONS, call_outcome
from ngcapture_viz.frames.gaps import GAP_MEANINGS, GAPS, AnalysisGap, gap_meaning
from ngcapture_viz.frames.rollouts import ROLLOUTS, TOKEN_TOTALS
from ngcapture_viz.frames.tool_calls import TOOL_CALLS

__all__ = [
    "CALLS",
    "GAPS",
    "GAP_MEANINGS",
    "LENGTH_FINISH_REASONS",
    "ROLLOUTS",
    "TOKEN_TOTALS",
    "TOOL_CALLS",
    "UTC_TIME",
    "AnalysisGap",
    "Column",
    "FrameSchema",
    "call_outcome",
    "gap_meaning",
]
