"""Unit tests for capture_core.sse: framing, fields, decoding, JSON and the serializer."""

from __future__ import annotations

import pytest

from capture_core.sse import SSEEvent, SSEParser, format_event, format_events, parse_sse


def feed_all(*chunks: bytes) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.close()


def bytewise(body: bytes) -> list[SSEEvent]:
    return feed_all(*(body[i : i + 1] for i in range(len(body))))


# --- line terminators -----------------------------------------------------------------------


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
def test_line_terminators(eol: str) -> None:
    body = f"event: a{eol}data: 1{eol}{eol}data: 2{eol}data: 3{eol}{eol}".encode()
    expected = [SSEEvent("a", "1"), SSEEvent(None, "2\n3")]
    assert parse_sse(body) == expected
    assert bytewise(body) == expected


def test_mixed_terminators_in_one_stream() -> None:
    body = b"data: a\r\ndata: b\rdata: c\n\r\n"
    assert parse_sse(body) == [SSEEvent(None, "a\nb\nc")]


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: x\r") == []
    # The LF completes the CRLF; it is not a second (blank) line, so nothing is dispatched yet.
    assert parser.feed(b"\ndata: y\r") == []
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\r") == [SSEEvent(None, "x\ny")]
    assert parser.feed(b"\n") == []
    assert parser.close() == []


def test_only_one_lf_is_absorbed_after_a_chunk_ending_in_cr() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"") == []
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\n") == [SSEEvent(None, "a")]


def test_cr_then_lf_chunk_after_blank_line_does_not_dispatch_twice() -> None:
    assert feed_all(b"data: x\r\n\r", b"\n", b"data: y\r", b"\r") == [
        SSEEvent(None, "x"),
        SSEEvent(None, "y"),
    ]


def test_lone_cr_at_chunk_end_followed_by_text() -> None:
    assert feed_all(b"data: x\r", b"data: y\r", b"\r") == [SSEEvent(None, "x\ny")]


def test_lf_starting_a_chunk_ends_the_pending_line_after_an_earlier_cr() -> None:
    # The chunk's last terminator is a CR, but a partial line follows it: the LF that starts
    # the next chunk terminates that partial line and must not be swallowed as part of a CRLF.
    assert feed_all(b"data: a\rdata: b", b"\n:c\n\n") == [SSEEvent(None, "a\nb")]
    assert feed_all(b"data: a\rdata: b", b"\n\n") == [SSEEvent(None, "a\nb")]


# --- fields -----------------------------------------------------------------------------------


def test_multiline_data_joined_with_newline() -> None:
    assert parse_sse(b"data: line one\ndata:\ndata: line three\n\n") == [
        SSEEvent(None, "line one\n\nline three")
    ]


def test_comments_are_ignored_and_comment_only_block_yields_nothing() -> None:
    body = b": keep-alive\n\n:another\ndata: x\n: in the middle\ndata: y\n\n: end\n\n"
    assert parse_sse(body) == [SSEEvent(None, "x\ny")]


def test_event_and_data() -> None:
    assert parse_sse(b"event: response.created\ndata: {}\n\n") == [
        SSEEvent("response.created", "{}")
    ]


def test_last_event_field_wins_and_is_stripped() -> None:
    assert parse_sse(b"event: first\nevent:   second \t\ndata: x\n\n") == [SSEEvent("second", "x")]


def test_event_without_data_is_dispatched_with_empty_data() -> None:
    assert parse_sse(b"event: message_stop\n\n") == [SSEEvent("message_stop", "")]


def test_data_done_without_space() -> None:
    assert parse_sse(b"data:[DONE]\n\n") == [SSEEvent(None, "[DONE]")]


def test_only_one_leading_space_is_removed() -> None:
    assert parse_sse(b"data:  x \n\n") == [SSEEvent(None, " x ")]
    assert parse_sse(b"data:\tx\n\n") == [SSEEvent(None, "\tx")]


def test_colon_inside_value_is_kept() -> None:
    assert parse_sse(b'data: {"a": "b:c"}\n\n') == [SSEEvent(None, '{"a": "b:c"}')]


