"""Property tests: chunking never changes what a stream means; hostile input never raises."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture_core import (
    CaptureStore,
    InvalidRecordError,
    SSEParser,
    TerminalDetector,
    extract_response,
    get_dialect,
    normalize_line,
    parse_sse,
    reassemble_stream,
)
from capture_core.dialects import reassemble_events
from capture_core.testing import Answer, ToolCallSpec, capture_line, response_stream

DIALECTS = st.sampled_from(["responses", "chat", "messages"])
TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
JSON_SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | TEXT
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)
ARGS = st.dictionaries(st.text("abcxyz", min_size=1, max_size=5), JSON, max_size=3)


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    calls = draw(st.lists(ARGS, max_size=2))
    return Answer(
        text=draw(TEXT),
        reasoning=draw(st.none() | TEXT.filter(bool)),
        tool_calls=tuple(
            ToolCallSpec(f"tool{i}", args, f"call_{i}") for i, args in enumerate(calls)
        ),
        input_tokens=draw(st.integers(0, 10**6)),
        output_tokens=draw(st.integers(0, 10**5)),
        cached_tokens=draw(st.none() | st.integers(0, 100)),
        truncated_by_length=draw(st.booleans()),
        report_usage=draw(st.booleans()),
    )


def chunked(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(body) + 1) for c in cuts})
    bounds = [0, *points, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dialect=DIALECTS,
    answer=answers(),
    terminal=st.booleans(),
    cuts=st.lists(st.integers(0, 10**6), max_size=30),
)
def test_any_chunking_gives_the_same_events_and_reassembly(
    dialect: str, answer: Answer, terminal: bool, cuts: list[int]
) -> None:
    body = response_stream(dialect, answer, terminal=terminal)
    whole = parse_sse(body)
    parser, detector, events = SSEParser(), TerminalDetector(dialect), []
    keeper = TerminalDetector(dialect, keep_events=True)  # as the capture server uses it
    for piece in chunked(body, cuts):
        events.extend(parser.feed(piece))
        detector.feed(piece)
        keeper.feed(piece)
    events.extend(parser.close())
    assert events == whole
    assert keeper.close() == detector.close()
    assert keeper.events == whole
    assert reassemble_events(dialect, keeper.events) == reassemble_stream(dialect, body)
    spec = get_dialect(dialect)
    assert spec.reassemble(events) == spec.reassemble(whole)
    rebuilt = reassemble_stream(dialect, body)
    assert detector.close() == rebuilt.terminal
    assert (rebuilt.terminal is not None) == terminal
    facts = extract_response(dialect, rebuilt.response)
    assert [c.name for c in facts.tool_calls] == [c.name for c in answer.tool_calls]
    assert [c.arguments for c in facts.tool_calls] == [
        orjson.loads(c.arguments_json) for c in answer.tool_calls
    ]
    assert (facts.reasoning or None) == (answer.reasoning or None)


@settings(max_examples=300, deadline=None)
@given(dialect=DIALECTS, data=st.binary(max_size=400))
def test_arbitrary_bytes_never_raise_out_of_reassembly(dialect: str, data: bytes) -> None:
    rebuilt = reassemble_stream(dialect, data)
    keeper = TerminalDetector(dialect, keep_events=True)
    for piece in chunked(data, [7, 31, 100]):
        keeper.feed(piece)
    keeper.close()
    assert keeper.events is not None
    assert reassemble_events(dialect, keeper.events) == rebuilt
    assert rebuilt.response is None or isinstance(rebuilt.response, dict)
    extract_response(dialect, rebuilt.response)


@settings(max_examples=300, deadline=None)
@given(dialect=DIALECTS, events=st.lists(st.tuples(st.none() | TEXT, JSON), max_size=8))
def test_arbitrary_json_events_never_raise(dialect: str, events: list[tuple[Any, Any]]) -> None:
    body = b"".join(
        (b"event: " + name.replace("\n", " ").replace("\r", " ").encode() + b"\n" if name else b"")
        + b"data: "
        + orjson.dumps(payload)
        + b"\n\n"
        for name, payload in events
    )
    rebuilt = reassemble_stream(dialect, body)
    extract_response(dialect, rebuilt.response)


@settings(max_examples=300, deadline=None)
@given(value=JSON, response=JSON, dialect=DIALECTS | TEXT)
def test_arbitrary_json_lines_normalize_or_raise_invalid_record(
    value: Any, response: Any, dialect: str
) -> None:
    for candidate in (value, {"model_call_id": "c", "dialect": dialect, "response": response}):
        with contextlib.suppress(InvalidRecordError):
            normalize_line(candidate, 0)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=600), valid_after=st.booleans())
def test_arbitrary_file_bytes_never_raise_out_of_the_reader(
    tmp_path_factory: Any, data: bytes, valid_after: bool
) -> None:
    store = CaptureStore(tmp_path_factory.mktemp("fuzz"))
    store.path_for("r-0").write_bytes(data)
    if valid_after:
        store.record("r-0", capture_line("chat", Answer()))
    result = store.read_records("r-0")
    indexes = [r.call_index for r in result.records] + [d.call_index for d in result.damaged]
    assert sorted(indexes) == list(range(len(indexes)))
    if valid_after:
        assert result.records and result.records[-1].call_index == len(indexes) - 1


# Keys the dialect readers look at, so generated bodies reach their nested branches (random
# keys almost never do): an output item whose "type" is an object, usage that is a list...
DIALECT_KEYS = st.sampled_from(
    "type output content choices message delta tool_calls function usage stop_reason "
    "finish_reason incomplete_details reason status error code id model name arguments "
    "input call_id summary text thinking prompt_tokens completion_tokens input_tokens "
    "output_tokens total_tokens prompt_tokens_details cached_tokens completion_tokens_details "
    "reasoning_tokens input_tokens_details output_tokens_details cache_read_input_tokens "
    "cache_creation_input_tokens reasoning_content logprobs".split()
)
SHAPED = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(DIALECT_KEYS, inner, max_size=5),
    max_leaves=25,
)


# Items always carry a "type" (what the readers branch on), of any JSON kind.
ITEM = st.builds(
    lambda kind, rest: {**rest, "type": kind},
    SHAPED | DIALECT_KEYS,
    st.dictionaries(DIALECT_KEYS, SHAPED, max_size=4),
)
SHAPED_RESPONSE = st.fixed_dictionaries(
    {},
    optional={
        key: SHAPED | ITEM | st.lists(ITEM, max_size=3)
        for key in ("output", "content", "choices", "usage", "error", "incomplete_details")
    }
    | dict.fromkeys(("id", "model", "status", "stop_reason", "type"), SHAPED),
)


@settings(max_examples=600, deadline=None)
@given(response=SHAPED_RESPONSE)
def test_dialect_shaped_hostile_responses_never_raise(response: dict[str, Any]) -> None:
    extract_response(None, response)  # guessed by shape
    for dialect in ("responses", "chat", "messages"):
        extract_response(dialect, response)
        with contextlib.suppress(InvalidRecordError):
            normalize_line({"model_call_id": "c", "dialect": dialect, "response": response}, 0)


def test_an_output_item_typed_with_an_object_is_no_tool_call() -> None:
    hostile = [{"type": {"a": 1}}, {"type": ["function_call"]}, {"type": "function_call"}]
    responses = extract_response("responses", {"output": hostile})
    assert [t.type for t in responses.tool_calls] == ["function_call"]
    messages = extract_response("messages", {"content": hostile[:2], "stop_reason": {"x": 1}})
    assert messages.tool_calls == () and messages.finish_reason is None


def test_a_stream_delta_typed_with_an_object_is_skipped() -> None:
    events = [
        {"type": "message_start", "message": {"id": "m", "content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": {"x": 1}, "text": "no"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "message_stop"},
    ]
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    rebuilt = reassemble_stream("messages", body)
    assert rebuilt.response is not None
    assert rebuilt.response["content"][0]["text"] == "ok"


# Stream events of the three dialects, with their real type names and hostile contents, so
# reassembly reaches every branch (start blocks with null fields, deltas of every kind...).
EVENT_TYPES = st.sampled_from(
    "message_start content_block_start content_block_delta content_block_stop message_delta "
    "message_stop error ping text_delta thinking_delta signature_delta input_json_delta "
    "citations_delta response.created response.in_progress response.output_item.added "
    "response.output_item.done response.output_text.delta response.output_text.done "
    "response.function_call_arguments.delta response.function_call_arguments.done "
    "response.reasoning_text.delta response.refusal.delta response.completed "
    "response.incomplete response.failed".split()
)
EVENT_KEYS = st.sampled_from(
    "index message content_block delta usage citations citation text thinking signature "
    "partial_json response item output_index item_id arguments choices finish_reason "
    "tool_calls function id name error".split()
)
EVENT_FIELD = st.recursive(
    JSON_SCALARS | st.dictionaries(EVENT_KEYS | DIALECT_KEYS, JSON_SCALARS, max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(EVENT_KEYS | DIALECT_KEYS | st.just("type"), inner, max_size=4)
        | st.builds(
            lambda kind, rest: {**rest, "type": kind},
            EVENT_TYPES,
            st.dictionaries(EVENT_KEYS, inner, max_size=3),
        )
    ),
    max_leaves=20,
)
SHAPED_EVENT = st.builds(
    lambda kind, rest: {**rest, "type": kind},
    EVENT_TYPES,
    st.dictionaries(EVENT_KEYS, EVENT_FIELD | st.integers(0, 2), max_size=4),
)


@settings(max_examples=600, deadline=None)
@given(events=st.lists(SHAPED_EVENT, max_size=8))
def test_dialect_shaped_hostile_streams_never_raise(events: list[dict[str, Any]]) -> None:
    body = b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events)
    for dialect in ("responses", "chat", "messages"):
        rebuilt = reassemble_stream(dialect, body)
        extract_response(dialect, rebuilt.response)


def test_a_citation_after_a_null_citations_field_is_kept() -> None:
    events = [
        {"type": "message_start", "message": {"id": "m", "content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "citations": None}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta", "citation": {"n": 1}}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_stop"},
    ]  # fmt: skip
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    rebuilt = reassemble_stream("messages", body)
    assert rebuilt.response is not None
    assert rebuilt.response["content"][0]["citations"] == [{"n": 1}]
