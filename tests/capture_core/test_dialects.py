from __future__ import annotations

from typing import Any

import orjson
import pytest

from capture_core import (
    ModelCallRecord,
    TerminalDetector,
    dialect_for_path,
    extract_response,
    normalize_line,
    parse_sse,
    reassemble_stream,
    token_stats,
)
from capture_core.testing import (
    Answer,
    ToolCallSpec,
    capture_line,
    chat_body,
    error_body,
    messages_body,
    messages_stream,
    response_stream,
)

DIALECTS = ("responses", "chat", "messages")
ANSWERS = {
    "plain": Answer(),
    "reasoning": Answer(reasoning="First compare (A) with (B).\nThen pick.", reasoning_tokens=12),
    "tools": Answer(
        text="",
        tool_calls=(
            ToolCallSpec("lookup", {"query": "energy", "k": 3}, "call_a"),
            ToolCallSpec("calc", {"expr": "2+2", "nested": {"x": [1, 2]}}, "call_b"),
        ),
        cached_tokens=40,
        cache_creation_tokens=10,
    ),
    "length": Answer(text="It depends on the fra", truncated_by_length=True),
    "unicode": Answer(text="Réponse: 日本語 🙂", reasoning="ça va"),
    "no_usage": Answer(report_usage=False),
}
FACTS = (
    "response_id", "model", "finish_reason", "tokens_in", "tokens_out", "tokens_reasoning",
    "tokens_total", "cached_tokens", "cache_creation_tokens", "tool_calls", "reasoning_content",
    "error_category", "response_status",
)  # fmt: skip


def record_of(dialect: str, answer: Answer, **kwargs: Any) -> ModelCallRecord:
    line = capture_line(dialect, answer, **kwargs)
    return normalize_line(orjson.loads(line.to_jsonl()), 0)


def facts(record: ModelCallRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in FACTS}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", list(ANSWERS))
def test_streamed_and_non_streamed_bodies_give_identical_records(dialect: str, name: str) -> None:
    answer = ANSWERS[name]
    plain = record_of(dialect, answer)
    streamed = record_of(dialect, answer, stream=True)
    assert facts(streamed) == facts(plain)
    assert streamed.stream is True and plain.stream is False
    assert streamed.response_raw is not None and plain.response_raw is None
    if dialect != "messages" and answer.report_usage:
        assert plain.tokens_total == answer.total_tokens
    assert [c.name for c in plain.tool_calls] == [c.name for c in answer.tool_calls]
    assert [c.arguments for c in plain.tool_calls] == [dict(c.arguments) for c in answer.tool_calls]
    assert plain.reasoning_content == answer.reasoning


def test_expected_facts_per_dialect() -> None:
    answer = ANSWERS["tools"]
    responses, chat, messages = (record_of(d, answer, stream=True) for d in DIALECTS)
    assert (responses.finish_reason, chat.finish_reason, messages.finish_reason) == (
        None,  # a completed Response reports no finish reason; only incomplete_details does
        "tool_calls",
        "tool_use",
    )
    for record in (responses, chat, messages):
        assert (record.tokens_in, record.tokens_out, record.tokens_total) == (94, 28, 122)
        assert record.cached_tokens == 40 and record.cache_hit is True
        assert [c.call_id for c in record.tool_calls] == ["call_a", "call_b"]
        assert not any(c.arguments_parse_error for c in record.tool_calls)
    assert messages.cache_creation_tokens == 10
    assert responses.cache_creation_tokens == 10  # OpenAI's cache_write_tokens
    assert chat.cache_creation_tokens is None  # not reported by this chat body
    length = {d: record_of(d, ANSWERS["length"]).finish_reason for d in DIALECTS}
    assert length == {"responses": "max_output_tokens", "chat": "length", "messages": "max_tokens"}


