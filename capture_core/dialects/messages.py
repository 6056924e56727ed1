"""Anthropic Messages (``POST /v1/messages``): facts, terminal events, stream reassembly.

Streams use ``event:`` lines: ``message_start`` carries the message shell and input-side usage,
``content_block_*`` events build text, thinking and ``tool_use`` blocks, ``message_delta``
carries the stop reason and the cumulative output tokens, ``message_stop`` ends the stream and
``error`` may arrive after a 200 response has started. Anthropic's usage does not report
reasoning tokens (unless ``output_tokens_details.thinking_tokens`` is present), so
``tokens_reasoning`` is ``None`` for this dialect by default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

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

NAME: Final = "messages"
PATH: Final = "/v1/messages"

_TERMINALS: Final[dict[str, TerminalKind]] = {"message_stop": "complete", "error": "error"}
_TOOL_BLOCKS: Final = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
_APPENDED: Final = {"text_delta": "text", "thinking_delta": "thinking"}


def terminal_kind(event: SSEEvent) -> TerminalKind | None:
    """``message_stop`` completes a stream, ``error`` ends it in error."""
    payload = None if event.event is not None else event.json()
    return _TERMINALS.get(event_type(event, payload) or "")


def extract(response: Mapping[str, Any]) -> ResponseFacts:
    """Read id, stop reason, tokens, tool calls, thinking and error of a Message."""
    tools: list[ToolCall] = []
    thinking: list[str] = []
    content = response.get("content")
    for block in content if isinstance(content, list) else ():
        if type(block) is not dict and not isinstance(block, Mapping):  # dict first: ABCs are slow
            continue
        kind = block.get("type")
        if not isinstance(kind, str):  # a hostile "type" (an object) is not hashable
            continue
        if kind in _TOOL_BLOCKS:
            tools.append(
                tool_call(
                    call_id=block.get("id"),
                    type_=kind,
                    name=block.get("name"),
                    arguments=block.get("input"),
                )
            )
        elif kind in ("thinking", "redacted_thinking"):
            text = block.get("thinking")
            if isinstance(text, str) and text:
                thinking.append(text)
    code, message = error_fields(response.get("error"))
    return ResponseFacts(
        response_id=opt_str(response.get("id")),
        model=nonempty_str(response.get("model")),
        finish_reason=opt_str(response.get("stop_reason")),
        tokens=token_stats(response.get("usage"), NAME),
        tool_calls=tuple(tools),
        reasoning=join_text(thinking),
        error_code=code,
        error_message=message,
    )


def _index(payload: Mapping[str, Any], default: int) -> int:
    value = payload.get("index")
    return value if type(value) is int and value >= 0 else default


class _Message:
    def __init__(self) -> None:
        self.shell: dict[str, Any] | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.usage: dict[str, Any] = {}
        self.error: Any = None

    def apply(self, kind: str, payload: Mapping[str, Any]) -> None:
        if kind == "message_start" and isinstance(payload.get("message"), Mapping):
            message = payload["message"]
            self.shell = {k: v for k, v in message.items() if k not in ("content", "usage")}
            usage = message.get("usage")
            if isinstance(usage, Mapping):
                # message_start's output_tokens is a placeholder; message_delta has the count.
                self._merge_usage({k: v for k, v in usage.items() if k != "output_tokens"})
        elif kind == "content_block_start":
            block = payload.get("content_block")
            index = _index(payload, len(self.blocks))
            self.blocks[index] = dict(block) if isinstance(block, Mapping) else {}
        elif kind == "content_block_delta" and isinstance(payload.get("delta"), Mapping):
            self._delta(_index(payload, 0), payload["delta"])
        elif kind == "message_delta":
            delta = payload.get("delta")
            if isinstance(delta, Mapping):
                shell = self.shell if self.shell is not None else {}
                shell.update({k: delta[k] for k in ("stop_reason", "stop_sequence") if k in delta})
                self.shell = shell
            self._merge_usage(payload.get("usage"))
        elif kind == "error":
            self.error = payload.get("error") or dict(payload)

    def _merge_usage(self, usage: object) -> None:
        if isinstance(usage, Mapping):
            # Later values win (output_tokens is cumulative); a null means "not repeated here".
            self.usage.update({k: v for k, v in usage.items() if v is not None})

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        block = self.blocks.setdefault(index, {})
        kind = delta.get("type")
        if isinstance(kind, str) and kind in _APPENDED:  # an object "type" is not hashable
            key = _APPENDED[kind]
            block.setdefault("type", key)
            if isinstance(delta.get(key), str):
                block[key] = str(block.get(key) or "") + delta[key]
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            block["signature"] = str(block.get("signature") or "") + delta["signature"]
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self.partial_json.setdefault(index, []).append(delta["partial_json"])
        elif kind == "citations_delta" and "citation" in delta:
            prior = block.get("citations")  # a start block may carry null (or junk) there
            block["citations"] = [*(prior if isinstance(prior, list) else []), delta["citation"]]

    def build(self) -> dict[str, Any] | None:
        if self.shell is None and not self.blocks and self.error is None:
            return None
        for index, parts in self.partial_json.items():
            block = self.blocks.setdefault(index, {"type": "tool_use"})
            if not block.get("input"):
                block["input"] = _parse_input("".join(parts))
        result: dict[str, Any] = {**(self.shell or {}), "type": "message"}
        result["content"] = [self.blocks[i] for i in sorted(self.blocks)]
        if self.usage:
            result["usage"] = self.usage
        if self.error is not None:
            result["error"] = self.error
        return result


def _parse_input(text: str) -> Any:
    """Parsed tool input; unparseable (e.g. truncated) JSON stays a string, flagged later."""
    if not text.strip():
        return {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def reassemble(events: Iterable[SSEEvent]) -> dict[str, Any] | None:
    """Rebuild the Message of a stream; ``None`` when nothing usable was streamed."""
    message = _Message()
    for event in events:
        payload = event.json()
        if isinstance(payload, Mapping):
            message.apply(event_type(event, payload) or "", payload)
    return message.build()
