"""What a dialect reads out of one response body, and the shared parsing helpers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from capture_core.records import ToolCall
from capture_core.sse import SSEEvent

__all__ = [
    "EMPTY_TOKENS",
    "ResponseFacts",
    "TerminalKind",
    "TokenStats",
    "count",
    "error_fields",
    "event_type",
    "join_text",
    "nonempty_str",
    "opt_str",
    "tool_call",
]

TerminalKind = Literal["complete", "incomplete", "error"]

# Token counts become Polars Int64 downstream; anything larger cannot be a real count.
_MAX_COUNT: Final = 2**63 - 1
# Deeper tool arguments are kept as raw text: JSON encoders stop near 255 levels, and an
# attachment nests arguments a few levels down.
MAX_ARGUMENT_DEPTH: Final = 128


@dataclass(frozen=True, slots=True)
class TokenStats:
    """Normalized token usage of one call; ``None`` means the provider did not report it."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None


EMPTY_TOKENS: Final = TokenStats()


@dataclass(frozen=True, slots=True)
class ResponseFacts:
    """Everything a dialect reads out of one (non-streaming or reassembled) response body."""

    response_id: str | None = None
    model: str | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    tokens: TokenStats = EMPTY_TOKENS
    tool_calls: tuple[ToolCall, ...] = field(default_factory=tuple)
    reasoning: str | None = None
    error_code: str | None = None
    error_message: str | None = None


def count(value: object) -> int | None:
    """A token count as reported: exactly an ``int`` (not bool, float or str) and >= 0."""
    if type(value) is int and 0 <= value <= _MAX_COUNT:
        return value
    return None


def event_type(event: SSEEvent, payload: object) -> str | None:
    """An event's type: its ``event:`` name, else the ``type`` of its JSON data."""
    if event.event is not None:
        return event.event
    if isinstance(payload, Mapping):
        kind = payload.get("type")
        if isinstance(kind, str):
            return kind
    return None


def too_deep(value: object, limit: int = MAX_ARGUMENT_DEPTH) -> bool:
    """Whether a parsed JSON value nests more than ``limit`` levels (iterative, no recursion)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return False


def opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def nonempty_str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def join_text(fragments: Iterable[str]) -> str | None:
    """Join reasoning fragments with newlines; nothing to join gives ``None``."""
    text = "\n".join(fragments)
    return text or None


def tool_call(
    *, call_id: object, type_: object, name: object, arguments: object, parse: bool = True
) -> ToolCall:
    """Build a :class:`ToolCall`, parsing JSON-string arguments and flagging unparseable ones."""
    parsed: Any = arguments
    raw: str | None = None
    failed = False
    if parse and isinstance(arguments, str | bytes):
        text = arguments.decode("utf-8", "replace") if isinstance(arguments, bytes) else arguments
        if not text.strip():
            parsed = {}
        else:
            try:
                parsed = orjson.loads(text)
            except orjson.JSONDecodeError:
                parsed, raw, failed = None, text, True
            else:
                if too_deep(parsed):
                    parsed, raw, failed = None, text, True
    elif isinstance(arguments, dict | list) and too_deep(arguments):
        parsed, failed = None, True
    return ToolCall.model_construct(
        call_id=opt_str(call_id),
        type=opt_str(type_),
        name=opt_str(name),
        arguments=parsed,
        arguments_raw=raw,
        arguments_parse_error=failed,
    )


def error_fields(error: object) -> tuple[str | None, str | None]:
    """``(code, message)`` of an error object (OpenAI, Anthropic or Responses shape) or string."""
    if error is None:  # the common case, answered before the slow ABC check below
        return None, None
    if isinstance(error, str):
        return None, error or None
    if type(error) is not dict and not isinstance(error, Mapping):
        return None, None
    code = error.get("code")
    if code is None:
        code = error.get("type")
    if isinstance(code, bool) or not isinstance(code, str | int):
        code = None
    return (None if code is None else str(code)), nonempty_str(error.get("message"))
