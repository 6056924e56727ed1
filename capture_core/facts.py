"""The derived facts of a call, written into its capture line by the server at capture time.

A reader that knows this key (``ngcapture_facts``) builds a call's row from this small object
and the line's envelope alone, without reading the request and response bodies again; a reader
that does not know it ignores it, as the spec's reader contract says. The values are exactly
what :func:`~capture_core.normalize.record_fields` derives from the same bodies: the server
computes them with the same dialect code, once, while the parsed bodies are still in hand.

The object is stamped with :data:`FACTS_VERSION` (``"v"``) and the writer (``"writer"``):
a reader trusts the facts only when ``v`` is the version it knows, and otherwise (an older or
newer writer, a line without facts: NeMo Gym's, ours before facts existed) normalizes the
bodies as before. **Any change to what normalization derives from a body must bump
FACTS_VERSION** (a test pins the sources it depends on), or readers would keep trusting
facts the new code would no longer produce.

Keys whose value is null (or false, or an empty list) are left out::

    {"v": 1, "writer": "ngcapture 0.1.0", "response_id": "resp_1", "model": "gpt-4.1",
     "stream": false, "response_status": "completed", "tokens_in": 94, "tokens_out": 28,
     "tokens_total": 122, "tool_calls": [{"call_id": "c1", "type": "function_call",
     "name": "lookup", "arguments": "{\\"q\\":\\"x\\"}"}]}
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import Any, Final

import orjson

from capture_core.dialects import ResponseFacts, extract_response
from capture_core.records import ToolCall

__all__ = [
    "FACTS_KEY",
    "FACTS_VERSION",
    "call_facts",
    "line_facts",
    "tool_choice_indices",
    "writer_name",
]

#: The capture line's key holding the facts.
FACTS_KEY: Final = "ngcapture_facts"
#: What the facts mean; bumped whenever normalization would derive something else.
FACTS_VERSION: Final = 1

_WRITER: list[str] = []


def writer_name() -> str:
    """``"ngcapture <version>"``: who wrote the facts (looked up once)."""
    if not _WRITER:
        try:
            version = metadata.version("ngcapture")
        except metadata.PackageNotFoundError:  # pragma: no cover - a bare source tree
            version = "0"
        _WRITER.append(f"ngcapture {version}")
    return _WRITER[0]


def call_facts(
    dialect: str | None,
    request: Mapping[str, Any] | None,
    response: Mapping[str, Any] | None,
    *,
    found: ResponseFacts | None = None,
) -> dict[str, Any]:
    """The facts of one call from its parsed request and response objects.

    ``request`` and ``response`` are the objects the line holds (``None`` when the line holds
    none: a body that was not a JSON object, or no body). Tool-call ``arguments`` are kept as
    the JSON text of the parsed value (what the analysis frames show). ``found``: the
    response's :class:`ResponseFacts` when the caller has read them already (the server does,
    to classify the call).

    Example:
        >>> facts = call_facts("chat", {"model": "m"}, {"usage": {"prompt_tokens": 3}})
        >>> facts["model"], facts["stream"], facts["tokens_in"]
        ('m', False, 3)
    """
    if found is None:
        found = extract_response(dialect, response)
    model = found.model
    if model is None and request is not None:
        requested = request.get("model")
        model = requested if isinstance(requested, str) and requested else None
    tokens = found.tokens
    # The APIs default to non-streaming: a request without ``stream`` did not stream.
    stream = None if request is None else request.get("stream", False) is True
    # Every key, then the nulls dropped: cheaper than a test per key (this runs per call).
    every = {
        "v": FACTS_VERSION,
        "writer": _WRITER[0] if _WRITER else writer_name(),
        "response_id": found.response_id,
        "model": model,
        "stream": stream,
        "response_status": found.response_status,
        "finish_reason": found.finish_reason,
        "tokens_in": tokens.tokens_in,
        "tokens_out": tokens.tokens_out,
        "tokens_reasoning": tokens.tokens_reasoning,
        "tokens_total": tokens.tokens_total,
        "cached_tokens": tokens.cached_tokens,
        "cache_creation_tokens": tokens.cache_creation_tokens,
        "reasoning_content": found.reasoning,
        "error_code": found.error_code,
        "error_message": found.error_message,
    }
    facts = {key: value for key, value in every.items() if value is not None}
    if found.tool_calls:
        tools = [_tool(call) for call in found.tool_calls]
        choices = tool_choice_indices(dialect, response)
        if choices is not None and len(choices) == len(tools):
            for tool, choice in zip(tools, choices, strict=True):
                tool["choice_index"] = choice
        facts["tool_calls"] = tools
    return facts


def _tool(call: ToolCall) -> dict[str, Any]:
    tool: dict[str, Any] = {}
    if call.call_id is not None:
        tool["call_id"] = call.call_id
    if call.type is not None:
        tool["type"] = call.type
    if call.name is not None:
        tool["name"] = call.name
    if call.arguments is not None:
        tool["arguments"] = orjson.dumps(call.arguments).decode()
    if call.arguments_raw is not None:
        tool["arguments_raw"] = call.arguments_raw
    if call.arguments_parse_error:
        tool["arguments_parse_error"] = True
    return tool


def line_facts(
    dialect: str | None,
    request: Mapping[str, Any] | None,
    response: Mapping[str, Any] | None,
    *,
    found: ResponseFacts | None = None,
) -> dict[str, Any] | None:
    """:func:`call_facts` for the capture path: ``None`` (the line then carries no facts and
    readers normalize its bodies) when they cannot be built, e.g. tool arguments that cannot be
    encoded again. Capture never fails because of them."""
    try:
        return call_facts(dialect, request, response, found=found)
    except (TypeError, ValueError, RecursionError):  # orjson.JSONEncodeError is a TypeError
        return None


def tool_choice_indices(dialect: object, response: object) -> list[int] | None:
    """The choice of each tool call of a chat completion, in the record's order.

    The chat reader lists the tool calls of every choice in choice order (``tool_calls``,
    then a legacy ``function_call``); this walks the same choices and says which each came
    from (the choice's ``index``, else its position). ``None`` for other dialects.

    Example:
        >>> tool_choice_indices("chat", {"choices": [
        ...     {"index": 0, "message": {"tool_calls": [{"id": "a"}]}},
        ...     {"index": 1, "message": {"tool_calls": [{"id": "b"}, {"id": "c"}]}}]})
        [0, 1, 1]
    """
    if dialect != "chat" or not isinstance(response, Mapping):
        return None
    choices = response.get("choices")
    if not isinstance(choices, list):
        return None
    found: list[int] = []
    for position, choice in enumerate(c for c in choices if isinstance(c, Mapping)):
        message = choice.get("message")
        if not isinstance(message, Mapping):
            continue
        index = choice.get("index")
        number = index if isinstance(index, int) and not isinstance(index, bool) else position
        calls = message.get("tool_calls")
        count = sum(1 for c in calls if isinstance(c, Mapping)) if isinstance(calls, list) else 0
        count += isinstance(message.get("function_call"), Mapping)
        found += [number] * count
    return found
