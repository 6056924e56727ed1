"""Classify how a captured call ended: the ``error_category`` of its capture line.

Precedence, first match wins: the HTTP status (>= 400); the stream's in-band terminal
(``error`` → ``upstream_error``, ``incomplete`` → ``incomplete``); a successful stream that
ended without its terminal event → ``stream_truncated`` (its partial reassembly is kept); a
non-empty body that could not be read as an object → ``capture_parse_error``. Otherwise the call
succeeded and the category is ``None``.
"""

from __future__ import annotations

import asyncio

from capture_core.dialects import TerminalKind
from capture_core.records import ErrorCategory

__all__ = ["classify_exception", "classify_outcome", "classify_status"]


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


def classify_outcome(
    status: int | None,
    *,
    streaming: bool,
    terminal: TerminalKind | None,
    parsed: bool,
    body_empty: bool,
) -> ErrorCategory | None:
    """The category of a call that returned (the exception path uses classify_exception).

    Args:
        status: the HTTP status the client received, if any.
        streaming: whether the response was an SSE stream.
        terminal: the stream's first terminal event kind, if one was seen.
        parsed: whether the body was read (or reassembled) into a JSON object.
        body_empty: whether the response body was empty.
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
    if not body_empty and not parsed:
        return ErrorCategory.CAPTURE_PARSE_ERROR
    return None
