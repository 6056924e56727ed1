"""Buffered SSE serializers and the token-field stripping of training capture."""

from __future__ import annotations

from typing import Any

import orjson

from capture_core.server.buffered_sse import (
    chat_events,
    messages_events,
    responses_events,
    responses_failure_events,
)
from capture_core.server.training import strip_token_fields
from capture_core.sse import parse_sse


def chat_completion() -> dict[str, Any]:
    return {
        "id": "completion-1",
        "object": "chat.completion",
        "created": 7,
        "model": "m",
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "index": 0,
                "token_ids": [3],
                "logprobs": {"content": [{"token": "token_id:3", "logprob": -0.1}]},
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "thinking aloud",
                    "reasoning_content": "hmm",
                    "generation_token_ids": [3],
                    "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "f", "arguments": "{\"x\":1}"}},
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }  # fmt: skip


def test_strip_removes_every_token_field() -> None:
    body = chat_completion()
    strip_token_fields(body, keep_logprobs=False)
    raw = orjson.dumps(body)
    for needle in (b"prompt_token_ids", b"token_ids", b"generation_token_ids", b"token_id:"):
        assert needle not in raw
    assert body["choices"][0]["logprobs"] is None


def test_chat_events_order_and_usage() -> None:
    body = chat_completion()
    strip_token_fields(body, keep_logprobs=False)
    events = parse_sse(b"".join(chat_events(body, include_usage=True)))
    assert events[-1].data == "[DONE]"
    chunks = [orjson.loads(e.data) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert deltas[1] == {"reasoning_content": "hmm"}
    assert deltas[2] == {"content": "thinking aloud"}
    assert deltas[3]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x":1}'}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 3
    assert {c["id"] for c in chunks} == {"completion-1"}
    without_usage = chat_events(body, include_usage=False)
    assert len(without_usage) == len(events) - 1


def test_responses_events_and_failure() -> None:
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "B", "annotations": []}]}  # fmt: skip
    response = {"id": "resp_1", "object": "response", "status": "completed", "output": [item]}
    events = parse_sse(b"".join(responses_events(response)))
    kinds = [e.event for e in events]
    assert kinds == ["response.created", "response.output_item.done", "response.completed"]
    payloads = [orjson.loads(e.data) for e in events]
    assert [p["sequence_number"] for p in payloads] == [0, 1, 2]
    assert payloads[0]["response"]["output"] == []
    assert payloads[1]["item"] == item
    failed = parse_sse(b"".join(responses_failure_events("boom")))
    assert [e.event for e in failed] == ["response.created", "response.failed"]
    error = orjson.loads(failed[1].data)["response"]
    assert error["status"] == "failed" and error["error"]["message"] == "boom"


def anthropic_message() -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig-1"},
            {"type": "text", "text": "calling"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 9},
    }


def test_messages_events_order_and_content() -> None:
    events = parse_sse(b"".join(messages_events(anthropic_message())))
    payloads = [orjson.loads(e.data) for e in events]
    assert [e.event for e in events] == [p["type"] for p in payloads]
    assert [(p["type"], p.get("index"), p.get("delta", {}).get("type")) for p in payloads] == [
        ("message_start", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, None),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    start = payloads[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": 5, "output_tokens": 0}
    assert payloads[8]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "f",
                                            "input": {}}  # fmt: skip
    assert orjson.loads(payloads[9]["delta"]["partial_json"]) == {"x": 1}
    assert payloads[11]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert payloads[11]["usage"] == {"output_tokens": 9}


def test_messages_events_rebuild_the_message_with_the_anthropic_sdk() -> None:
    import anthropic
    import httpx2

    body = b"".join(messages_events(anthropic_message()))

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    client = anthropic.Anthropic(base_url="http://sim", api_key="x", http_client=http)
    with (
        client,
        client.messages.stream(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        message = stream.get_final_message()
    assert message.model_dump(exclude_none=True)["content"] == anthropic_message()["content"]
    assert message.stop_reason == "tool_use"
    assert message.usage.output_tokens == 9


def test_messages_token_fields_are_stripped() -> None:
    message = {**anthropic_message(), "prompt_token_ids": [1], "generation_token_ids": [2],
               "generation_log_probs": [-0.1], "routed_experts": [[[0]]]}  # fmt: skip
    message["content"] = [{**b, "generation_token_ids": [2]} for b in message["content"]]
    strip_token_fields(message, keep_logprobs=False)
    assert message == anthropic_message()
