"""OpenAI Responses (``POST /v1/responses``): facts, terminal events, stream reassembly.

A stream normally ends in ``response.completed``/``.incomplete``/``.failed`` (or ``error``)
whose ``response`` is the whole final object; that envelope is used as is. When no terminal
envelope arrived (a truncated stream), the output items are rebuilt from the ``output_item``,
``content_part``, text, refusal, reasoning and argument delta events, on top of the last
interim ``response`` seen, so the partial answer is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from capture_core.dialects._facts import (
    ResponseFacts,
    TerminalKind,
    error_fields,
    event_type,
    join_text,
    nonempty_str,
    opt_str,
    tool_call,
)
from capture_core.dialects._usage import token_stats
from capture_core.records import ToolCall
from capture_core.sse import SSEEvent

__all__ = ["NAME", "PATH", "extract", "reassemble", "terminal_kind"]

NAME: Final = "responses"
PATH: Final = "/v1/responses"

_TERMINALS: Final[dict[str, TerminalKind]] = {
    "response.completed": "complete",
    "response.incomplete": "incomplete",
    "response.failed": "error",
    "error": "error",
}
_ENVELOPES: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})
_TOOL_ITEMS: Final = frozenset({"function_call", "custom_tool_call", "mcp_call"})


def terminal_kind(event: SSEEvent) -> TerminalKind | None:
    """The terminal kind of one event (``event:`` name, or the data's ``type``), else None."""
    if event.event is not None:
        return _TERMINALS.get(event.event)
    return _TERMINALS.get(event_type(event, event.json()) or "")


def extract(response: Mapping[str, Any]) -> ResponseFacts:
    """Read id, status, finish reason, tokens, tool calls, reasoning and error of a Response."""
    # ``None`` and ``dict`` are tested first: the ABC check of ``Mapping`` is slow, and this
    # runs per line.
    details = response.get("incomplete_details")
    finish = (
        opt_str(details.get("reason"))
        if details is not None and isinstance(details, Mapping)
        else None
    )
    tools: list[ToolCall] = []
    reasoning: list[str] = []
    output = response.get("output")
    for item in output if isinstance(output, list) else ():
        if type(item) is not dict and not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if not isinstance(kind, str):  # a hostile "type" (an object) is not hashable
            continue
        if kind in _TOOL_ITEMS:
            tools.append(_tool(item))
        elif kind == "reasoning":
            reasoning.extend(_reasoning(item))
    code, message = error_fields(response.get("error"))
    return ResponseFacts(
        response_id=opt_str(response.get("id")),
        model=nonempty_str(response.get("model")),
        response_status=opt_str(response.get("status")),
        finish_reason=finish,
        tokens=token_stats(response.get("usage"), NAME),
        tool_calls=tuple(tools),
        reasoning=join_text(reasoning),
        error_code=code,
        error_message=message,
    )


def _tool(item: Mapping[str, Any]) -> ToolCall:
    kind = item.get("type")
    call_id = item.get("call_id") or item.get("id")
    if kind == "custom_tool_call":  # free-form text input, not JSON
        return tool_call(
            call_id=call_id,
            type_=kind,
            name=item.get("name"),
            arguments=item.get("input"),
            parse=False,
        )
    return tool_call(
        call_id=call_id, type_=kind, name=item.get("name"), arguments=item.get("arguments")
    )


def _reasoning(item: Mapping[str, Any]) -> list[str]:
    """Summary texts; the raw ``reasoning_text`` content only when there is no summary."""
    texts = _texts(item.get("summary"), None)
    return texts or _texts(item.get("content"), "reasoning_text")


def _texts(parts: object, kind: str | None) -> list[str]:
    found: list[str] = []
    for part in parts if isinstance(parts, list) else ():
        if (type(part) is dict or isinstance(part, Mapping)) and (
            kind is None or part.get("type") == kind
        ):
            text = part.get("text")
            if isinstance(text, str) and text:
                found.append(text)
    return found


# --- reassembly ------------------------------------------------------------------------------


def _index(payload: Mapping[str, Any], key: str) -> int:
    value = payload.get(key)
    return value if type(value) is int and value >= 0 else 0


@dataclass
class _Item:
    """One output item under construction from delta events."""

    base: dict[str, Any] = field(default_factory=dict)
    content: dict[int, dict[str, Any]] = field(default_factory=dict)
    summary: dict[int, dict[str, Any]] = field(default_factory=dict)
    final: dict[str, Any] | None = None

    def build(self) -> dict[str, Any]:
        if self.final is not None:
            return self.final
        item = dict(self.base)
        if self.content:
            item["content"] = [self.content[i] for i in sorted(self.content)]
        if self.summary:
            item["summary"] = [self.summary[i] for i in sorted(self.summary)]
        return item

    def append(self, key: str, text: object) -> None:
        if isinstance(text, str):
            self.base[key] = str(self.base.get(key) or "") + text

    def part(self, table: dict[int, dict[str, Any]], index: int, kind: str) -> dict[str, Any]:
        return table.setdefault(index, {"type": kind, "text": ""})


class _ItemBuilder:
    def __init__(self) -> None:
        self.items: dict[int, _Item] = {}

    def apply(self, kind: str, payload: Mapping[str, Any]) -> None:
        item = self.items.setdefault(_index(payload, "output_index"), _Item())
        obj = payload.get("item")
        if kind == "response.output_item.added" and isinstance(obj, Mapping):
            item.base = dict(obj)
        elif kind == "response.output_item.done" and isinstance(obj, Mapping):
            item.final = dict(obj)
        elif kind.startswith("response.content_part.") and isinstance(payload.get("part"), Mapping):
            item.content[_index(payload, "content_index")] = dict(payload["part"])
        elif kind.startswith("response.reasoning_summary_part.") and isinstance(
            payload.get("part"), Mapping
        ):
            item.summary[_index(payload, "summary_index")] = dict(payload["part"])
        else:
            self._delta(item, kind, payload)

    def _delta(self, item: _Item, kind: str, payload: Mapping[str, Any]) -> None:
        delta, done = payload.get("delta"), payload.get("text")
        if kind in ("response.output_text.delta", "response.output_text.done"):
            part = item.part(item.content, _index(payload, "content_index"), "output_text")
            _grow(part, "text", delta, done, kind)
        elif kind in ("response.refusal.delta", "response.refusal.done"):
            part = item.part(item.content, _index(payload, "content_index"), "refusal")
            part.pop("text", None)
            _grow(part, "refusal", delta, payload.get("refusal"), kind)
        elif kind in ("response.reasoning_text.delta", "response.reasoning_text.done"):
            part = item.part(item.content, _index(payload, "content_index"), "reasoning_text")
            _grow(part, "text", delta, done, kind)
        elif kind.startswith("response.reasoning_summary_text."):
            part = item.part(item.summary, _index(payload, "summary_index"), "summary_text")
            _grow(part, "text", delta, done, kind)
        elif kind.endswith("_arguments.delta"):  # function_call and mcp_call arguments
            item.base.setdefault("type", "function_call")
            item.append("arguments", delta)
        elif kind.endswith("_arguments.done") and isinstance(payload.get("arguments"), str):
            item.base["arguments"] = payload["arguments"]
        elif kind == "response.custom_tool_call_input.delta":
            item.append("input", delta)
        elif kind == "response.custom_tool_call_input.done" and isinstance(
            payload.get("input"), str
        ):
            item.base["input"] = payload["input"]

    def output(self) -> list[dict[str, Any]]:
        return [
            self.items[i].build()
            for i in sorted(self.items)
            if self.items[i].base
            or self.items[i].final is not None
            or self.items[i].content
            or self.items[i].summary
        ]


def _grow(part: dict[str, Any], key: str, delta: object, done: object, kind: str) -> None:
    if kind.endswith(".done") and isinstance(done, str):
        part[key] = done
    elif isinstance(delta, str):
        part[key] = str(part.get(key) or "") + delta


def reassemble(events: Iterable[SSEEvent]) -> dict[str, Any] | None:
    """Rebuild the Response object of a stream; ``None`` when nothing usable was streamed."""
    envelope: dict[str, Any] | None = None
    latest: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    builder = _ItemBuilder()
    for event in events:
        payload = event.json()
        if not isinstance(payload, dict):
            continue
        kind = event_type(event, payload) or ""
        response = payload.get("response")
        if isinstance(response, dict):
            latest = response
            if kind in _ENVELOPES:
                envelope = response
        if kind == "error":
            inner = payload.get("error")
            error = (
                dict(inner)
                if isinstance(inner, Mapping)
                else {k: payload[k] for k in ("code", "message", "param") if k in payload}
            )
        elif kind.startswith("response.") and kind not in _ENVELOPES:
            builder.apply(kind, payload)
    output = builder.output()
    if envelope is not None:
        result = dict(envelope)
        if output and not result.get("output"):
            result["output"] = output
        return result
    if latest is None and not output and error is None:
        return None
    result = dict(latest) if latest is not None else {"object": "response"}
    if output:
        result["output"] = output
    if error is not None and not result.get("error"):
        result["error"] = error
    return result