def test_field_without_colon_has_empty_value() -> None:
    assert parse_sse(b"data\ndata\n\n") == [SSEEvent(None, "\n")]
    assert parse_sse(b"event\n\n") == [SSEEvent("", "")]


def test_unknown_fields_are_ignored() -> None:
    assert parse_sse(b"foo: bar\nDATA: up\ndata : spaced\ndata: x\n\n") == [SSEEvent(None, "x")]
    assert parse_sse(b"foo: bar\nbaz\n\n") == []


def test_id_and_retry() -> None:
    assert parse_sse(b"id: 42\nretry: 3000\ndata: x\n\n") == [SSEEvent(None, "x", "42", 3000)]


def test_id_alone_dispatches_and_id_with_nul_is_ignored() -> None:
    assert parse_sse(b"id: 7\n\n") == [SSEEvent(None, "", "7")]
    assert parse_sse(b"id: 7\nid: a\x00b\ndata: x\n\n") == [SSEEvent(None, "x", "7")]
    assert parse_sse(b"id: a\x00b\n\n") == []


@pytest.mark.parametrize("value", ["", "12a", "-5", " 5", "1.5", "\u0664\u0662", "9" * 5000])
def test_invalid_retry_is_ignored(value: str) -> None:
    body = f"retry: 10\nretry: {value}\ndata: x\n\n".encode()
    assert parse_sse(body) == [SSEEvent(None, "x", None, 10)]


def test_retry_alone_is_not_an_event_and_does_not_leak() -> None:
    assert parse_sse(b"retry: 10\n\ndata: x\n\n") == [SSEEvent(None, "x")]


def test_fields_reset_between_blocks() -> None:
    assert parse_sse(b"event: a\nid: 1\nretry: 5\ndata: x\n\ndata: y\n\n") == [
        SSEEvent("a", "x", "1", 5),
        SSEEvent(None, "y"),
    ]


# --- end of stream ----------------------------------------------------------------------------


def test_final_block_without_blank_line_emitted_on_close_only() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n\nevent: message_stop\ndata: {}\n") == [SSEEvent(None, "a")]
    assert parser.feed(b"") == []
    assert parser.close() == [SSEEvent("message_stop", "{}")]


def test_pending_line_without_terminator_is_parsed_on_close() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: [DO") == []
    assert parser.feed(b"NE]") == []
    assert parser.close() == [SSEEvent(None, "[DONE]")]


def test_close_resets_for_a_new_stream() -> None:
    parser = SSEParser()
    parser.feed(b"data: a\n")
    assert parser.close() == [SSEEvent(None, "a")]
    assert parser.close() == []
    assert parser.feed(b"\xef\xbb\xbfdata: b\n\n") == [SSEEvent(None, "b")]
    assert parser.bytes_seen == len(b"data: a\n") + len(b"\xef\xbb\xbfdata: b\n\n")


def test_bytes_seen_counts_every_fed_byte() -> None:
    parser = SSEParser()
    parser.feed(b"\xef\xbb")
    parser.feed(b"\xbfdata: x\r")
    parser.feed(b"\n")
    assert parser.bytes_seen == 12


# --- decoding ---------------------------------------------------------------------------------


def test_bom_at_start_is_skipped_even_when_split() -> None:
    body = b"\xef\xbb\xbfdata: x\n\n"
    assert parse_sse(body) == [SSEEvent(None, "x")]
    assert bytewise(body) == [SSEEvent(None, "x")]
    # Only at the very start: a later BOM is content (it makes an unknown field name here).
    assert parse_sse(b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n") == []
    assert parse_sse(b"data: \xef\xbb\xbfx\n\n") == [SSEEvent(None, "\ufeffx")]


def test_partial_bom_at_end_of_stream_is_not_lost() -> None:
    assert parse_sse(b"\xef\xbb") == []
    assert parse_sse(b"data:\xef\xbb") == [SSEEvent(None, "\ufffd")]


@pytest.mark.parametrize("char", ["é", "€", "🙂"])
def test_multibyte_character_split_between_chunks(char: str) -> None:
    body = f"data: {char}x{char}\n\n".encode()
    expected = [SSEEvent(None, f"{char}x{char}")]
    for cut in range(len(body) + 1):
        assert feed_all(body[:cut], body[cut:]) == expected, cut
    assert bytewise(body) == expected


def test_invalid_utf8_becomes_replacement_character() -> None:
    assert parse_sse(b"data: a\xffb\xc3\n\n") == [SSEEvent(None, "a\ufffdb\ufffd")]
    assert bytewise(b"data: \xe2\x82\n\n") == [SSEEvent(None, "\ufffd")]


def test_str_body_is_accepted() -> None:
    assert parse_sse("data: é\r\n\r\n") == [SSEEvent(None, "é")]
    assert parse_sse("data: \ud800\n\n") == [SSEEvent(None, "\ufffd" * 3)]


# --- json() -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ('{"a": [1, 2.5, null, "é"]}', {"a": [1, 2.5, None, "é"]}),
        ("[1, 2]", [1, 2]),
        ("42", 42),
        ('"s"', "s"),
        ("", None),
        ("[DONE]", None),
        ("{not json", None),
        ('{"a": 1}\n{"b": 2}', None),
        ("\ud800", None),
    ],
)
def test_json(data: str, expected: object) -> None:
    assert SSEEvent(None, data).json() == expected


