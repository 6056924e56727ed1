"""Classify how a captured call ended: the ``error_category`` of its capture line.

Precedence, first match wins: the HTTP status (>= 400); the stream's in-band terminal
(``error`` → ``upstream_error``, ``incomplete`` → ``incomplete``); a successful stream that
ended without its terminal event → ``stream_truncated`` (its partial reassembly is kept); a
non-empty body that could not be read as an object → ``capture_parse_error``; then what the
final object itself says, the same for a streamed and a non-streamed call: an error object or
a failed Response → ``upstream_error``, a model stopped by a limit (Responses ``incomplete``,
Chat ``length``/``content_filter``, Anthropic ``max_tokens``) → ``incomplete``. Otherwise the
call succeeded and the category is ``None``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from capture_core.dialects import ResponseFacts, TerminalKind, extract_response
from capture_core.records import ErrorCategory

__all__ = ["classify_exception", "classify_outcome", "classify_response", "classify_status"]

_LIMIT_REASONS: Final = frozenset(
    {"length", "content_filter", "max_tokens", "model_context_window_exceeded"}
)


def classify_status(status: int | None) -> ErrorCategory | None:
    """The category of an HTTP status; below 400 (or unknown) is not an error.

    Example:
        >>> classify_status(429)
        <ErrorCategory.RATE_LIMIT: 'rate_limit'>
    """
    if status is None or status < 400:
        return None
    if status in (408, 504):
        return ErrorCategory.TIMEOUT
    if status == 429:
        return ErrorCategory.RATE_LIMIT
    if status in (401, 403):
        return ErrorCategory.AUTH
    if status == 404:
        return ErrorCategory.NOT_FOUND
    if status < 500:
        return ErrorCategory.CLIENT_ERROR
    return ErrorCategory.UPSTREAM_ERROR


def classify_exception(exc: BaseException) -> ErrorCategory:
    """The category of an exception raised while serving a call (by its type and name)."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return ErrorCategory.TIMEOUT
    name = type(exc).__name__.lower()
    if "timeout" in name:
        return ErrorCategory.TIMEOUT
    if "conn" in name:
        return ErrorCategory.CONNECTION
    return ErrorCategory.EXCEPTION


def classify_response(
    dialect: str | None, response: Mapping[str, Any], *, facts: ResponseFacts | None = None
) -> ErrorCategory | None:
    """What a final response object says about how the call ended.

    ``facts``: the response's facts when the caller has them already (not read again).

    Example:
        >>> classify_response("chat", {"choices": [{"finish_reason": "length"}]})
        <ErrorCategory.INCOMPLETE: 'incomplete'>
    """
    if facts is None:
        facts = extract_response(dialect, response)
    if facts.response_status == "failed" or response.get("type") == "error":
        return ErrorCategory.UPSTREAM_ERROR
    if facts.response_status is None and response.get("error"):
        return ErrorCategory.UPSTREAM_ERROR
    if facts.response_status == "incomplete" or facts.finish_reason in _LIMIT_REASONS:
        return ErrorCategory.INCOMPLETE
    return None


def classify_outcome(
    status: int | None,
    *,
    streaming: bool,
    terminal: TerminalKind | None,
    response: Mapping[str, Any] | None,
    body_empty: bool,
    dialect: str | None = None,
    facts: ResponseFacts | None = None,
) -> ErrorCategory | None:
    """The category of a call that returned (the exception path uses classify_exception).

    Args:
        status: the HTTP status the client received, if any.
        streaming: whether the response was an SSE stream.
        terminal: the stream's first terminal event kind, if one was seen.
        response: the body read (or the stream reassembled) as a JSON object, if it was.
        body_empty: whether the response body was empty.
        dialect: the call's dialect, to read ``response``.
        facts: ``response``'s facts, when the caller has read them already.
    """
    by_status = classify_status(status)
    if by_status is not None:
        return by_status
    if terminal == "error":
        return ErrorCategory.UPSTREAM_ERROR
    if terminal == "incomplete":
        return ErrorCategory.INCOMPLETE
    if streaming and terminal is None and status is not None:
        return ErrorCategory.STREAM_TRUNCATED
    if response is None:
        return None if body_empty else ErrorCategory.CAPTURE_PARSE_ERROR
    return classify_response(dialect, response, facts=facts)
