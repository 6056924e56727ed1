"""The appender's wire format: frames survive any cut of the stream; nonsense is refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capture_core.appender.frames import (
    Answer,
    FrameError,
    FrameReader,
    Request,
    encode_answer,
    encode_request,
)

names = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=40)


@given(
    st.lists(st.tuples(names, st.binary(max_size=50), st.binary(max_size=300)), max_size=8),
    st.lists(st.integers(1, 64), min_size=1, max_size=6),
)
def test_requests_come_out_whole_however_the_stream_is_cut(
    parts: list[tuple[str, bytes, bytes]], cuts: list[int]
) -> None:
    sent = [Request(job, name, fields, line) for job, (name, fields, line) in enumerate(parts)]
    stream = b"".join(encode_request(r.job, r.name, r.fields, r.line) for r in sent)
    reader, got, pos = FrameReader(), [], 0
    for index in range(len(stream)):  # bounded: one step per byte at most
        if pos >= len(stream):
            break
        step = cuts[index % len(cuts)]
        got += reader.requests(stream[pos : pos + step])
        pos += step
    assert got == sent
    assert reader.pending == 0


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(-1, 2**40), st.text(max_size=30))))
def test_answers_come_out_whole(parts: list[tuple[int, int, str]]) -> None:
    sent = [
        Answer(job, written, 28 if written < 0 else 0, reason) for job, written, reason in parts
    ]
    stream = b"".join(map(encode_answer, sent))
    reader = FrameReader()
    got = reader.answers(stream[:7]) + reader.answers(stream[7:])
    assert got == sent


def test_a_request_whose_lengths_contradict_is_refused() -> None:
    frame = bytearray(encode_request(1, "a.capture.jsonl", b"{}", b"{}\n"))
    struct.pack_into("<H", frame, 12, 60_000)  # a name longer than the frame
    with pytest.raises(FrameError, match="cannot hold its parts"):
        FrameReader().requests(bytes(frame))


def test_a_file_name_that_is_not_utf8_is_refused() -> None:
    frame = bytearray(encode_request(1, "ab", b"", b"{}\n"))
    frame[18:20] = b"\xff\xfe"
    with pytest.raises(FrameError, match="not UTF-8"):
        FrameReader().requests(bytes(frame))


def test_a_name_too_long_for_the_format_is_refused_before_sending() -> None:
    with pytest.raises(FrameError, match="does not fit"):
        encode_request(1, "x" * 70_000, b"", b"{}\n")
