"""Non-streaming response bodies of an :class:`~capture_core.testing.answers.Answer`."""

from __future__ import annotations

from typing import Any

from capture_core.testing.answers import Answer

__all__ = [
    "chat_body",
    "chat_usage",
    "messages_body",
    "messages_usage",
    "response_body",
    "responses_body",
    "responses_output",
    "responses_usage",
]


def responses_usage(answer: Answer) -> dict[str, Any] | None:
    if not answer.report_usage:
        return None
    input_details: dict[str, Any] = {"cached_tokens": answer.cached_tokens or 0}
    if answer.cache_creation_tokens is not None:
        input_details["cache_write_tokens"] = answer.cache_creation_tokens
    return {
        "input_tokens": answer.input_tokens,
        "input_tokens_details": input_details,
        "output_tokens": answer.output_tokens,
        "output_tokens_details": {"reasoning_tokens": answer.reasoning_tokens or 0},
        "total_tokens": answer.total_tokens,
    }


def responses_output(answer: Answer) -> list[dict[str, Any]]:
    """The ``output`` items: reasoning, then the message, then function calls."""
    rid = answer.response_id
    items: list[dict[str, Any]] = []
    if answer.reasoning is not None:
        items.append(
            {
                "id": f"rs_{rid}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": answer.reasoning}],
            }
        )
    if answer.text:
        items.append(
            {
                "id": f"msg_{rid}",
                "type": "message",
                "status": "incomplete" if answer.truncated_by_length else "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": answer.text, "annotations": []}],
            }
        )
    for call in answer.tool_calls:
        items.append(
            {
                "id": f"fc_{call.call_id}",
                "type": "function_call",
                "status": "completed",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments_json,
            }
        )
    return items


def responses_body(answer: Answer) -> dict[str, Any]:
    """A Responses API ``Response`` object."""
    return {
        "id": answer.response_id,
        "object": "response",
        "created_at": answer.created,
        "status": "incomplete" if answer.truncated_by_length else "completed",
        "incomplete_details": (
            {"reason": "max_output_tokens"} if answer.truncated_by_length else None
        ),
        "error": None,
        "model": answer.model,
        "output": responses_output(answer),
        "usage": responses_usage(answer),
    }


def chat_finish(answer: Answer) -> str:
    if answer.truncated_by_length:
        return "length"
    return "tool_calls" if answer.tool_calls else "stop"


def chat_usage(answer: Answer) -> dict[str, Any] | None:
    if not answer.report_usage:
        return None
    return {
        "prompt_tokens": answer.input_tokens,
        "completion_tokens": answer.output_tokens,
        "total_tokens": answer.total_tokens,
        "prompt_tokens_details": {"cached_tokens": answer.cached_tokens or 0},
        "completion_tokens_details": {"reasoning_tokens": answer.reasoning_tokens or 0},
    }


def chat_body(answer: Answer) -> dict[str, Any]:
    """A Chat Completions ``chat.completion`` object (vLLM-style ``reasoning_content``)."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
    if answer.reasoning is not None:
        message["reasoning_content"] = answer.reasoning
    if answer.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json},
            }
            for call in answer.tool_calls
        ]
    return {
        "id": answer.response_id,
        "object": "chat.completion",
        "created": answer.created,
        "model": answer.model,
        "choices": [{"index": 0, "message": message, "finish_reason": chat_finish(answer)}],
        "usage": chat_usage(answer),
    }


def messages_stop_reason(answer: Answer) -> str:
    if answer.truncated_by_length:
        return "max_tokens"
    return "tool_use" if answer.tool_calls else "end_turn"


def messages_usage(answer: Answer, *, report_thinking_tokens: bool = False) -> dict[str, Any]:
    """Anthropic usage: ``input_tokens`` is the uncached remainder of the prompt."""
    if not answer.report_usage:
        return {}
    read = answer.cached_tokens or 0
    created = answer.cache_creation_tokens or 0
    usage: dict[str, Any] = {
        "input_tokens": answer.input_tokens - read - created,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": read,
        "output_tokens": answer.output_tokens,
    }
    if report_thinking_tokens and answer.reasoning_tokens is not None:
        usage["output_tokens_details"] = {"thinking_tokens": answer.reasoning_tokens}
    return usage


def messages_content(answer: Answer) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if answer.reasoning is not None:
        blocks.append(
            {"type": "thinking", "thinking": answer.reasoning, "signature": "sig-" + "a" * 16}
        )
    if answer.text:
        blocks.append({"type": "text", "text": answer.text})
    for call in answer.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": call.call_id,
                "name": call.name,
                "input": dict(call.arguments) if not isinstance(call.arguments, str) else {},
            }
        )
    return blocks


def messages_body(answer: Answer, *, report_thinking_tokens: bool = False) -> dict[str, Any]:
    """An Anthropic ``Message`` object."""
    body: dict[str, Any] = {
        "id": answer.response_id,
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": messages_content(answer),
        "stop_reason": messages_stop_reason(answer),
        "stop_sequence": None,
    }
    usage = messages_usage(answer, report_thinking_tokens=report_thinking_tokens)
    if usage:
        body["usage"] = usage
    return body


def response_body(dialect: str, answer: Answer) -> dict[str, Any]:
    """The non-streaming body of ``answer`` in ``dialect``."""
    builders = {"responses": responses_body, "chat": chat_body, "messages": messages_body}
    try:
        return builders[dialect](answer)
    except KeyError:
        raise ValueError(f"unknown dialect {dialect!r}") from None
