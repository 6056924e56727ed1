"""Pydantic models of every shape ``capture_core`` persists or returns.

* :class:`RawCaptureLine` — one line of ``<rollout_id>.capture.jsonl``, as the server writes it.
* :class:`ModelCallRecord` — the normalized view of one line (tokens, tool calls, reasoning...).
* :class:`ModelCallMetrics`, :class:`Gap` and :class:`ModelCallCaptureAttachment` — the
  ``ng_model_call_capture`` value attached to a rollout record.

Readers ignore unknown keys, so files written by a newer version stay readable. ``None`` always
means "not reported / unknown", never zero.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ATTACHMENT_KEY",
    "PAYLOAD_FIELDS",
    "CaptureRecords",
    "DamagedLine",
    "ErrorCategory",
    "Gap",
    "GapCode",
    "ModelCallCaptureAttachment",
    "ModelCallMetrics",
    "ModelCallRecord",
    "ModelRef",
    "RawCaptureLine",
    "ToolCall",
]

ATTACHMENT_KEY: Final = "ng_model_call_capture"
PAYLOAD_FIELDS: Final = ("request", "response", "request_raw", "response_raw")
DEFAULT_MODEL_REF_TYPE: Final = "responses_api_models"

JsonObject = dict[str, Any]


class ErrorCategory(StrEnum):
    """Why a captured call did not succeed (``None`` on the record means it did)."""

    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    AUTH = "auth"
    NOT_FOUND = "not_found"
    CLIENT_ERROR = "client_error"
    UPSTREAM_ERROR = "upstream_error"
    CONNECTION = "connection"
    EXCEPTION = "exception"
    INCOMPLETE = "incomplete"
    STREAM_TRUNCATED = "stream_truncated"
    CAPTURE_PARSE_ERROR = "capture_parse_error"
    #: The client went away before it had the whole answer (request body unfinished, before
    #: the response headers, or mid-body / mid-stream). Not a success, and not the upstream's
    #: ``stream_truncated``: the line keeps what was seen up to then.
    CLIENT_DISCONNECTED = "client_disconnected"


class GapCode(StrEnum):
    """Well-known gap codes. Gaps are plain strings on disk, so unknown codes stay readable."""

    MODEL_CALL_CAPTURE_NO_RECORDS = "model_call_capture_no_records"
    MODEL_CALL_CAPTURE_RECORDS_UNREADABLE = "model_call_capture_records_unreadable"
    MODEL_CALL_CAPTURE_INCOMPLETE = "model_call_capture_incomplete"
    MODEL_CALL_CAPTURE_UNREADABLE = "model_call_capture_unreadable"
    MODEL_CALL_CAPTURE_PENDING = "model_call_capture_pending"
    #: A call's capture write was started by a server process that died before it landed.
    MODEL_CALL_CAPTURE_LOST = "model_call_capture_lost"
    #: A call's capture line could not be written (disk full, no descriptors...); one per call,
    #: read from the server's failure log.
    MODEL_CALL_CAPTURE_FAILED = "model_call_capture_failed"
    TRAJECTORY_PROJECTION_FAILED = "trajectory_projection_failed"
    # Agent observations and ng_trajectory (capture_core.observations):
    #: The agent's ng_agent_observations did not validate, or joining them to the calls failed.
    AGENT_OBSERVATION_JOIN_FAILED = "agent_observation_join_failed"
    #: A reference names no captured call.
    MODEL_CALL_REFERENCE_UNMATCHED = "model_call_reference_unmatched"
    #: A reference names several captured calls; none is chosen.
    MODEL_CALL_REFERENCE_AMBIGUOUS = "model_call_reference_ambiguous"
    #: A reference names a call another reference (or invocation) already owns.
    MODEL_CALL_REFERENCE_CONFLICT = "model_call_reference_conflict"
    #: A captured call no invocation owns (detail ``capture:<id>:call_index=<n>``), or a
    #: compaction names a call its invocation does not own.
    MODEL_CALL_OWNERSHIP_UNAVAILABLE = "model_call_ownership_unavailable"
    PRODUCER_TRAJECTORY_INVALID = "producer_trajectory_invalid"
    #: detail: the mismatched fields, comma-joined (``task_id``, ``rollout_id``).
    PRODUCER_TRAJECTORY_IDENTITY_MISMATCH = "producer_trajectory_identity_mismatch"
    AGENT_OBSERVATIONS_INVALID = "agent_observations_invalid"
    MODEL_CALL_CAPTURE_GAP_INVALID = "model_call_capture_gap_invalid"
    MODEL_CALLS_UNAVAILABLE = "model_calls_unavailable"
    TURNS_UNAVAILABLE = "turns_unavailable"
    CONVERSATION_UNAVAILABLE = "conversation_unavailable"
    #: The agent scrubbed ``input_image`` blocks; payload copies are left out of the row.
    MULTIMODAL_HISTORY_REDACTED = "multimodal_history_redacted"
    #: A producer could not time (some of) its tool executions.
    TOOL_TIMING_UNAVAILABLE = "tool_timing_unavailable"
    #: ``ng_perf`` was not derived; detail: the missing evidence.
    PERF_UNAVAILABLE = "perf_unavailable"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class ModelRef(_Model):
    """Which model server answered: ``{"type": "responses_api_models", "name": ...}``."""

    type: str = DEFAULT_MODEL_REF_TYPE
    name: str


class RawCaptureLine(_Model):
    """One raw model-server exchange: one line of ``<rollout_id>.capture.jsonl``.

    Keys serialize in the order of the spec. ``request_raw`` and ``response_raw`` are written
    only when needed (an unparseable or non-object body; every streamed response keeps its raw
    SSE text), never as null placeholders.
    """

    model_call_id: str
    dialect: str
    model_ref: ModelRef | None = None
    started_at: float | None = None
    completed_at: float | None = None
    latency_ms: float | None = None
    latency_ttft_ms: float | None = None
    status_code: int | None = None
    error_category: str | None = None
    request: JsonObject | None = None
    response: JsonObject | None = None
    request_raw: str | None = None
    response_raw: str | None = None

    def to_json_dict(self) -> JsonObject:
        """The line as a JSON-ready dict, without the absent optional raw keys."""
        data = self.model_dump(mode="python")
        for key in ("request_raw", "response_raw"):
            if data[key] is None:
                del data[key]
        return data

    def to_jsonl(self) -> bytes:
        """The line as compact JSON bytes ending in a newline."""
        return orjson.dumps(self.to_json_dict(), option=orjson.OPT_APPEND_NEWLINE)


class ToolCall(_Model):
    """A tool call the model asked for.

    ``arguments`` is the parsed JSON value. Arguments that are not valid JSON are kept verbatim
    in ``arguments_raw`` with ``arguments_parse_error`` set, and ``arguments`` is then ``None``.
    """

    call_id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: Any = None
    arguments_raw: str | None = None
    arguments_parse_error: bool = False


def utc_from_unix(seconds: float) -> datetime:
    """Unix seconds as an aware UTC datetime; ``ValueError`` if not finite or out of range."""
    if not math.isfinite(seconds):
        raise ValueError("timestamp must be finite")
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError) as exc:
        raise ValueError(f"timestamp {seconds!r} is out of range") from exc


def _utc(value: object) -> object:
    """Accept Unix seconds or datetimes; always return an aware UTC datetime."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return utc_from_unix(value)
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value


