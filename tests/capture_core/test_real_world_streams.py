"""Stream and usage shapes real servers send that our own builders do not produce."""

from __future__ import annotations

from typing import Any

import orjson

from capture_core import (
    classify_response,
    extract_response,
    format_event,
    reassemble_stream,
    token_stats,
)


def ev(obj: dict[str, Any], event: str | None = None) -> bytes:
    return format_event(obj, event=event)


def typed(kind: str, **fields: Any) -> bytes:
    return format_event({"type": kind, **fields}, event=kind)


HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
SHELL = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "gpt-x",
         "output": [], "usage": None}  # fmt: skip
START = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "c",
         "stop_reason": None, "stop_sequence": None,
         "usage": {"input_tokens": 10, "cache_creation_input_tokens": 2,
                   "cache_read_input_tokens": 5, "output_tokens": 1}}  # fmt: skip


def test_vllm_usage_chunk_with_null_or_missing_choices() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    body = b"".join([
        ev({**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        ev({**HEAD, "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}),
        ev({**HEAD, "choices": None, "usage": usage}),
        b"data: [DONE]\n\n",
    ])  # fmt: skip
    rebuilt = reassemble_stream("chat", body)
    assert rebuilt.terminal == "complete"
    facts = extract_response("chat", rebuilt.response)
    assert (facts.tokens.tokens_in, facts.tokens.tokens_out, facts.tokens.tokens_total) == (5, 1, 6)
    assert rebuilt.response is not None
    assert rebuilt.response["choices"][0]["message"]["content"] == "hi"


def test_chat_interleaved_tool_calls() -> None:
    def tools(*calls: dict[str, Any]) -> bytes:
        return ev({**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": list(calls)}}]})

    body = b"".join([
        tools({"index": 0, "id": "call_a", "type": "function",
               "function": {"name": "f", "arguments": ""}}),
        tools({"index": 1, "id": "call_b", "type": "function",
               "function": {"name": "g", "arguments": ""}}),
        tools({"index": 0, "function": {"arguments": '{"a":'}},
              {"index": 1, "function": {"arguments": '{"b":'}}),
        tools({"index": 1, "function": {"arguments": "2}"}},
              {"index": 0, "function": {"arguments": "1}"}}),
        b"data: [DONE]\n\n",
    ])  # fmt: skip
    facts = extract_response("chat", reassemble_stream("chat", body).response)
    assert [(c.call_id, c.name, c.arguments) for c in facts.tool_calls] == [
        ("call_a", "f", {"a": 1}),
        ("call_b", "g", {"b": 2}),
    ]


def test_chat_tool_fragments_without_index() -> None:
    def tools(call: dict[str, Any]) -> bytes:
        return ev({**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})

    body = b"".join([
        tools({"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"a":'}}),
        tools({"function": {"arguments": "1}"}}),
        tools({"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}),
        tools({"id": "call_a", "function": {"arguments": ""}}),
        b"data: [DONE]\n\n",
    ])  # fmt: skip
    facts = extract_response("chat", reassemble_stream("chat", body).response)
    assert [(c.call_id, c.name, c.arguments) for c in facts.tool_calls] == [
        ("call_a", "f", {"a": 1}),
        ("call_b", "g", {}),
    ]


def test_responses_refusal_in_a_truncated_stream() -> None:
    item = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    body = b"".join([
        typed("response.created", response=SHELL),
        typed("response.output_item.added", output_index=0, item=item),
        typed("response.content_part.added", item_id="msg_1", output_index=0, content_index=0,
              part={"type": "refusal", "refusal": ""}),
        typed("response.refusal.delta", item_id="msg_1", output_index=0, content_index=0,
              delta="I can't "),
        typed("response.refusal.delta", item_id="msg_1", output_index=0, content_index=0,
              delta="help."),
    ])  # fmt: skip
    rebuilt = reassemble_stream("responses", body)
    assert rebuilt.terminal is None
    assert rebuilt.response is not None
    (message,) = rebuilt.response["output"]
    assert message["content"] == [{"type": "refusal", "refusal": "I can't help."}]


def test_responses_failed_after_partial_output() -> None:
    failed = {**SHELL, "status": "failed", "output": [],
              "error": {"code": "server_error", "message": "boom"}}  # fmt: skip
    body = b"".join([
        typed("response.created", response=SHELL),
        typed("response.output_item.added", output_index=0,
              item={"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f",
                    "arguments": ""}),
        typed("response.function_call_arguments.delta", item_id="fc_1", output_index=0,
              delta='{"x":'),
        typed("response.failed", response=failed),
    ])  # fmt: skip
    rebuilt = reassemble_stream("responses", body)
    assert rebuilt.terminal == "error"
    assert rebuilt.response is not None
    facts = extract_response("responses", rebuilt.response)
    assert (facts.response_status, facts.error_code, facts.error_message) == (
        "failed", "server_error", "boom",
    )  # fmt: skip
    (call,) = facts.tool_calls  # the partial call is kept, its arguments flagged
    assert call.arguments_parse_error and call.arguments_raw == '{"x":'
    assert classify_response("responses", rebuilt.response) == "upstream_error"


def test_responses_error_event_keeps_the_partial_reasoning() -> None:
    body = b"".join([
        typed("response.created", response=SHELL),
        typed("response.output_item.added", output_index=0,
              item={"id": "rs_1", "type": "reasoning", "summary": []}),
        typed("response.reasoning_summary_text.delta", item_id="rs_1", output_index=0,
              summary_index=0, delta="thinking..."),
        typed("error", code="server_error", message="The server had an error", param=None),
    ])  # fmt: skip
    rebuilt = reassemble_stream("responses", body)
    assert rebuilt.terminal == "error"
    facts = extract_response("responses", rebuilt.response)
    assert facts.reasoning == "thinking..."
    assert facts.error_code == "server_error"


def test_anthropic_error_after_partial_content() -> None:
    body = b"".join([
        typed("message_start", message=START), typed("ping"),
        typed("content_block_start", index=0,
              content_block={"type": "thinking", "thinking": "", "signature": ""}),
        typed("content_block_delta", index=0,
              delta={"type": "thinking_delta", "thinking": "Let me think"}),
        typed("content_block_delta", index=0,
              delta={"type": "signature_delta", "signature": "EqQBCgIYAhIM"}),
        typed("content_block_stop", index=0),
        typed("content_block_start", index=1, content_block={"type": "text", "text": ""}),
        typed("content_block_delta", index=1, delta={"type": "text_delta", "text": "Half an"}),
        typed("error", error={"type": "overloaded_error", "message": "Overloaded"}),
    ])  # fmt: skip
    rebuilt = reassemble_stream("messages", body)
    assert rebuilt.terminal == "error"
    assert rebuilt.response is not None
    assert rebuilt.response["content"][0]["signature"] == "EqQBCgIYAhIM"
    facts = extract_response("messages", rebuilt.response)
    assert facts.reasoning == "Let me think"
    assert (facts.error_code, facts.error_message) == ("overloaded_error", "Overloaded")
    assert facts.tokens.tokens_in == 17
    assert facts.tokens.tokens_out is None  # message_start's output_tokens is a placeholder


def test_anthropic_message_delta_with_null_usage_fields() -> None:
    body = b"".join([
        typed("message_start", message=START),
        typed("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        typed("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"}),
        typed("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None},
              usage={"input_tokens": None, "cache_creation_input_tokens": None,
                     "cache_read_input_tokens": None, "output_tokens": 7}),
        typed("message_stop"),
    ])  # fmt: skip
    streamed = extract_response("messages", reassemble_stream("messages", body).response).tokens
    plain = extract_response("messages", {
        "id": "msg_1", "type": "message", "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 10, "cache_creation_input_tokens": 2,
                                             "cache_read_input_tokens": 5, "output_tokens": 7},
    }).tokens  # fmt: skip
    assert streamed == plain
    assert (plain.tokens_in, plain.tokens_out, plain.cached_tokens) == (17, 7, 5)


def test_gateway_chat_usage_with_anthropic_cache_keys_is_not_double_counted() -> None:
    usage = {"prompt_tokens": 1200, "completion_tokens": 50, "total_tokens": 1250,
             "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 0,
             "prompt_tokens_details": {"cached_tokens": 1000}}  # fmt: skip
    stats = token_stats(usage, "chat")
    assert (stats.tokens_in, stats.tokens_total, stats.cached_tokens) == (1200, 1250, 1000)


def test_a_character_split_into_lone_surrogates_loses_nothing_else() -> None:
    body = (
        b'data: {"choices":[{"index":0,"delta":{"content":"ok \\ud83d"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"\\ude00 done"}}]}\n\n'
        b"data: [DONE]\n\n"
    )
    rebuilt = reassemble_stream("chat", body)
    assert rebuilt.skipped == 0
    assert rebuilt.response is not None
    assert rebuilt.response["choices"][0]["message"]["content"] == "ok \ufffd\ufffd done"


def test_unparseable_events_are_counted() -> None:
    body = b'data: {"choices": [}\n\ndata: not json\n\ndata: [DONE]\n\n'
    assert reassemble_stream("chat", body).skipped == 2


def test_limits_and_errors_in_the_final_object() -> None:
    assert classify_response("chat", {"choices": [{"finish_reason": "length"}]}) == "incomplete"
    assert classify_response("chat", {"choices": [{"finish_reason": "stop"}]}) is None
    assert classify_response("messages", {"type": "message", "stop_reason": "max_tokens"}) == (
        "incomplete"
    )
    assert classify_response("responses", {"status": "incomplete"}) == "incomplete"
    assert classify_response("responses", {"status": "completed", "error": None}) is None
    assert classify_response("chat", {"error": {"message": "x"}}) == "upstream_error"
    assert orjson.dumps(classify_response("responses", {"status": "failed"}))
