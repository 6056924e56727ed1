"""Streamed (SSE) bodies of an :class:`~capture_core.testing.answers.Answer`, per dialect.

Event sequences follow what the real APIs send: Responses with ``event:`` lines, deltas and a
``response.completed`` envelope; Chat Completions as data-only chunks, a usage chunk and
``[DONE]``; Anthropic Messages from ``message_start`` to ``message_stop`` with ``ping``s.
``terminal=False`` drops the terminal event, as a stream cut short would.
"""

from __future__ import annotations

from typing import Any

from capture_core.sse import format_event
from capture_core.testing.answers import Answer, pieces
from capture_core.testing.bodies import (
    chat_finish,
    chat_usage,
    messages_content,
    messages_stop_reason,
    messages_usage,
    responses_body,
    responses_output,
)

__all__ = ["chat_stream", "messages_stream", "response_stream", "responses_stream"]


class _Responses:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.seq = 0

    def emit(self, kind: str, **fields: Any) -> None:
        self.chunks.append(
            format_event({"type": kind, "sequence_number": self.seq, **fields}, event=kind)
        )
        self.seq += 1

    def item(self, index: int, item: dict[str, Any]) -> None:
        kind = item["type"]
        shell = {**item, "status": "in_progress"}
        if kind == "message":
            shell["content"] = []
        elif kind == "reasoning":
            shell["summary"] = []
        elif kind == "function_call":
            shell["arguments"] = ""
        self.emit("response.output_item.added", output_index=index, item=shell)
        ids = {"item_id": item["id"], "output_index": index}
        if kind == "message":
            for c, part in enumerate(item["content"]):
                empty = {**part, "text": ""}
                self.emit("response.content_part.added", **ids, content_index=c, part=empty)
                for delta in pieces(part["text"]):
                    self.emit("response.output_text.delta", **ids, content_index=c, delta=delta)
                self.emit("response.output_text.done", **ids, content_index=c, text=part["text"])
                self.emit("response.content_part.done", **ids, content_index=c, part=part)
        elif kind == "reasoning":
            for s, part in enumerate(item["summary"]):
                empty = {**part, "text": ""}
                self.emit(
                    "response.reasoning_summary_part.added", **ids, summary_index=s, part=empty
                )
                for delta in pieces(part["text"]):
                    self.emit(
                        "response.reasoning_summary_text.delta", **ids, summary_index=s, delta=delta
                    )
                self.emit(
                    "response.reasoning_summary_text.done",
                    **ids,
                    summary_index=s,
                    text=part["text"],
                )
                self.emit("response.reasoning_summary_part.done", **ids, summary_index=s, part=part)
        elif kind == "function_call":
            for delta in pieces(item["arguments"]):
                self.emit("response.function_call_arguments.delta", **ids, delta=delta)
            self.emit("response.function_call_arguments.done", **ids, arguments=item["arguments"])
        self.emit("response.output_item.done", output_index=index, item=item)


def responses_stream(answer: Answer, *, terminal: bool = True) -> bytes:
    """The Responses SSE stream of ``answer``."""
    final = responses_body(answer)
    shell = {
        **final,
        "status": "in_progress",
        "incomplete_details": None,
        "output": [],
        "usage": None,
    }
    out = _Responses()
    out.emit("response.created", response=shell)
    out.emit("response.in_progress", response=shell)
    for index, item in enumerate(responses_output(answer)):
        out.item(index, item)
    if terminal:
        kind = "response.incomplete" if answer.truncated_by_length else "response.completed"
        out.emit(kind, response=final)
    return b"".join(out.chunks)


def chat_stream(answer: Answer, *, terminal: bool = True, include_usage: bool = True) -> bytes:
    """The Chat Completions SSE stream of ``answer`` (data-only chunks, then ``[DONE]``)."""
    head = {
        "id": answer.response_id,
        "object": "chat.completion.chunk",
        "created": answer.created,
        "model": answer.model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return format_event({**head, "choices": [choice]})

    chunks = [chunk({"role": "assistant", "content": ""})]
    if answer.reasoning is not None:
        chunks += [chunk({"reasoning_content": p}) for p in pieces(answer.reasoning)]
    if answer.text:
        chunks += [chunk({"content": p}) for p in pieces(answer.text)]
    for index, call in enumerate(answer.tool_calls):
        first = {
            "index": index,
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [first]}))
        chunks += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in pieces(call.arguments_json)
        ]
    chunks.append(chunk({}, chat_finish(answer)))
    usage = chat_usage(answer)
    if include_usage and usage is not None:
        chunks.append(format_event({**head, "choices": [], "usage": usage}))
    if terminal:
        chunks.append(format_event("[DONE]"))
    return b"".join(chunks)


def messages_stream(
    answer: Answer, *, terminal: bool = True, report_thinking_tokens: bool = False
) -> bytes:
    """The Anthropic Messages SSE stream of ``answer``."""
    usage = messages_usage(answer, report_thinking_tokens=report_thinking_tokens)
    start_usage = {k: v for k, v in usage.items() if k != "output_tokens_details"}
    if start_usage:
        start_usage["output_tokens"] = 1  # the API's placeholder; message_delta has the count
    shell: dict[str, Any] = {
        "id": answer.response_id,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": answer.model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }

    def emit(kind: str, **fields: Any) -> bytes:
        return format_event({"type": kind, **fields}, event=kind)

    chunks = [emit("message_start", message=shell), emit("ping")]
    for index, block in enumerate(messages_content(answer)):
        kind = block["type"]
        if kind == "thinking":
            chunks.append(
                emit(
                    "content_block_start",
                    index=index,
                    content_block={"type": "thinking", "thinking": "", "signature": ""},
                )
            )
            chunks += [
                emit(
                    "content_block_delta",
                    index=index,
                    delta={"type": "thinking_delta", "thinking": p},
                )
                for p in pieces(block["thinking"])
            ]
            chunks.append(
                emit(
                    "content_block_delta",
                    index=index,
                    delta={"type": "signature_delta", "signature": block["signature"]},
                )
            )
        elif kind == "text":
            chunks.append(
                emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
            )
            chunks += [
                emit("content_block_delta", index=index, delta={"type": "text_delta", "text": p})
                for p in pieces(block["text"])
            ]
        else:
            call = answer.tool_calls[[c.call_id for c in answer.tool_calls].index(block["id"])]
            chunks.append(
                emit("content_block_start", index=index, content_block={**block, "input": {}})
            )
            chunks += [
                emit(
                    "content_block_delta",
                    index=index,
                    delta={"type": "input_json_delta", "partial_json": p},
                )
                for p in pieces(call.arguments_json)
            ]
        chunks.append(emit("content_block_stop", index=index))
    delta_usage = {"output_tokens": usage["output_tokens"]} if usage else {}
    if "output_tokens_details" in usage:
        delta_usage["output_tokens_details"] = usage["output_tokens_details"]
    chunks.append(
        emit(
            "message_delta",
            delta={"stop_reason": messages_stop_reason(answer), "stop_sequence": None},
            usage=delta_usage,
        )
    )
    if terminal:
        chunks.append(emit("message_stop"))
    return b"".join(chunks)


def response_stream(dialect: str, answer: Answer, *, terminal: bool = True) -> bytes:
    """The SSE stream of ``answer`` in ``dialect``."""
    if dialect == "responses":
        return responses_stream(answer, terminal=terminal)
    if dialect == "chat":
        return chat_stream(answer, terminal=terminal)
    if dialect == "messages":
        return messages_stream(answer, terminal=terminal)
    raise ValueError(f"unknown dialect {dialect!r}")