class ModelCallRecord(_Model):
    """The normalized view of one captured model call.

    ``call_index`` is the 0-based ordinal of the line in its file (damaged lines keep their
    index); it reflects append order, not causality. Timestamps are UTC. Every token field is
    ``None`` when the provider did not report it.
    """

    model_call_id: str | None = None
    response_id: str | None = None
    call_index: int = Field(ge=0)
    model_ref: ModelRef | None = None
    model: str | None = None
    dialect: str | None = None
    stream: bool | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    request: JsonObject | None = None
    response: JsonObject | None = None
    request_raw: str | None = None
    response_raw: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning_content: str | None = None
    cache_hit: bool | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None
    error_category: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    latency_total_ms: float | None = None
    latency_ttft_ms: float | None = None

    _utc_started = field_validator("started_at", mode="before")(_utc)
    _utc_completed = field_validator("completed_at", mode="before")(_utc)

    def to_json_dict(self, *, include_payloads: bool = False) -> JsonObject:
        """JSON-ready dict with every field (nulls included); payloads only when asked."""
        exclude = None if include_payloads else set(PAYLOAD_FIELDS)
        return self.model_dump(mode="json", exclude=exclude)


class ModelCallMetrics(_Model):
    """Per-rollout totals. A total sums the values calls reported; ``None`` = none reported."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    cached_tokens: int | None = None
    latency_total_ms: float | None = None
    num_calls: int = Field(default=0, ge=0)


class Gap(_Model):
    """Missing or doubtful evidence, as ``{"code": ..., "detail": ...}`` (detail optional)."""

    code: str
    detail: str | None = None

    def to_json_dict(self) -> JsonObject:
        return self.model_dump(mode="json", exclude_none=True)


class ModelCallCaptureAttachment(_Model):
    """The ``ng_model_call_capture`` value attached to a rollout record."""

    rollout_id: str
    metrics: ModelCallMetrics
    calls: list[ModelCallRecord] = Field(default_factory=list)
    gaps: list[Gap] = Field(default_factory=list)

    def to_json_dict(self, *, include_payloads: bool = False) -> JsonObject:
        """The attachment as written into a rollout record; ``gaps`` is omitted when empty."""
        data: JsonObject = {
            "rollout_id": self.rollout_id,
            "metrics": self.metrics.model_dump(mode="json"),
            "calls": [c.to_json_dict(include_payloads=include_payloads) for c in self.calls],
        }
        if self.gaps:
            data["gaps"] = [gap.to_json_dict() for gap in self.gaps]
        return data


class CaptureFailure(_Model):
    """One call whose capture line could not be written, as kept in a server's failure log.

    Attributes:
        rollout_id: the rollout.
        model_call_id: the call.
        dialect: the call's dialect.
        started_at: when the call started (Unix seconds, the server's clock).
        failed_at: when the write failed (Unix seconds, the server's clock).
        reason: why, e.g. ``"EMFILE: Too many open files"``.
        writer: the token of the server process that failed to write it.
    """

    rollout_id: str
    model_call_id: str
    dialect: str | None = None
    started_at: float | None = None
    failed_at: float
    reason: str
    writer: str | None = None


class DamagedLine(_Model):
    """A line of a capture file that is not a readable record, and where it is.

    Attributes:
        path: the capture file.
        line_number: 1-based physical line number.
        call_index: the durable ``call_index`` the line occupies (damaged lines keep theirs).
        byte_offset: offset of the line's first byte in the file.
        length: the line's length in bytes, without its newline.
        reason: what is wrong with it.
    """

    path: str
    line_number: int = Field(ge=1)
    call_index: int = Field(ge=0)
    byte_offset: int = Field(ge=0)
    length: int = Field(ge=0)
    reason: str


class CaptureRecords(_Model):
    """What a tolerant read of one rollout's capture returns: records and the evidence gaps."""

    rollout_id: str
    records: list[ModelCallRecord] = Field(default_factory=list)
    damaged: list[DamagedLine] = Field(default_factory=list)
    incomplete: bool = False
    file_exists: bool = False
