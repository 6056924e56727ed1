"""What a segment holds: its format number, its columns, and which of them are never null."""

from __future__ import annotations

from typing import Final

import polars as pl

__all__ = [
    "ENVELOPE_COLUMNS",
    "FACT_TYPES",
    "NEVER_NULL",
    "SEGMENT_FORMAT",
    "SEGMENT_SCHEMA",
    "SEGMENT_SUFFIX",
    "TAIL_BYTES",
    "TOOL_TYPE",
    "WHERE_COLUMNS",
]

#: What a segment holds (its columns and what decoded them); part of its name.
#: 2: ``inode`` unsigned.
SEGMENT_FORMAT: Final = 2
SEGMENT_SUFFIX: Final = ".parquet"
#: Bytes at the end of a segment's stretch whose hash is in its name.
TAIL_BYTES: Final = 256

#: A tool call (``_line_types._Tool``'s fields).
TOOL_TYPE: Final = pl.Struct(
    {
        "choice_index": pl.Int64(),
        "call_id": pl.String(),
        "type": pl.String(),
        "name": pl.String(),
        "arguments": pl.String(),
        "arguments_raw": pl.String(),
        "arguments_parse_error": pl.Boolean(),
    }
)
_COUNTS = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens",
           "cache_creation_tokens")  # fmt: skip
#: The facts that are ``calls`` columns (``_facts_rows.FACT_COLUMNS``), with their types.
FACT_TYPES: Final = {
    "response_id": pl.String(),
    "model": pl.String(),
    "stream": pl.Boolean(),
    "response_status": pl.String(),
    "finish_reason": pl.String(),
    **dict.fromkeys(_COUNTS, pl.Int64()),
    "reasoning_content": pl.String(),
    "error_code": pl.String(),
    "error_message": pl.String(),
}
#: Where an entry's line is: all the first pass of a scan reads of a segment.
WHERE_COLUMNS: Final = ("file", "offset", "length", "size", "mtime_ns", "inode", "size_before",
                        "mtime_before_ns")  # fmt: skip
#: The entry's fields taken as they are.
ENVELOPE_COLUMNS: Final = (*WHERE_COLUMNS, "model_call_id", "dialect", "started_at",
                           "completed_at", "latency_ms", "latency_ttft_ms", "status_code",
                           "error_category")  # fmt: skip
#: The columns of a segment: one row per entry that decodes, ``line`` its line in the journal
#: (from 0), ``v`` its facts' version (null: none), ``tool_calls`` an empty list for none.
SEGMENT_SCHEMA: Final = {
    "line": pl.Int64(),
    "file": pl.String(),
    "offset": pl.Int64(),
    "length": pl.Int64(),
    "size": pl.Int64(),
    "mtime_ns": pl.Int64(),
    "inode": pl.UInt64(),  # st_ino is unsigned: some file systems use all 64 bits
    "size_before": pl.Int64(),
    "mtime_before_ns": pl.Int64(),
    "model_call_id": pl.String(),
    "dialect": pl.String(),
    "model_ref_type": pl.String(),
    "model_ref_name": pl.String(),
    "started_at": pl.Float64(),
    "completed_at": pl.Float64(),
    "latency_ms": pl.Float64(),
    "latency_ttft_ms": pl.Float64(),
    "status_code": pl.Int64(),
    "error_category": pl.String(),
    "v": pl.Int64(),
    **FACT_TYPES,
    "tool_calls": pl.List(TOOL_TYPE),
}
#: Columns no entry leaves null (a segment holding a null there is not one ``write`` wrote).
NEVER_NULL: Final = ("line", *WHERE_COLUMNS, "model_call_id", "dialect", "tool_calls")
