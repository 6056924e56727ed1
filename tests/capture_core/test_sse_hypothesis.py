"""Property tests for capture_core.sse: chunking never changes the result, generated streams
parse back exactly, and the serializer's output is a normal form."""

from __future__ import annotations

import itertools
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from capture_core.sse import SSEEvent, SSEParser, format_events, parse_sse

PROPERTY = settings(max_examples=300, deadline=None)

# Byte fragments that make random bodies look like SSE often enough to reach every branch.
FRAGMENTS = [
    b"\n", b"\r", b"\r\n", b"\n\n", b"data:", b"data: ", b"data", b"event:", b"event: ", b"id:",
    b"id: ", b"retry:", b"retry: ", b":", b" ", b"\t", b"x", b"1", b"[DONE]", b"{}", b"\x00",
    b"\xef\xbb\xbf", b"\xef", b"\xbb", b"\xc3", b"\xa9", b"\xf0\x9f", b"\x99\x82", b"\xff",
]  # fmt: skip
sse_soup = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=3)), max_size=60).map(
    b"".join
)
any_body = st.one_of(st.binary(max_size=200), sse_soup)


def split_at(body: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(bounds)]


def feed_chunks(chunks: list[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.close()
    assert parser.bytes_seen == sum(map(len, chunks))
    return events


def reference_parse(body: bytes) -> list[SSEEvent]:
    """A deliberately naive oracle: decode everything, split with a regex, walk the lines."""
    text = body.decode("utf-8", "replace").removeprefix("\ufeff")
    events: list[SSEEvent] = []
    data: list[str] = []
    fields: dict[str, str | int] = {}
    for line in [*re.split(r"\r\n|\r|\n", text), ""]:
        if line == "":
            if data or fields.keys() & {"event", "id"}:
                event, id_, retry = fields.get("event"), fields.get("id"), fields.get("retry")
                assert not isinstance(event, int) and not isinstance(id_, int)
                assert not isinstance(retry, str)
                events.append(SSEEvent(event, "\n".join(data), id_, retry))
            data, fields = [], {}
            continue
        name, colon, value = line.partition(":")
        if not name and colon:
            continue
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            fields["event"] = value.strip()
        elif name == "id" and "\x00" not in value:
            fields["id"] = value
        elif name == "retry" and re.fullmatch(r"[0-9]{1,18}", value):
            fields["retry"] = int(value)
    return events


@PROPERTY
@given(body=any_body, data=st.data())
def test_any_chunking_equals_whole_body(body: bytes, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=12))
    whole = parse_sse(body)
    assert feed_chunks(split_at(body, cuts)) == whole
    assert whole == reference_parse(body)
    for event in whole:
        assert "\r" not in event.data
        assert "\n" not in (event.event or "")
        assert event.event == (event.event or "").strip() or event.event is None


@PROPERTY
@given(body=any_body)
def test_byte_by_byte_equals_whole_body(body: bytes) -> None:
    assert feed_chunks([body[i : i + 1] for i in range(len(body))]) == parse_sse(body)


# --- generated well-formed streams ------------------------------------------------------------

line_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"))
event_names = st.none() | line_text.map(str.strip)
ids = st.none() | line_text.filter(lambda s: "\x00" not in s)
retries = st.none() | st.integers(0, 10**18 - 1)
data_lines = st.lists(line_text, min_size=1, max_size=4)
generated_events = st.builds(
    lambda event, lines, id_, retry: (SSEEvent(event, "\n".join(lines), id_, retry), lines),
    event_names,
    data_lines,
    ids,
    retries,
)


@st.composite
def render_block(draw: st.DrawFn, event: SSEEvent, lines: list[str]) -> list[str]:
    """Render one event as field lines, with random spelling, field order and comments."""
    out = []
    for line in lines:
        if line and not line.startswith(" ") and draw(st.booleans()):
            out.append("data:" + line)
        elif not line and draw(st.booleans()):
            out.append("data")
        else:
            out.append("data: " + line)
    others = []
    if event.event is not None:
        others.append("event:" + draw(st.sampled_from(["", " ", "  ", " \t"])) + event.event)
    if event.id is not None:
        others.append("id: " + event.id)
    if event.retry is not None:
        others.append(f"retry: {event.retry}")
    others += draw(st.lists(st.sampled_from([":", ": comment", ":data: no", "x-unknown: 1"])))
    for other in others:
        out.insert(draw(st.integers(0, len(out))), other)
    return out


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent]]:
    pairs = draw(st.lists(generated_events, max_size=6))
    lines: list[str] = []
    for index, (event, field_lines) in enumerate(pairs):
        lines += draw(render_block(event, field_lines))
        if index < len(pairs) - 1 or draw(st.booleans()):  # the final blank line is optional
            lines.append("")
    chunks = ["\ufeff"] if draw(st.booleans()) else []
    previous = ""
    for index, line in enumerate(lines):
        # After a lone CR, an empty line ended by LF would read as one CRLF: not well formed.
        choices = ["\r", "\r\n"] if previous == "\r" and not line else ["\n", "\r\n", "\r"]
        last = index == len(lines) - 1
        previous = draw(st.sampled_from([*choices, ""] if last else choices))
        chunks += [line, previous]
    return "".join(chunks).encode(), [event for event, _ in pairs]


@PROPERTY
@given(stream=sse_streams(), data=st.data())
def test_generated_streams_parse_back_exactly(
    stream: tuple[bytes, list[SSEEvent]], data: st.DataObject
) -> None:
    body, expected = stream
    assert parse_sse(body) == expected
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=16))
    assert feed_chunks(split_at(body, cuts)) == expected


@PROPERTY
@given(stream=sse_streams())
def test_generated_streams_byte_by_byte(stream: tuple[bytes, list[SSEEvent]]) -> None:
    body, expected = stream
    assert feed_chunks([body[i : i + 1] for i in range(len(body))]) == expected


# --- serializer normal form -------------------------------------------------------------------


@PROPERTY
@given(text=st.text() | sse_soup.map(lambda b: b.decode("utf-8", "replace")))
def test_format_events_is_a_normal_form(text: str) -> None:
    events = parse_sse(text)
    normal = format_events(events)
    assert parse_sse(normal) == events
    assert format_events(parse_sse(normal)) == normal


@PROPERTY
@given(pairs=st.lists(generated_events, max_size=5))
def test_format_events_round_trips_generated_events(
    pairs: list[tuple[SSEEvent, list[str]]],
) -> None:
    events = [event for event, _ in pairs]
    assert parse_sse(format_events(events)) == events
