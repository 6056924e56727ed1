"""Deterministic model answers, and their bodies in each dialect, non-streaming and streamed.

An :class:`Answer` describes what a model said (text, reasoning, tool calls) and what it cost
(usage). The builders render the same answer as each API would send it, so a test can check
that a streamed and a non-streamed call of one answer capture the same facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

__all__ = ["DEFAULT_MODEL", "Answer", "ToolCallSpec", "error_body", "pieces", "request_body"]

DEFAULT_MODEL: Final = "sim-model-1"


@dataclass(frozen=True, slots=True)
class ToolCallSpec:
    """A tool call in an answer. ``arguments`` as a str is sent verbatim (may be invalid JSON)."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    call_id: str = "call_0"

    @property
    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return orjson.dumps(dict(self.arguments)).decode()


@dataclass(frozen=True, slots=True)
class Answer:
    """What the model answered and the usage it reported.

    ``input_tokens`` is the whole prompt, cached part included (OpenAI's convention); the
    Anthropic builders split it into uncached, cache-read and cache-creation counts.
    ``truncated_by_length`` makes the answer stop on the output-token limit.
    """

    text: str = "The answer is (B)."
    reasoning: str | None = None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    model: str = DEFAULT_MODEL
    response_id: str = "resp_123"
    input_tokens: int = 94
    output_tokens: int = 28
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None
    report_usage: bool = True
    truncated_by_length: bool = False
    created: int = 1786032154

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def pieces(text: str, size: int = 7) -> list[str]:
    """Split text into the deltas a server would stream (deterministic)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def request_body(
    dialect: str,
    *,
    prompt: str = "Which option is correct?",
    model: str = DEFAULT_MODEL,
    stream: bool = False,
    tools: bool = False,
) -> dict[str, Any]:
    """A realistic request body of the dialect."""
    tool = {"name": "lookup", "description": "Look a fact up.", "schema": {"type": "object"}}
    body: dict[str, Any]
    if dialect == "responses":
        body = {"model": model, "input": [{"role": "user", "content": prompt}]}
        if tools:
            body["tools"] = [
                {"type": "function", "name": tool["name"], "parameters": tool["schema"]}
            ]
    elif dialect == "chat":
        body = {"model": model, "messages": [{"role": "user", "content": prompt}]}
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": tool["name"], "parameters": tool["schema"]},
                }
            ]
        if stream:
            body["stream_options"] = {"include_usage": True}
    elif dialect == "messages":
        body = {
            "model": model,
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": prompt}],
        }
        if tools:
            body["tools"] = [{"name": tool["name"], "input_schema": tool["schema"]}]
    else:
        raise ValueError(f"unknown dialect {dialect!r}")
    if stream:
        body["stream"] = True
    return body


def error_body(dialect: str, status: int, message: str = "simulated failure") -> dict[str, Any]:
    """The error body each API sends with an HTTP error status."""
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }
    kind = kinds.get(status, "api_error" if status >= 500 else "invalid_request_error")
    if dialect == "messages":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}