# --- serializer -------------------------------------------------------------------------------


def test_format_event_exact_bytes() -> None:
    assert format_event("hello") == b"data: hello\n\n"
    assert format_event({"a": 1, "b": [True, None]}, event="ping") == (
        b'event: ping\ndata: {"a":1,"b":[true,null]}\n\n'
    )
    assert format_event("a\n\nb", event="e", id="3") == (
        b"event: e\nid: 3\ndata: a\ndata:\ndata: b\n\n"
    )


@pytest.mark.parametrize(
    ("data", "event"),
    [
        ({"type": "message_start", "message": {"content": [], "text": "line\nbreak é 🙂"}}, "a"),
        ([1, "two", {"three": 3}], None),
        ("first line\nsecond: line\n\n  indented\n", "response.output_text.delta"),
        ("", "message_stop"),
        ("", None),
        (" leading space", None),
        ("[DONE]", None),
    ],
)
def test_format_event_round_trips(data: object, event: str | None) -> None:
    body = format_event(data, event=event, id="id-1")  # type: ignore[arg-type]
    (parsed,) = parse_sse(body)
    assert parsed.event == event
    assert parsed.id == "id-1"
    if isinstance(data, str):
        assert parsed.data == data
    else:
        assert parsed.json() == data


def test_format_event_normalizes_cr_line_breaks() -> None:
    assert parse_sse(format_event("a\r\nb\rc")) == [SSEEvent(None, "a\nb\nc")]


def test_format_event_accepts_any_mapping() -> None:
    from types import MappingProxyType

    assert format_event(MappingProxyType({"k": "v"})) == b'data: {"k":"v"}\n\n'


@pytest.mark.parametrize(
    "kwargs", [{"event": "a\nb"}, {"event": "a\rb"}, {"id": "1\n2"}, {"id": "1\x002"}]
)
def test_format_event_rejects_framing_breaking_names(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="SSE"):
        format_event("x", **kwargs)


def test_format_events_round_trips_all_fields() -> None:
    events = [
        SSEEvent("a", '{"x": 1}', "1", 1500),
        SSEEvent(None, "multi\nline"),
        SSEEvent("message_stop", ""),
        SSEEvent(None, "", id=""),
    ]
    body = format_events(events)
    assert body.startswith(b'event: a\nid: 1\nretry: 1500\ndata: {"x": 1}\n\n')
    assert parse_sse(body) == events
    assert format_events([]) == b""


# --- realistic dialect streams ----------------------------------------------------------------

