"""Buffered SSE: a complete answer object turned into the event stream its client asked for.

Training capture always calls the worker without streaming, so a client that asked for
``stream: true`` is answered from the finished JSON object: every event is serialized up front
(into a list of byte strings) and only then is anything sent. The functions here take the
worker's (already stripped) object, never a simulated ``Answer``.

* Chat Completions: a role delta, then reasoning, content, refusal and one tool-call delta per
  choice, a finish chunk per choice, a usage chunk when ``include_usage`` was asked, ``[DONE]``.
* Responses: ``response.created`` (empty output, ``in_progress``), one
  ``response.output_item.done`` per output item, then ``response.completed`` (or
  ``response.incomplete``), each with a running ``sequence_number``.
* Messages: ``message_start`` (the message with empty ``content``), per content block a
  ``content_block_start`` / one delta / ``content_block_stop``, then ``message_delta``
  (``stop_reason``, ``stop_sequence``, ``usage.output_tokens``) and ``message_stop``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from capture_core.sse import format_event

__all__ = ["chat_events", "messages_events", "responses_events", "responses_failure_events"]

_CHUNK_HEAD = ("id", "created", "model", "system_fingerprint", "service_tier")


def chat_events(completion: Mapping[str, Any], *, include_usage: bool) -> list[bytes]:
    """The Chat Completions SSE chunks of a complete ``chat.completion`` object.

    Raises:
        KeyError, TypeError, ValueError: the object is not a chat completion.

    Example:
        >>> events = chat_events({"id": "c1", "created": 1, "model": "m", "choices": [
        ...     {"index": 0, "message": {"role": "assistant", "content": "hi"},
        ...      "finish_reason": "stop"}]}, include_usage=False)
        >>> events[-1]
        b'data: [DONE]\\n\\n'
    """
    head: dict[str, Any] = {"object": "chat.completion.chunk"}
    for key in _CHUNK_HEAD:
        if completion.get(key) is not None:
            head[key] = completion[key]
    if "id" not in head:
        raise ValueError("the completion has no id")
    choices = completion["choices"]
    if not isinstance(choices, list):
        raise TypeError("choices must be a list")

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return format_event({**head, "choices": [choice]})

    events: list[bytes] = []
    for position, choice in enumerate(choices):
        index = choice.get("index", position)
        message = choice["message"]
        events.append(chunk(index, {"role": message.get("role") or "assistant", "content": ""}))
        for key in ("reasoning_content", "reasoning"):
            if message.get(key):
                events.append(chunk(index, {key: message[key]}))
        if message.get("content"):
            events.append(chunk(index, {"content": message["content"]}))
        if message.get("refusal"):
            events.append(chunk(index, {"refusal": message["refusal"]}))
        calls = message.get("tool_calls") or []
        if calls:
            deltas = [
                {
                    "index": n,
                    "id": call["id"],
                    "type": call.get("type", "function"),
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": call["function"].get("arguments", ""),
                    },
                }
                for n, call in enumerate(calls)
            ]
            events.append(chunk(index, {"tool_calls": deltas}))
        events.append(chunk(index, {}, choice.get("finish_reason") or "stop"))
    usage = completion.get("usage")
    if include_usage and usage is not None:
        events.append(format_event({**head, "choices": [], "usage": usage}))
    events.append(format_event("[DONE]"))
    return events


class _Sequence:
    def __init__(self) -> None:
        self.events: list[bytes] = []

    def emit(self, kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": len(self.events), **fields}
        self.events.append(format_event(payload, event=kind))


def responses_events(response: Mapping[str, Any]) -> list[bytes]:
    """The Responses SSE events of a complete ``response`` object.

    Raises:
        KeyError, TypeError, ValueError: the object is not a response.

    Example:
        >>> events = responses_events({"id": "r1", "object": "response", "status": "completed",
        ...                            "output": []})
        >>> [e.split(b"\\n")[0] for e in events]
        [b'event: response.created', b'event: response.completed']
    """
    if not response.get("id"):
        raise ValueError("the response has no id")
    output = response["output"]
    if not isinstance(output, list):
        raise TypeError("output must be a list")
    final = dict(response)
    out = _Sequence()
    out.emit("response.created", response={**final, "status": "in_progress", "output": []})
    for index, item in enumerate(output):
        out.emit("response.output_item.done", output_index=index, item=item)
    incomplete = final.get("status") == "incomplete"
    out.emit("response.incomplete" if incomplete else "response.completed", response=final)
    return out.events


def responses_failure_events(message: str, *, model: str | None = None) -> list[bytes]:
    """``response.created`` then ``response.failed``: how a failed buffered stream ends.

    Example:
        >>> [e.split(b"\\n")[0] for e in responses_failure_events("boom")]
        [b'event: response.created', b'event: response.failed']
    """
    shell: dict[str, Any] = {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "status": "in_progress",
        "output": [],
    }
    if model is not None:
        shell["model"] = model
    failed = {**shell, "status": "failed", "error": {"code": "server_error", "message": message}}
    out = _Sequence()
    out.emit("response.created", response=shell)
    out.emit("response.failed", response=failed)
    return out.events


def messages_events(message: Mapping[str, Any]) -> list[bytes]:
    """The Anthropic Messages SSE events of a complete ``message`` object.

    Every event has an ``event:`` line naming its ``type``. Each content block is sent as an
    empty shell, one delta holding its whole content (a ``signature_delta`` follows a signed
    thinking block) and a stop.

    Raises:
        KeyError, TypeError, ValueError: the object is not a message.

    Example:
        >>> events = messages_events({"id": "msg_1", "type": "message", "role": "assistant",
        ...     "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
        ...     "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}})
        >>> [e.split(b"\\n")[0].decode() for e in events]  # doctest: +NORMALIZE_WHITESPACE
        ['event: message_start', 'event: content_block_start', 'event: content_block_delta',
         'event: content_block_stop', 'event: message_delta', 'event: message_stop']
    """
    if not message.get("id"):
        raise ValueError("the message has no id")
    content = message["content"]
    if not isinstance(content, list):
        raise TypeError("content must be a list")
    events: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append(format_event({"type": kind, **fields}, event=kind))

    usage = message.get("usage")
    usage = dict(usage) if isinstance(usage, Mapping) else {}
    shell = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    emit("message_start", message={**shell, "usage": {**usage, "output_tokens": 0}})
    for index, block in enumerate(content):
        kind = block["type"]
        if kind == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}]
            if block.get("signature"):
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            partial = orjson.dumps(block.get("input") or {}).decode()
            deltas = [{"type": "input_json_delta", "partial_json": partial}]
        else:  # redacted thinking and other blocks travel whole in their start event
            start, deltas = dict(block), []
        emit("content_block_start", index=index, content_block=start)
        for delta in deltas:
            emit("content_block_delta", index=index, delta=delta)
        emit("content_block_stop", index=index)
    emit(
        "message_delta",
        delta={"stop_reason": message.get("stop_reason"),
               "stop_sequence": message.get("stop_sequence")},
        usage={"output_tokens": usage.get("output_tokens", 0)},
    )  # fmt: skip
    emit("message_stop")
    return events
