"""What an export may carry: the column allowlist per table and the payload refusal rules.

:data:`ALLOWED_COLUMNS` lists, per exported table, the columns kept by default (``file`` is
the base name of ``path``). :data:`PAYLOAD_COLUMNS` hold payload text or a copy of it and are
refused even when asked for with ``extra_columns=`` (a ``task_`` prefix does not hide one);
:func:`check_extra_columns` enforces that. :data:`DIGEST_COLUMNS` are what
``payload_digests=True`` adds. :mod:`ngcapture_viz.export.tables` builds the tables from these.

Example:
    >>> "reasoning_content" in PAYLOAD_COLUMNS, "reasoning_content" in ALLOWED_COLUMNS["calls"]
    (True, False)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import polars as pl

from ngcapture_viz.exceptions import ExportError

__all__ = [
    "ALLOWED_COLUMNS",
    "DIGEST_COLUMNS",
    "PAYLOAD_COLUMNS",
    "check_extra_columns",
    "is_refused",
]

#: Columns each exported table keeps by default, in order. ``file`` is the base name of ``path``.
ALLOWED_COLUMNS: Final[Mapping[str, tuple[str, ...]]] = {
    "calls": (
        "run",
        "rollout_id",
        "call_index",
        "model_call_id",
        "response_id",
        "model_ref_type",
        "model_ref_name",
        "model",
        "dialect",
        "stream",
        "status_code",
        "response_status",
        "finish_reason",
        "outcome",
        "started_at",
        "completed_at",
        "latency_total_ms",
        "latency_ttft_ms",
        "tokens_in",
        "tokens_out",
        "tokens_reasoning",
        "tokens_total",
        "cached_tokens",
        "cache_creation_tokens",
        "cache_hit",
        "output_tokens_per_s",
        "num_tool_calls",
        "tool_names",
        "error_category",
        "error_code",
        "source",
        "file",
        "line_number",
        "byte_offset",
        "line_bytes",
    ),
    "rollouts": (
        "run",
        "rollout_id",
        "task_id",
        "task_index",
        "rollout_index",
        "attempt",
        "reward",
        "in_store",
        "in_rollouts",
        "incomplete",
        "pending_writes",
        "num_calls",
        "num_errors",
        "num_tool_calls",
        "tokens_in",
        "tokens_out",
        "tokens_reasoning",
        "tokens_total",
        "cached_tokens",
        "latency_total_ms",
        "started_at",
        "completed_at",
        "wall_ms",
        "num_gaps",
        "num_damaged",
        "file",
        "rollouts_line",
    ),
    "gaps": (
        "run",
        "rollout_id",
        "model_call_id",
        "call_index",
        "code",
        "detail",
        "source",
        "file",
        "line_number",
        "byte_offset",
    ),
    "tool_calls": (
        "run",
        "rollout_id",
        "model_call_id",
        "call_index",
        "tool_index",
        "choice_index",
        "call_id",
        "type",
        "name",
        "arguments_parse_error",
        "source",
    ),
}

#: Columns that hold payload text or a copy of it: never exported, even when asked for.
PAYLOAD_COLUMNS: Final = frozenset(
    {
        "request",
        "response",
        "request_raw",
        "response_raw",
        "ng_trajectory",
        "ng_model_call_capture",
        "responses_create_params",
        "reasoning_content",
        "arguments",
        "arguments_raw",
        "input",
        "output",
        "output_text",
        "messages",
    }
)

#: Columns ``payload_digests=True`` adds to the calls table.
DIGEST_COLUMNS: Final = ("payload_sha256", "payload_bytes")


def is_refused(name: str) -> bool:
    """A payload column, or a rollout task field copying one (``task_<payload column>``).

    Example:
        >>> is_refused("task_messages"), is_refused("error_message")
        (True, False)
    """
    return name in PAYLOAD_COLUMNS or name.removeprefix("task_") in PAYLOAD_COLUMNS


def check_extra_columns(frames: Mapping[str, pl.DataFrame], extra: Sequence[str]) -> None:
    """Refuse extra columns that hold payload text, or that no frame has.

    Raises:
        ExportError: naming the refused columns, or the columns that could be added.

    Example:
        >>> check_extra_columns({"calls": run.calls}, ["error_message"])  # doctest: +SKIP
    """
    for name in extra:
        if is_refused(name):
            raise ExportError(
                f"column {name!r} holds payload text (or a copy of it) and is never exported; "
                f"refused columns: {sorted(PAYLOAD_COLUMNS)}"
            )
        if not any(name in frame.columns for frame in frames.values()):
            available = sorted(
                {c for f in frames.values() for c in f.columns if not is_refused(c)} - {"file"}
            )
            raise ExportError(f"extra column {name!r} is in no frame; columns: {available}")