def test_anthropic_reasoning_tokens_are_null_unless_the_usage_reports_them() -> None:
    answer = ANSWERS["reasoning"]
    assert record_of("messages", answer).tokens_reasoning is None
    assert record_of("messages", answer, stream=True).tokens_reasoning is None
    assert record_of("responses", answer).tokens_reasoning == 12
    body = messages_body(answer, report_thinking_tokens=True)
    assert extract_response("messages", body).tokens.tokens_reasoning == 12
    stream = messages_stream(answer, report_thinking_tokens=True)
    rebuilt = reassemble_stream("messages", stream).response
    assert extract_response("messages", rebuilt).tokens.tokens_reasoning == 12


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # (in, out, reasoning, total, cached, cache_creation)
        ({"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 200,
          "cache_creation_input_tokens": 30}, (330, 50, None, 380, 200, 30)),
        ({"output_tokens": 12, "cache_read_input_tokens": 500, "cache_creation_input_tokens": 0},
         (500, 12, None, 512, 500, 0)),
        ({"output_tokens": 12, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
         (None, 12, None, None, 0, 0)),
        ({"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details":
          {"cached_tokens": 4}}, (10, 5, None, 15, 4, None)),
        ({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 16,
          "completion_tokens_details": {"reasoning_tokens": 3}}, (10, 5, 3, 16, None, None)),
        ({"input_tokens": 10, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 9},
          "prompt_tokens_details": {"cached_tokens": 4}}, (10, 5, None, 15, 4, None)),
        ({"input_tokens": 7, "reasoning_output_tokens": 2, "cached_input_tokens": 1},
         (7, None, 2, None, 1, None)),
        ({"input_tokens": True, "output_tokens": 1.0, "total_tokens": "3"},
         (None, None, None, None, None, None)),
        ({"input_tokens": -1, "output_tokens": 2**64}, (None, None, None, None, None, None)),
        ("not a mapping", (None, None, None, None, None, None)),
    ],
)  # fmt: skip
def test_token_mapping(usage: object, expected: tuple[int | None, ...]) -> None:
    stats = token_stats(usage)
    assert (
        stats.tokens_in, stats.tokens_out, stats.tokens_reasoning, stats.tokens_total,
        stats.cached_tokens, stats.cache_creation_tokens,
    ) == expected  # fmt: skip


def test_anthropic_stream_usage_merges_start_and_delta() -> None:
    body = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
        b'"type":"message","role":"assistant","content":[],"model":"claude-x","usage":'
        b'{"input_tokens":10,"output_tokens":1,"cache_read_input_tokens":5,'
        b'"cache_creation_input_tokens":2}}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
        b'"end_turn"},"usage":{"output_tokens":7}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    rebuilt = reassemble_stream("messages", body)
    assert rebuilt.terminal == "complete"
    stats = extract_response("messages", rebuilt.response).tokens
    assert (stats.tokens_in, stats.tokens_out, stats.cached_tokens) == (17, 7, 5)
    assert stats.cache_creation_tokens == 2


def test_chat_choices_with_different_indexes_stay_apart() -> None:
    chunks = [
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "a"}}]},
        {"id": "c1", "model": "m", "choices": [{"index": 1, "delta": {"content": "b"}}]},
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "c"},
                                               "finish_reason": "stop"}]},
        {"id": "c1", "model": "m", "choices": [{"index": 1, "delta": {}, "finish_reason":
                                               "length"}]},
    ]  # fmt: skip
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    rebuilt = reassemble_stream("chat", body)
    assert rebuilt.terminal == "complete"
    assert rebuilt.response is not None
    choices = rebuilt.response["choices"]
    assert [c["message"]["content"] for c in choices] == ["ac", "b"]
    assert [c["finish_reason"] for c in choices] == ["stop", "length"]
    assert extract_response("chat", rebuilt.response).finish_reason == "stop"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_truncated_stream_is_marked_and_keeps_its_partial_reassembly(dialect: str) -> None:
    answer = ANSWERS["tools"]
    record = record_of(dialect, answer, stream=True, terminal=False)
    assert record.error_category == "stream_truncated"
    assert record.response is not None
    assert [c.arguments for c in record.tool_calls] == [
        dict(c.arguments) for c in answer.tool_calls
    ]
    assert record.response_id == answer.response_id


def test_responses_output_items_are_rebuilt_from_deltas_without_an_envelope() -> None:
    answer = Answer(
        text="Visible text",
        reasoning="Because.",
        tool_calls=(ToolCallSpec("lookup", {"q": 1}, "call_x"),),
    )
    full = response_stream("responses", answer)
    # Drop the output_item.done events too, so only deltas can rebuild the items.
    kept = [
        e for e in parse_sse(full)
        if e.event not in ("response.output_item.done", "response.completed")
    ]  # fmt: skip
    body = b"".join(
        b"event: " + e.event.encode() + b"\ndata: " + e.data.encode() + b"\n\n"
        for e in kept
        if e.event
    )
    rebuilt = reassemble_stream("responses", body)
    assert rebuilt.terminal is None
    assert rebuilt.response is not None
    output = rebuilt.response["output"]
    assert [item["type"] for item in output] == ["reasoning", "message", "function_call"]
    assert output[1]["content"][0]["text"] == "Visible text"
    fact = extract_response("responses", rebuilt.response)
    assert fact.reasoning == "Because."
    assert [(c.name, c.arguments) for c in fact.tool_calls] == [("lookup", {"q": 1})]
    assert fact.response_status == "in_progress"  # the last interim status, not invented


