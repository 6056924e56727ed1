"""Turn one raw capture line into a :class:`~capture_core.records.ModelCallRecord`.

The raw line is validated for its known keys (unknown keys are ignored, so newer writers stay
readable); the response body is then read by the dialect that produced it: tokens, tool calls,
reasoning, finish reason, status and error details. Malformed *nested* shapes inside a body never
raise: they give ``None`` or empty values. A line whose own fields have the wrong types raises
:class:`~capture_core.exceptions.InvalidRecordError`, so the reader can count and locate it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from capture_core._lines import json_kind
from capture_core.dialects import extract_response
from capture_core.exceptions import InvalidRecordError
from capture_core.records import ModelCallRecord, RawCaptureLine, utc_from_unix

__all__ = ["normalize_line", "record_fields", "validate_raw_line"]


def validate_raw_line(data: object) -> RawCaptureLine:
    """Validate a parsed JSON value as a raw capture line, or raise ``InvalidRecordError``."""
    if not isinstance(data, dict):
        raise InvalidRecordError(f"a capture line must be a JSON object, not {json_kind(data)}")
    try:
        return RawCaptureLine.model_validate(data)
    except ValidationError as exc:
        raise InvalidRecordError(_describe(exc)) from None


def normalize_line(data: object, call_index: int) -> ModelCallRecord:
    """Build the normalized record of one parsed capture line.

    Args:
        data: the line's parsed JSON value.
        call_index: the line's durable ordinal in its file.

    Raises:
        InvalidRecordError: the value is not a capture line.

    Example:
        >>> normalize_line({"model_call_id": "c1", "dialect": "chat",
        ...                 "response": {"usage": {"prompt_tokens": 3}}}, 0).tokens_in
        3
    """
    raw = validate_raw_line(data)
    return record_from_raw(raw, call_index)


def record_from_raw(raw: RawCaptureLine, call_index: int) -> ModelCallRecord:
    """Derive the record of an already validated raw line."""
    return ModelCallRecord.model_construct(**record_fields(raw, call_index))


def record_fields(raw: RawCaptureLine, call_index: int) -> dict[str, Any]:
    """The field values of the record of ``raw``, as a dict (what ``record_from_raw`` builds).

    Bulk readers that turn lines into columns use this directly and skip building the model.
    """
    facts = extract_response(raw.dialect, raw.response)
    request = raw.request
    model = facts.model
    if model is None and request is not None:
        requested = request.get("model")
        model = requested if isinstance(requested, str) and requested else None
    # The APIs default to non-streaming, so a request without ``stream`` did not stream.
    stream = None if request is None else request.get("stream", False) is True
    tokens = facts.tokens
    return {
        "model_call_id": raw.model_call_id,
        "response_id": facts.response_id,
        "call_index": call_index,
        "model_ref": raw.model_ref,
        "model": model,
        "dialect": raw.dialect,
        "stream": stream,
        "status_code": raw.status_code,
        "response_status": facts.response_status,
        "finish_reason": facts.finish_reason,
        "started_at": _timestamp(raw.started_at),
        "completed_at": _timestamp(raw.completed_at),
        "tokens_in": tokens.tokens_in,
        "tokens_out": tokens.tokens_out,
        "tokens_reasoning": tokens.tokens_reasoning,
        "tokens_total": tokens.tokens_total,
        "request": request,
        "response": raw.response,
        "request_raw": raw.request_raw,
        "response_raw": raw.response_raw,
        "tool_calls": list(facts.tool_calls),
        "reasoning_content": facts.reasoning,
        "cache_hit": None if tokens.cached_tokens is None else tokens.cached_tokens > 0,
        "cached_tokens": tokens.cached_tokens,
        "cache_creation_tokens": tokens.cache_creation_tokens,
        "error_category": raw.error_category,
        "error_code": facts.error_code,
        "error_message": facts.error_message,
        "latency_total_ms": raw.latency_ms,
        "latency_ttft_ms": raw.latency_ttft_ms,
    }


def _timestamp(value: float | None) -> datetime | None:
    if value is None:
        return None
    try:
        return utc_from_unix(value)
    except ValueError as exc:
        raise InvalidRecordError(str(exc)) from None


def _describe(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    field = ".".join(str(part) for part in first["loc"]) or "line"
    more = exc.error_count() - 1
    suffix = f" (and {more} more)" if more else ""
    return f"field {field!r}: {first['msg']}{suffix}"