RESPONSES_STREAM = (
    b"event: response.created\n"
    b'data: {"type":"response.created","sequence_number":0,"response":'
    b'{"id":"resp_1","status":"in_progress","output":[],"usage":null}}\n'
    b"\n"
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1",'
    b'"output_index":0,"content_index":0,"delta":"Hel"}\n'
    b"\n"
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_1",'
    b'"output_index":0,"content_index":0,"delta":"lo"}\n'
    b"\n"
    b"event: response.completed\n"
    b'data: {"type":"response.completed","sequence_number":3,"response":'
    b'{"id":"resp_1","status":"completed","usage":{"input_tokens":5,"output_tokens":2}}}\n'
    b"\n"
)

CHAT_STREAM = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\r\n\r\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"Hi \xc3\xa9"},"finish_reason":null}]}\r\n\r\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\r\n\r\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[],'
    b'"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}\r\n\r\n'
    b"data: [DONE]\r\n\r\n"
)

MESSAGES_STREAM = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_1","type":"message",'
    b'"role":"assistant","content":[],"model":"claude","stop_reason":null,'
    b'"usage":{"input_tokens":10,"output_tokens":1}}}\n\n'
    b"event: ping\n"
    b'data: {"type": "ping"}\n\n'
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}\n\n'
    b"event: content_block_stop\n"
    b'data: {"type":"content_block_stop","index":0}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
    b'"usage":{"output_tokens":7}}\n\n'
    b"event: message_stop\n"
    b'data: {"type":"message_stop"}\n\n'
)


def test_openai_responses_stream() -> None:
    events = parse_sse(RESPONSES_STREAM)
    assert [e.event for e in events] == [
        "response.created",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.completed",
    ]
    payloads = [e.json() for e in events]
    assert [p["type"] for p in payloads] == [e.event for e in events]
    assert "".join(p["delta"] for p in payloads[1:3]) == "Hello"
    assert payloads[-1]["response"]["usage"] == {"input_tokens": 5, "output_tokens": 2}


def test_chat_completions_stream() -> None:
    events = parse_sse(CHAT_STREAM)
    assert [e.event for e in events] == [None] * 5
    assert events[-1] == SSEEvent(None, "[DONE]")
    assert events[-1].json() is None
    payloads = [e.json() for e in events[:-1]]
    assert payloads[1]["choices"][0]["delta"]["content"] == "Hi é"
    assert payloads[2]["choices"][0]["finish_reason"] == "stop"
    assert payloads[3]["usage"]["total_tokens"] == 11


def test_anthropic_messages_stream() -> None:
    events = parse_sse(MESSAGES_STREAM)
    assert [e.event for e in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(e.json()["type"] == e.event for e in events)
    assert events[0].json()["message"]["usage"]["input_tokens"] == 10
    assert events[3].json()["delta"]["text"] == "Hi"
    assert events[5].json()["usage"] == {"output_tokens": 7}


@pytest.mark.parametrize("stream", [RESPONSES_STREAM, CHAT_STREAM, MESSAGES_STREAM])
@pytest.mark.parametrize("size", [1, 3, 7, 64, 1024])
def test_realistic_streams_chunked_equal_whole(stream: bytes, size: int) -> None:
    chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
    assert feed_all(*chunks) == parse_sse(stream)


@pytest.mark.parametrize("shift", range(4))
def test_large_body_crosses_internal_slices_exactly(shift: int) -> None:
    # parse_sse feeds big bodies in 64 KiB slices; put a CRLF and a 4-byte character on the seams.
    event = "data: 🙂 x\r\n\r\n".encode()  # 17 bytes: slice seams fall at every offset in turn
    body = b"." * shift + b"\n" + event * 20_000
    single = SSEParser()
    expected = single.feed(body) + single.close()
    assert len(expected) == 20_000
    assert set(expected) == {SSEEvent(None, "🙂 x")}
    assert parse_sse(body) == expected


def test_truncated_stream_keeps_complete_events_and_flushes_the_last_on_close() -> None:
    cut = MESSAGES_STREAM[: -len(b"\n\n")]  # server closed before the final blank line
    parser = SSEParser()
    streamed = parser.feed(cut)
    assert streamed[-1].event == "message_delta"
    assert parser.close() == [SSEEvent("message_stop", '{"type":"message_stop"}')]
