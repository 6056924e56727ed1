"""Lines built from exchanges: lossless raw bytes, decoding, and what the client saw."""

from __future__ import annotations

import base64
import gzip
import time

import brotli
import orjson
import pytest

from capture_core.server.exchange import Exchange
from capture_core.testing import Answer, chat_stream, request_body
from capture_core.testing.bodies import chat_body

REQUEST = orjson.dumps(request_body("chat"))


def exchange(response: bytes, **fields: object) -> Exchange:
    values: dict[str, object] = {"status_code": 200, "completed_at": time.time(),
                                 "latency_ms": 1.0, "ttft_ms": 0.5, **fields}  # fmt: skip
    return Exchange("c" * 32, "chat", None, time.time(), [REQUEST], [response], **values)  # type: ignore[arg-type]


def test_a_body_that_is_not_utf8_is_kept_exactly() -> None:
    body = b"\xff\xfe not text \x80"
    line = exchange(body).line()
    assert line["response"] is None
    assert base64.b64decode(line["response_raw_base64"]) == body
    assert "\ufffd" in line["response_raw"]
    assert line["error_category"] == "capture_parse_error"
    assert "response_raw_base64" not in exchange(b"plain text").line()


def test_a_compact_json_body_is_embedded_as_sent() -> None:
    body = orjson.dumps(chat_body(Answer()))
    encoded = orjson.dumps(exchange(body).line())
    assert b'"response":' + body in encoded
    assert orjson.loads(encoded)["request"] == orjson.loads(REQUEST)


@pytest.mark.parametrize(("coding", "encode"), [("gzip", gzip.compress), ("br", brotli.compress)])
def test_compressed_bodies_are_recorded_decoded(coding: str, encode: object) -> None:
    body = orjson.dumps(chat_body(Answer()))
    line = exchange(encode(body), content_encoding=coding).line()  # type: ignore[operator]
    assert line["error_category"] is None
    assert orjson.loads(orjson.dumps(line["response"])) == orjson.loads(body)


def test_a_body_its_coding_cannot_decode_is_a_parse_error_with_its_bytes() -> None:
    damaged = gzip.compress(b'{"a": 1}')[:-6]
    line = exchange(damaged, content_encoding="gzip").line()
    assert line["error_category"] == "capture_parse_error"
    assert line["response_content_encoding"] == "gzip"
    assert base64.b64decode(line["response_raw_base64"]) == damaged


def test_a_stream_that_cannot_be_decoded_is_a_parse_error_not_a_truncation() -> None:
    stream = chat_stream(Answer())
    line = exchange(b"garbage", streaming=True, content_encoding="br",
                    decode_error="brotli: corrupt").line()  # fmt: skip
    assert line["error_category"] == "capture_parse_error"
    decoded = exchange(stream, streaming=True).line()
    assert decoded["error_category"] is None


def test_the_client_leaving_wins_over_everything_and_keeps_what_was_seen() -> None:
    stream = chat_stream(Answer())
    half = stream[: len(stream) // 2]
    line = exchange(half, streaming=True, client_disconnected=True).line()
    assert line["error_category"] == "client_disconnected"
    assert line["response"] is not None  # the partial reassembly
    assert line["response_raw"] == half.decode()
    gone_early = exchange(b"", status_code=None, client_disconnected=True).line()
    assert (
        gone_early["status_code"] is None and gone_early["error_category"] == "client_disconnected"
    )
