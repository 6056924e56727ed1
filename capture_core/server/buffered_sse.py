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
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from capture_core.sse import format_event

__all__ = ["chat_events", "responses_events", "responses_failure_events"]

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
