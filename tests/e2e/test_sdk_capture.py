"""The official SDKs through the capture server: one line per call, nothing changed for them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from capture_core import ModelCallRecord
from capture_core.testing import request_body
from tests.e2e.conftest import Stack

TOOLS_CHAT = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]
TOOLS_RESPONSES = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look up.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
]
TOOLS_MESSAGES = [
    {
        "name": "lookup",
        "description": "Look up.",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
]
PROMPT = "Which option is correct? (A) 1 (B) 2"  # fmt: skip


def openai_client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0, timeout=30)


def anthropic_client(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="sk-test", max_retries=0, timeout=30)


def responses_plain(base: str) -> Any:
    with openai_client(base) as client:
        return client.responses.create(model="sim-model-1", input=PROMPT)


def responses_streamed(base: str) -> Any:
    with openai_client(base) as client:
        return _events(client)


def _events(client: openai.OpenAI) -> Any:
    events = client.responses.create(model="sim-model-1", input=PROMPT, stream=True,
                                                  reasoning={"effort": "low"})  # fmt: skip
    return [event.model_dump() for event in events]


def responses_helper(base: str) -> Any:
    with openai_client(base) as client, client.responses.stream(model="sim-model-1", input=PROMPT,
                                              tools=TOOLS_RESPONSES) as stream:  # fmt: skip
        return stream.get_final_response()


def chat_tools(base: str) -> Any:
    with openai_client(base) as client:
        return _chat_tools(client)


def _chat_tools(client: openai.OpenAI) -> Any:
    return client.chat.completions.create(
        model="sim-model-1", messages=[{"role": "user", "content": PROMPT}], tools=TOOLS_CHAT
    )


def chat_streamed(base: str) -> Any:
    with openai_client(base) as client:
        return _chat_streamed(client)


def _chat_streamed(client: openai.OpenAI) -> Any:
    chunks = client.chat.completions.create(
        model="sim-model-1", messages=[{"role": "user", "content": PROMPT}], tools=TOOLS_CHAT,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    return [chunk.model_dump() for chunk in chunks]


def messages_tools(base: str) -> Any:
    with anthropic_client(base) as client:
        return _messages_tools(client)


def _messages_tools(client: anthropic.Anthropic) -> Any:
    return client.messages.create(
        model="sim-model-1", max_tokens=512, tools=TOOLS_MESSAGES,
        messages=[{"role": "user", "content": PROMPT}],
    )  # fmt: skip


def messages_stream_thinking(base: str) -> Any:
    with anthropic_client(base) as client, client.messages.stream(
        model="sim-model-1", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": PROMPT}],
    ) as stream:  # fmt: skip
        return stream.get_final_message()


CASES: dict[str, tuple[Callable[[str], Any], str, bool, bool]] = {
    # name: (call, dialect, streamed, anthropic base url without /v1)
    "responses": (responses_plain, "responses", False, False),
    "responses-stream": (responses_streamed, "responses", True, False),
    "responses-stream-helper": (responses_helper, "responses", True, False),
    "chat-tools": (chat_tools, "chat", False, False),
    "chat-stream-tools": (chat_streamed, "chat", True, False),
    "messages-tools": (messages_tools, "messages", False, True),
    "messages-stream-thinking": (messages_stream_thinking, "messages", True, True),
}


def comparable(result: Any) -> Any:
    return result.model_dump() if hasattr(result, "model_dump") else result


@pytest.mark.parametrize("case", list(CASES))
def test_each_sdk_call_gives_one_line_and_an_unchanged_answer(
    stack: Stack, rollout_id: str, case: str
) -> None:
    call, dialect, streamed, anthropic_style = CASES[case]
    path = stack.store.path_for(rollout_id)
    captured = call(stack.base(rollout_id, v1=not anthropic_style))
    uncaptured = call(stack.base(rollout_id, capture=False, v1=not anthropic_style))
    assert comparable(captured) == comparable(uncaptured)
    result = stack.store.read_records(rollout_id)
    assert result.damaged == []
    (record,) = result.records
    assert path.read_bytes().count(b"\n") == 1
    check_record(record, dialect, streamed)
    if case == "responses-stream-helper":
        assert [c.name for c in record.tool_calls] == ["lookup"]
        assert [o.type for o in captured.output] == ["function_call"]
        assert captured.output[0].call_id == record.tool_calls[0].call_id
    if case in ("chat-tools", "messages-tools"):
        assert [c.name for c in record.tool_calls] == ["lookup"]
    if case == "messages-stream-thinking":
        assert captured.content[0].type == "thinking"
        assert record.reasoning_content == captured.content[0].thinking
        assert record.tokens_reasoning is None  # Anthropic usage does not report it
        assert record.tokens_out == captured.usage.output_tokens
    if case == "responses-stream":
        assert record.reasoning_content
        assert record.tokens_reasoning is not None and record.tokens_reasoning > 0


def check_record(record: ModelCallRecord, dialect: str, streamed: bool) -> None:
    assert record.dialect == dialect
    assert record.stream is streamed
    assert record.status_code == 200
    assert record.error_category is None
    assert record.model_ref is not None and record.model_ref.name == "policy_model"
    assert record.tokens_in and record.tokens_out and record.tokens_total
    assert record.tokens_total == record.tokens_in + record.tokens_out
    assert record.latency_ttft_ms is not None and record.latency_total_ms is not None
    assert 0 < record.latency_ttft_ms <= record.latency_total_ms
    assert record.started_at is not None and record.completed_at is not None
    assert record.started_at <= record.completed_at
    assert (record.response_raw is not None) is streamed


@pytest.mark.parametrize("dialect", ["responses", "chat", "messages"])
@pytest.mark.parametrize("stream", [False, True])
def test_raw_bytes_are_identical_with_capture_on_and_off(
    stack: Stack, rollout_id: str, dialect: str, stream: bool
) -> None:
    path = {"responses": "/responses", "chat": "/chat/completions", "messages": "/messages"}
    body = orjson.dumps(request_body(dialect, stream=stream, tools=True))
    got = []
    for capture in (True, False):
        response = httpx.post(stack.base(rollout_id, capture=capture) + path[dialect],
                              content=body, headers={"content-type": "application/json"},
                              timeout=30)  # fmt: skip
        headers = {k: v for k, v in response.headers.items() if k not in ("date", "server")}
        got.append((response.status_code, headers, response.content))
    assert got[0] == got[1]
    assert len(stack.store.read_records(rollout_id).records) == 1