def test_unparseable_tool_arguments_are_kept_raw_and_flagged() -> None:
    answer = Answer(text="", tool_calls=(ToolCallSpec("lookup", '{"q": "unterminated', "c1"),))
    for dialect in ("responses", "chat"):
        for stream in (False, True):
            (call,) = record_of(dialect, answer, stream=stream).tool_calls
            assert call.arguments is None
            assert call.arguments_raw == '{"q": "unterminated'
            assert call.arguments_parse_error is True
    (call,) = record_of("messages", answer, stream=True).tool_calls
    assert call.arguments_parse_error is True and call.arguments_raw == '{"q": "unterminated'
    body = chat_body(Answer(tool_calls=(ToolCallSpec("noargs", "", "c2"),)))
    (call,) = extract_response("chat", body).tool_calls
    assert call.arguments == {} and not call.arguments_parse_error


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("status", [400, 401, 404, 429, 500, 529])
def test_error_bodies_give_error_details(dialect: str, status: int) -> None:
    record = record_of(dialect, Answer(), status_code=status)
    assert record.status_code == status
    assert record.error_code is not None and record.error_code.endswith("_error")
    assert record.error_message == "simulated failure"
    expected = {400: "client_error", 401: "auth", 404: "not_found", 429: "rate_limit"}
    assert record.error_category == expected.get(status, "upstream_error")
    assert error_body(dialect, status)  # the builder is what the API sends


@pytest.mark.parametrize(
    ("dialect", "body", "kind"),
    [
        ("responses", b"event: response.completed\ndata: {}\n\n", "complete"),
        ("responses", b'data: {"type":"response.completed","response":{}}\n\n', "complete"),
        ("responses", b"event: response.incomplete\ndata: {}\n\n", "incomplete"),
        ("responses", b"event: response.failed\ndata: {}\n\n", "error"),
        ("responses", b"event: error\ndata: {}\n\n", "error"),
        ("responses", b"event:  response.completed  \r\ndata: {}\r\n\r\n", "complete"),
        ("responses", b"event: response.output_text.delta\ndata: {}\n\n", None),
        ("chat", b"data: [DONE]\n\n", "complete"),
        ("chat", b"data:[DONE]\n\n", "complete"),
        ("chat", b"event:error\ndata: {}\n\n", "error"),
        ("chat", b'data: {"error": {"message": "boom"}}\n\n', "error"),
        ("chat", b'data: {"error": null, "choices": []}\n\n', None),
        ("messages", b"event: message_stop\ndata: {}\n\n", "complete"),
        ("messages", b'data: {"type": "message_stop"}\n\n', "complete"),
        ("messages", b"event: error\ndata: {}\n\n", "error"),
        ("messages", b"event: ping\ndata: {}\n\n", None),
    ],
)
def test_terminal_detection(dialect: str, body: bytes, kind: str | None) -> None:
    detector = TerminalDetector(dialect)
    seen = [detector.feed(body[i : i + 3]) for i in range(0, len(body), 3)]
    assert detector.close() == kind
    assert reassemble_stream(dialect, body).terminal == kind
    if kind is not None:
        assert seen[-1] == kind  # the blank line ends the block: seen before close


def test_a_final_block_without_blank_line_is_seen_at_close() -> None:
    detector = TerminalDetector("messages")
    assert detector.feed(b"event: message_stop\ndata: {}") is None
    assert detector.close() == "complete"


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"garbage",
        b"data: [1, 2]\n\n",
        b": ping\n\n",
        b"event: ping\ndata: {}\n\n",
        b"data: [DONE]\n\n",
    ],
)
def test_nothing_usable_reassembles_to_none(dialect: str, body: bytes) -> None:
    assert reassemble_stream(dialect, body).response is None


def test_dialect_paths() -> None:
    assert {d: dialect_for_path(f).name for d, f in [  # type: ignore[union-attr]
        ("responses", "/v1/responses"), ("chat", "/v1/chat/completions"),
        ("messages", "/v1/messages")]} == {d: d for d in DIALECTS}  # fmt: skip
    for other in ("/v1/models", "/v1/completions", "/v1/responses/", "/v1/messages/count_tokens"):
        assert dialect_for_path(other) is None
