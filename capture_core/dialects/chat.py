"""OpenAI Chat Completions (``POST /v1/chat/completions``): facts, terminals, reassembly.

Streams are data-only chunks ending in ``data: [DONE]``; an in-band ``{"error": ...}`` chunk or
an ``event: error`` block is an error. Reassembly keeps choices with different ``index`` apart
(one message per choice), concatenates content, reasoning and tool-call argument fragments,
and keeps the last usage chunk (sent with ``choices: []``, ``null`` or none at all).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from capture_core.dialects._facts import (
    ResponseFacts,
    TerminalKind,
    error_fields,
    join_text,
    nonempty_str,
    opt_str,
    tool_call,
)
from capture_core.dialects._usage import token_stats
from capture_core.records import ToolCall
from capture_core.sse import SSEEvent

__all__ = ["NAME", "PATH", "extract", "reassemble", "terminal_kind"]

NAME: Final = "chat"
PATH: Final = "/v1/chat/completions"

_REASONING_KEYS: Final = ("reasoning_content", "reasoning")
_TOP_KEYS: Final = ("id", "created", "model", "system_fingerprint", "service_tier")


def terminal_kind(event: SSEEvent) -> TerminalKind | None:
    """``[DONE]`` completes a stream; ``event: error`` or an error chunk ends it in error."""
    if event.event == "error":
        return "error"
    data = event.data.strip()
    if data == "[DONE]":
        return "complete"
    if '"error"' in data:  # cheap pre-check: only such chunks are parsed here
        payload = event.json()
        if isinstance(payload, Mapping) and payload.get("error") is not None:
            return "error"
    return None


def extract(response: Mapping[str, Any]) -> ResponseFacts:
    """Read id, finish reason, tokens, tool calls, reasoning and error of a chat completion."""
    # ``type(x) is dict`` first: the ABC check of ``Mapping`` is slow and this runs per line.
    choices = response.get("choices")
    choices = (
        [c for c in choices if type(c) is dict or isinstance(c, Mapping)]
        if isinstance(choices, list)
        else []
    )
    tools: list[ToolCall] = []
    reasoning: list[str] = []
    for choice in choices:
        message = choice.get("message")
        if type(message) is not dict and not isinstance(message, Mapping):
            continue
        tools.extend(_tools(message))
        for key in _REASONING_KEYS:
            text = message.get(key)
            if isinstance(text, str) and text:
                reasoning.append(text)
                break
    code, error_message = error_fields(response.get("error"))
    return ResponseFacts(
        response_id=opt_str(response.get("id")),
        model=nonempty_str(response.get("model")),
        finish_reason=opt_str(choices[0].get("finish_reason")) if choices else None,
        tokens=token_stats(response.get("usage"), NAME),
        tool_calls=tuple(tools),
        reasoning=join_text(reasoning),
        error_code=code,
        error_message=error_message,
    )


def _tools(message: Mapping[str, Any]) -> list[ToolCall]:
    found: list[ToolCall] = []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        if type(call) is not dict and not isinstance(call, Mapping):
            continue
        function = call.get("function")
        function = function if type(function) is dict or isinstance(function, Mapping) else {}
        found.append(
            tool_call(
                call_id=call.get("id"),
                type_=call.get("type") or "function",
                name=function.get("name"),
                arguments=function.get("arguments"),
            )
        )
    legacy = message.get("function_call")
    if legacy is not None and isinstance(legacy, Mapping):
        found.append(
            tool_call(
                call_id=None,
                type_="function_call",
                name=legacy.get("name"),
                arguments=legacy.get("arguments"),
            )
        )
    return found


# --- reassembly ------------------------------------------------------------------------------


@dataclass
class _Choice:
    role: str | None = None
    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    reasoning: dict[str, list[str]] = field(default_factory=dict)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    logprobs: list[Any] = field(default_factory=list)

    def apply(self, choice: Mapping[str, Any]) -> None:
        delta = choice.get("delta")
        if type(delta) is dict or isinstance(delta, Mapping):
            self._delta(delta)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self.finish_reason = reason
        logprobs = choice.get("logprobs")
        if (
            logprobs is not None
            and isinstance(logprobs, Mapping)
            and isinstance(logprobs.get("content"), list)
        ):
            self.logprobs.extend(logprobs["content"])

    def _delta(self, delta: Mapping[str, Any]) -> None:
        role = delta.get("role")
        if isinstance(role, str) and role:
            self.role = role
        for key, parts in (("content", self.content), ("refusal", self.refusal)):
            text = delta.get(key)
            if isinstance(text, str):
                parts.append(text)
        for key in _REASONING_KEYS:
            text = delta.get(key)
            if isinstance(text, str) and text:
                self.reasoning.setdefault(key, []).append(text)
                break
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if type(call) is dict or isinstance(call, Mapping):
                self._tool_fragment(call)

    def _slot_index(self, call: Mapping[str, Any]) -> int:
        """The slot a fragment belongs to. Some servers omit ``index``: then a known ``id``
        names its slot, a new ``id`` or name opens one, and a bare fragment continues the last.
        """
        index = call.get("index")
        if type(index) is int:
            return index
        call_id = call.get("id")
        for slot_index, slot in self.tool_calls.items():
            if call_id and slot["id"] == call_id:
                return slot_index
        function = call.get("function")
        named = isinstance(function, Mapping) and bool(function.get("name"))
        if self.tool_calls and not call_id and not named:
            return max(self.tool_calls)
        return max(self.tool_calls, default=-1) + 1

    def _tool_fragment(self, call: Mapping[str, Any]) -> None:
        slot = self.tool_calls.setdefault(
            self._slot_index(call),
            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if isinstance(call.get("id"), str) and call["id"]:
            slot["id"] = call["id"]
        if isinstance(call.get("type"), str) and call["type"]:
            slot["type"] = call["type"]
        function = call.get("function")
        if isinstance(function, Mapping):
            if isinstance(function.get("name"), str) and function["name"]:
                slot["function"]["name"] = function["name"]
            if isinstance(function.get("arguments"), str):
                slot["function"]["arguments"] += function["arguments"]

    def build(self, index: int) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": self.role or "assistant",
            "content": "".join(self.content) or None,
        }
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        for key, parts in self.reasoning.items():
            message[key] = "".join(parts)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        choice: dict[str, Any] = {
            "index": index,
            "message": message,
            "finish_reason": self.finish_reason,
        }
        if self.logprobs:
            choice["logprobs"] = {"content": self.logprobs}
        return choice


def reassemble(events: Iterable[SSEEvent]) -> dict[str, Any] | None:
    """Rebuild the chat completion of a stream; ``None`` when nothing usable was streamed."""
    top: dict[str, Any] = {}
    choices: dict[int, _Choice] = {}
    for event in events:
        payload = event.json()
        if type(payload) is not dict and not isinstance(payload, Mapping):
            continue
        for key in _TOP_KEYS:
            if payload.get(key) not in (None, ""):
                top[key] = payload[key]
        for key in ("usage", "error"):
            value = payload.get(key)
            if value and isinstance(value, Mapping | str):
                top[key] = value
        raw_choices = payload.get("choices")
        for choice in raw_choices if isinstance(raw_choices, list) else ():
            if type(choice) is dict or isinstance(choice, Mapping):
                index = choice.get("index")
                index = index if type(index) is int else 0
                choices.setdefault(index, _Choice()).apply(choice)
    if not choices and not top:
        return None
    result: dict[str, Any] = {"object": "chat.completion", **top}
    result["choices"] = [choices[i].build(i) for i in sorted(choices)]
    return result
