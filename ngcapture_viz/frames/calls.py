"""The calls frame: one row per captured model call, payloads left in the store."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import polars as pl

from capture_core import ModelCallRecord
from ngcapture_viz.frames._columns import UTC_TIME, Column, FrameSchema

if TYPE_CHECKING:
    from ngcapture_viz.load._call_values import CallValues

__all__ = [
    "CALLS",
    "LENGTH_FINISH_REASONS",
    "TRUNCATED_OUTCOMES",
    "CallColumns",
    "call_outcome",
    "is_truncated",
]

_CAT = pl.Categorical()
_INT = pl.Int64()
_FLOAT = pl.Float64()
_STR = pl.String()
_BOOL = pl.Boolean()

#: Finish reasons meaning "stopped by the output-token limit", per dialect.
LENGTH_FINISH_REASONS: Final = frozenset({"length", "max_tokens", "max_output_tokens"})
#: Outcomes that count as truncated: cut by the token limit, or a stream that broke off.
TRUNCATED_OUTCOMES: Final = ("length", "stream_truncated")

CALLS: Final = FrameSchema(
    "calls",
    [
        Column("run", _CAT, "The run's label (checkpoint, experiment...)."),
        Column("rollout_id", _STR, "The rollout the call belongs to."),
        Column("call_index", _INT, "Ordinal of the line in its capture file (durable)."),
        Column("model_call_id", _STR, "Id the capture server gave the call."),
        Column("response_id", _STR, "Id the inference worker gave the response."),
        Column("model_ref_type", _CAT, "`model_ref.type` of the capture line."),
        Column("model_ref_name", _CAT, "`model_ref.name`: the model server the call went to."),
        Column("model", _CAT, "Model named by the response (else by the request)."),
        Column("dialect", _CAT, "Wire dialect: responses, chat or messages."),
        Column("stream", _BOOL, "Whether the request asked for a streamed response."),
        Column("status_code", _INT, "HTTP status the client received."),
        Column("response_status", _CAT, "The response object's own status, when it has one."),
        Column("finish_reason", _CAT, "Why generation stopped, in the dialect's words."),
        Column(
            "outcome",
            _CAT,
            "`length` (stopped by the output-token limit), else the error category, else `ok`.",
        ),
        Column("started_at", UTC_TIME, "When the request reached the capture server (UTC)."),
        Column("completed_at", UTC_TIME, "When the response finished (UTC)."),
        Column("latency_total_ms", _FLOAT, "Wall time of the call at the model server."),
        Column("latency_ttft_ms", _FLOAT, "Time to the first streamed token (streams only)."),
        Column("tokens_in", _INT, "Prompt tokens reported (null: not reported)."),
        Column("tokens_out", _INT, "Output tokens reported, reasoning included."),
        Column("tokens_reasoning", _INT, "Reasoning tokens reported."),
        Column("tokens_total", _INT, "Total tokens reported (or in + out)."),
        Column("cached_tokens", _INT, "Prompt tokens read from the prompt cache."),
        Column("cache_creation_tokens", _INT, "Prompt tokens written to the prompt cache."),
        Column("cache_hit", _BOOL, "cached_tokens > 0 (null when not reported)."),
        Column(
            "output_tokens_per_s",
            _FLOAT,
            "tokens_out / decode time: latency − TTFT for streams (null without TTFT), "
            "else latency.",
        ),
        Column("num_tool_calls", _INT, "Tool calls the response asked for."),
        Column("tool_names", pl.List(_STR), "Names of those tool calls, in order."),
        Column("reasoning_content", _STR, "Reasoning or thinking text the response carried."),
        Column("error_category", _CAT, "Why the call failed (null: it did not)."),
        Column("error_code", _STR, "Error code from the error body, when any."),
        Column("error_message", _STR, "Error message from the error body, when any."),
        Column("source", _CAT, "`store` (capture file) or `attachment` (rollout record)."),
        Column("path", _STR, "The capture file holding the line (null for attachments)."),
        Column("line_number", _INT, "1-based physical line number in that file."),
        Column("byte_offset", _INT, "Offset of the line's first byte (payload access)."),
        Column("line_bytes", _INT, "Length of the line in bytes: the payload's size on disk."),
    ],
)


def call_outcome(error_category: str | None, finish_reason: str | None) -> str:
    """The outcome label of a call: ``length``, its error category, or ``ok``.

    A call stopped by the output-token limit is ``length``: ``capture_core`` files it under
    the error category ``incomplete`` (or none, in older lines), and its finish reason says
    why. Any other error keeps its category (``incomplete`` for, say, a content filter).

    Example:
        >>> call_outcome(None, "stop"), call_outcome("rate_limit", None)
        ('ok', 'rate_limit')
        >>> call_outcome("incomplete", "max_tokens"), call_outcome(None, "length")
        ('length', 'length')
        >>> call_outcome("incomplete", "content_filter")
        'incomplete'
    """
    if finish_reason in LENGTH_FINISH_REASONS and error_category in (None, "incomplete"):
        return "length"
    if error_category is not None:
        return error_category
    return "ok"


def is_truncated() -> pl.Expr:
    """True for calls whose output was cut short (see ``TRUNCATED_OUTCOMES``)."""
    return pl.col("outcome").cast(pl.String).is_in(TRUNCATED_OUTCOMES)


def _micros(value: datetime | None) -> int | None:
    if value is None:
        return None
    # Exact integer arithmetic: timestamp() goes through a float.
    delta = value - _UTC_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


_UTC_EPOCH: Final = datetime.fromisoformat("1970-01-01T00:00:00+00:00")


def _rate(
    tokens: int | None, latency: float | None, ttft: float | None, stream: bool | None
) -> float | None:
    if tokens is None or latency is None or (stream and ttft is None):
        return None  # a stream without TTFT: its decode time is unknown
    seconds = (latency - ttft if stream and ttft is not None else latency) / 1000
    return tokens / seconds if seconds > 0 else None


class CallColumns:
    """Accumulates call rows as tuples (fast), then builds the typed frame column by column.

    Example:
        >>> acc = CallColumns()
        >>> acc.add(ModelCallRecord(call_index=0, tokens_in=3), rollout_id="0-0", source="store")
        >>> acc.frame("ckpt").select("run", "tokens_in", "tokens_out").row(0)
        ('ckpt', 3, None)
    """

    #: The columns of a row, in the order ``add`` builds its tuple: the schema's order, less
    #: ``run`` and ``tool_names`` (added by ``frame``).
    ROW: Final = tuple(name for name in CALLS.names if name not in ("run", "tool_names"))

    def __init__(self) -> None:
        self._rows: list[tuple[Any, ...]] = []
        self._tool_rows: list[int] = []
        self._tool_names: list[str | None] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(
        self,
        record: ModelCallRecord | Mapping[str, Any],
        *,
        rollout_id: str,
        source: str,
        path: str | None = None,
        line_number: int | None = None,
        byte_offset: int | None = None,
        line_bytes: int | None = None,
    ) -> None:
        """Append the row of ``record`` (a record, or the field dict ``record_fields`` gives)."""
        f = record if type(record) is dict or isinstance(record, Mapping) else vars(record)
        ref = f["model_ref"]
        tools = f["tool_calls"]
        error_category, finish_reason = f["error_category"], f["finish_reason"]
        stream, tokens_out = f["stream"], f["tokens_out"]
        latency, ttft = f["latency_total_ms"], f["latency_ttft_ms"]
        if tools:
            row = len(self._rows)
            self._tool_rows.extend([row] * len(tools))
            self._tool_names.extend([tool.name for tool in tools])
        self._rows.append(
            (
                rollout_id,
                f["call_index"],
                f["model_call_id"],
                f["response_id"],
                None if ref is None else ref.type,
                None if ref is None else ref.name,
                f["model"],
                f["dialect"],
                stream,
                f["status_code"],
                f["response_status"],
                finish_reason,
                call_outcome(error_category, finish_reason),
                _micros(f["started_at"]),
                _micros(f["completed_at"]),
                latency,
                ttft,
                f["tokens_in"],
                tokens_out,
                f["tokens_reasoning"],
                f["tokens_total"],
                f["cached_tokens"],
                f["cache_creation_tokens"],
                f["cache_hit"],
                _rate(tokens_out, latency, ttft, stream),
                len(tools),
                f["reasoning_content"],
                error_category,
                f["error_code"],
                f["error_message"],
                source,
                path,
                line_number,
                byte_offset,
                line_bytes,
            )
        )

    def add_values(
        self,
        v: CallValues,
        *,
        rollout_id: str,
        call_index: int,
        path: str,
        line_number: int,
        byte_offset: int,
        line_bytes: int,
    ) -> None:
        """Append the row of one store line read by ``load._decode`` (the fast scan path)."""
        tools = v.tools
        if tools:
            row = len(self._rows)
            self._tool_rows.extend([row] * len(tools))
            self._tool_names.extend([tool[2] for tool in tools])
        tokens = v.tokens
        cached = tokens[4]
        stream, latency, ttft = v.stream, v.latency_ms, v.ttft_ms
        self._rows.append(
            (
                rollout_id,
                call_index,
                v.model_call_id,
                v.response_id,
                v.ref_type,
                v.ref_name,
                v.model,
                v.dialect,
                stream,
                v.status_code,
                v.response_status,
                v.finish_reason,
                call_outcome(v.error_category, v.finish_reason),
                v.started_us,
                v.completed_us,
                latency,
                ttft,
                *tokens,
                None if cached is None else cached > 0,
                _rate(tokens[1], latency, ttft, stream),
                len(tools),
                v.reasoning,
                v.error_category,
                v.error_code,
                v.error_message,
                "store",
                path,
                line_number,
                byte_offset,
                line_bytes,
            )
        )

    def frame(self, run: str | None = None) -> pl.DataFrame:
        """The typed frame (``run`` filled with ``run`` on every row)."""
        columns = zip(*self._rows, strict=True) if self._rows else ([] for _ in self.ROW)
        data: dict[str, Any] = {
            name: list(values) for name, values in zip(self.ROW, columns, strict=True)
        }
        for name in ("started_at", "completed_at"):
            data[name] = pl.Series(name, data[name], dtype=pl.Int64).cast(UTC_TIME)
        data["run"] = [run] * len(self)
        data["tool_names"] = self._names_column()
        return CALLS.from_columns(data)

    def _names_column(self) -> pl.Series:
        """``tool_names`` built from flat lists (building a List column row by row is slow)."""
        names = (
            pl.DataFrame(
                {"row": self._tool_rows, "name": self._tool_names},
                schema={"row": pl.Int64(), "name": pl.String()},
            )
            .group_by("row", maintain_order=True)
            .agg("name")
        )
        rows = pl.DataFrame({"row": pl.int_range(len(self), eager=True, dtype=pl.Int64)})
        joined = rows.join(names, on="row", how="left", maintain_order="left")
        return joined["name"].fill_null([]).cast(pl.List(pl.String()))
