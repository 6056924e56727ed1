"""The gaps frame: every piece of evidence known to be missing or damaged, and where."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

import polars as pl

from capture_core import GapCode
from ngcapture_viz.frames._columns import Column, FrameSchema

__all__ = ["GAPS", "GAP_MEANINGS", "AnalysisGap", "GapRows", "gap_meaning"]

_INT = pl.Int64()
_STR = pl.String()


class AnalysisGap(StrEnum):
    """Gap codes the analysis side adds to the ones collection writes (``GapCode``)."""

    DAMAGED_LINE = "capture_line_damaged"
    FOREIGN_FILE = "capture_dir_foreign_file"
    FILE_UNREADABLE = "capture_file_unreadable"
    EMPTY_FILE = "capture_file_empty"
    NOT_IN_STORE = "rollout_not_in_store"
    NOT_IN_ROLLOUTS = "rollout_not_in_rollouts"
    ROLLOUT_LINE_DAMAGED = "rollout_line_damaged"
    ROLLOUT_WITHOUT_ID = "rollout_without_id"
    DUPLICATE_ROLLOUT = "rollout_duplicated"
    ATTACHMENT_UNREADABLE = "attachment_unreadable"
    CALL_NOT_IN_STORE = "call_not_in_store"
    CALL_NOT_IN_ATTACHMENT = "call_not_in_attachment"
    TOTALS_DIFFER = "attachment_totals_differ"
    NO_CAPTURE = "rollout_without_capture"
    FACTS_DIFFER = "capture_facts_differ"


GAP_MEANINGS: Final[Mapping[str, str]] = {
    GapCode.MODEL_CALL_CAPTURE_NO_RECORDS: "the rollout ran but no call of it was captured",
    GapCode.MODEL_CALL_CAPTURE_RECORDS_UNREADABLE: (
        "some capture lines of the rollout could not be read when it was collected"
    ),
    GapCode.MODEL_CALL_CAPTURE_INCOMPLETE: (
        "the server failed to record at least one call (the file is marked incomplete)"
    ),
    GapCode.MODEL_CALL_CAPTURE_UNREADABLE: "the rollout's capture file could not be read",
    GapCode.MODEL_CALL_CAPTURE_PENDING: "a capture write had not landed (pending marker)",
    GapCode.MODEL_CALL_CAPTURE_LOST: (
        "a call's capture write was started by a server process that died before it landed"
    ),
    GapCode.MODEL_CALL_CAPTURE_FAILED: (
        "a call was served but its capture line could not be written (one gap per call)"
    ),
    GapCode.TRAJECTORY_PROJECTION_FAILED: "the ng_trajectory projection failed",
    AnalysisGap.DAMAGED_LINE: "a capture line is not a readable record (torn, bad JSON, bad field)",
    AnalysisGap.FOREIGN_FILE: "a file in the capture directory is not part of the store",
    AnalysisGap.FILE_UNREADABLE: "a capture file exists but could not be read",
    AnalysisGap.EMPTY_FILE: "a capture file exists but holds no line",
    AnalysisGap.NOT_IN_STORE: "the rollout file has the rollout but the store has no capture",
    AnalysisGap.NOT_IN_ROLLOUTS: "the store has a capture but the rollout file lacks the rollout",
    AnalysisGap.ROLLOUT_LINE_DAMAGED: "a line of the rollout file is not a JSON object",
    AnalysisGap.ROLLOUT_WITHOUT_ID: "a rollout record carries no rollout id",
    AnalysisGap.DUPLICATE_ROLLOUT: "the rollout file holds the same rollout id more than once",
    AnalysisGap.ATTACHMENT_UNREADABLE: "the record's ng_model_call_capture is not readable",
    AnalysisGap.CALL_NOT_IN_STORE: "the attachment lists a call the store does not hold",
    AnalysisGap.CALL_NOT_IN_ATTACHMENT: "the store holds a call the attachment does not list",
    AnalysisGap.TOTALS_DIFFER: "the attachment's metrics differ from the store's totals",
    AnalysisGap.NO_CAPTURE: (
        "the record has no ng_model_call_capture and no store was given: its calls are unknown"
    ),
    AnalysisGap.FACTS_DIFFER: (
        "a capture line's stored facts differ from its bodies (open_run verify=True); "
        "the row holds what the bodies say"
    ),
}


def gap_meaning(code: str) -> str:
    """What a gap code means (codes from newer writers say so)."""
    return GAP_MEANINGS.get(code, "unknown gap code (written by a newer or foreign producer)")


GAPS: Final = FrameSchema(
    "gaps",
    [
        Column("run", pl.Categorical(), "The run's label."),
        Column("rollout_id", _STR, "The rollout concerned (null for directory-level gaps)."),
        Column("model_call_id", _STR, "The call concerned, when one is."),
        Column("call_index", _INT, "The line's `call_index`, for damaged lines."),
        Column("code", pl.Categorical(), "Gap code (see `gap_meaning`)."),
        Column("detail", _STR, "What exactly is wrong."),
        Column("source", pl.Categorical(), "store, rollouts, attachment or comparison."),
        Column("path", _STR, "The file concerned."),
        Column("line_number", _INT, "1-based line number in that file, when known."),
        Column("byte_offset", _INT, "Byte offset of that line, when known."),
    ],
)


class GapRows:
    """Accumulates gap rows."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, code: str, *, source: str, **fields: Any) -> None:
        unknown = set(fields) - set(GAPS.names)
        if unknown:
            raise ValueError(f"unknown gap field(s): {sorted(unknown)}")
        self.rows.append({"code": str(code), "source": source, **fields})

    def extend(self, other: GapRows) -> None:
        self.rows.extend(other.rows)

    def frame(self, run: str | None = None) -> pl.DataFrame:
        return GAPS.from_rows({**row, "run": run} for row in self.rows)
