"""Turn the bytes of one finished exchange into its raw capture line (runs off the event loop).

Parsing follows the capture rules: a request or response body is kept as an object only when
it parses to a JSON object, otherwise as raw text; a stream is reassembled and also kept raw.
A compressed body (``gzip``, ``deflate``, ``br``, ``zstd``) is decoded for the record only (the
client got the bytes unchanged). Raw text that is not UTF-8 is kept losslessly: ``*_raw`` holds
it with U+FFFD for the bytes that are not, and ``*_raw_base64`` holds the exact bytes.

The line says what the client saw: ``status_code`` is the status it was sent (null when it got
none), and a call the client abandoned is ``client_disconnected`` whatever else happened.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import orjson

from capture_core.dialects import (
    ResponseFacts,
    TerminalKind,
    extract_response,
    reassemble_events,
    reassemble_stream,
)
from capture_core.facts import FACTS_KEY, line_facts
from capture_core.outcome import classify_outcome
from capture_core.records import ErrorCategory
from capture_core.server.decoding import DecodeError, decode_body
from capture_core.sse import SSEEvent

__all__ = ["Exchange"]

_MAX_EMBEDDED_OPENERS = 1000  # orjson reads at most 1024 levels of nesting


def _json_object(body: bytes) -> dict[str, Any] | None:
    if not body:
        return None
    try:
        value = orjson.loads(body)
    except (orjson.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _embedded(body: bytes, objects: bool) -> tuple[Any, dict[str, Any] | None]:
    """A JSON-object body as a value for the line, and the object it parsed to (if it did).

    A compact object body is embedded as it came (an ``orjson.Fragment``: not encoded again);
    one that spans lines is re-encoded, since a capture line is one line.
    """
    if not objects:
        return None, None
    value = _json_object(body)
    if value is None:
        return None, None
    if (
        b"\n" in body
        or b"\r" in body
        or body[:1] != b"{"
        or body[-1:] != b"}"
        # Nested one level deeper in the line, a body at the decoder's depth limit would make
        # the line unreadable; so few brackets cannot get there.
        or body.count(b"[") + body.count(b"{") >= _MAX_EMBEDDED_OPENERS
    ):
        return value, value
    return orjson.Fragment(body), value


def _raw(line: dict[str, Any], key: str, body: bytes) -> None:
    try:
        line[key] = body.decode("utf-8")
    except UnicodeDecodeError:
        line[key] = body.decode("utf-8", "replace")
        line[key + "_base64"] = base64.b64encode(body).decode("ascii")


@dataclass
class Exchange:
    """Everything observed about one captured call, filled in while it is served."""

    model_call_id: str
    dialect: str
    model_ref: dict[str, str] | None
    started_at: float
    request_chunks: list[bytes] = field(default_factory=list)
    response_chunks: list[bytes] = field(default_factory=list)
    decoded_chunks: list[bytes] | None = None
    """A compressed stream's body, decoded as it passed (``None``: not decoded on the way)."""
    status_code: int | None = None
    streaming: bool = False
    content_encoding: str | None = None
    decode_error: str | None = None
    terminal: TerminalKind | None = None
    events: list[SSEEvent] | None = None
    """The stream's events as parsed while it passed (the whole response body, decoded), so
    the line need not parse it again; ``None``: parse the body."""
    transport_error: str | None = None
    client_disconnected: bool = False
    completed_at: float | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None

    def _response_body(self) -> bytes:
        """The response as decoded for the record; the wire bytes when it cannot be."""
        if self.decoded_chunks is not None:
            return b"".join(self.decoded_chunks)
        wire = b"".join(self.response_chunks)
        if self.decode_error is not None or not self.content_encoding:
            return wire
        try:
            return decode_body(wire, self.content_encoding)
        except DecodeError as exc:
            self.decode_error = str(exc)
            return wire

    @property
    def size(self) -> int:
        """Bytes of request and response held (what the line will roughly weigh)."""
        return sum(map(len, self.request_chunks)) + sum(map(len, self.response_chunks))

    def line(self, failure: str | None = None, *, objects: bool = True) -> dict[str, Any]:
        """The raw capture line, keys in the spec's order.

        Args:
            failure: the error category of the exception the call ended in, if it did
                (:func:`~capture_core.outcome.classify_exception`).
            objects: ``False`` keeps both bodies as raw text only: the fallback for bodies
                that parse but cannot be encoded again (JSON nested deeper than the encoder
                allows).
        """
        request_body = b"".join(self.request_chunks)
        response_body = self._response_body()
        request, request_object = _embedded(request_body, objects)
        response: Any = None
        response_object: dict[str, Any] | None = None
        terminal = self.terminal
        if self.decode_error is not None:
            pass  # the record keeps the bytes as they came; nothing to read them as
        elif self.streaming:
            rebuilt = (
                reassemble_events(self.dialect, self.events)
                if self.events is not None
                else reassemble_stream(self.dialect, response_body)
            )
            response = response_object = rebuilt.response if objects else None
            terminal = terminal or rebuilt.terminal
        else:
            response, response_object = _embedded(response_body, objects)
        # Read once: for the error category and for the line's facts.
        found = extract_response(self.dialect, response_object) if response_object else None
        line: dict[str, Any] = {
            "model_call_id": self.model_call_id,
            "dialect": self.dialect,
            "model_ref": self.model_ref,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "latency_ms": self.latency_ms,
            "latency_ttft_ms": self.ttft_ms,
            "status_code": self.status_code,
            "error_category": self._category(
                failure, terminal, response_object, response_body, found
            ),
            "request": request,
            "response": response,
        }
        if request_body and request_object is None:
            _raw(line, "request_raw", request_body)
        if response_body and (self.streaming or response_object is None):
            _raw(line, "response_raw", response_body)
            if self.decode_error is not None and self.content_encoding:
                line["response_content_encoding"] = self.content_encoding
        # Readers of our stores then read the call's row from this small object (issue 19).
        facts = line_facts(self.dialect, request_object, response_object, found=found)
        if facts is not None:
            line[FACTS_KEY] = facts
        return line

    def _category(
        self,
        failure: str | None,
        terminal: TerminalKind | None,
        response: dict[str, Any] | None,
        response_body: bytes,
        found: ResponseFacts | None = None,
    ) -> str | None:
        if self.client_disconnected:
            return ErrorCategory.CLIENT_DISCONNECTED.value
        if self.transport_error is not None:
            return self.transport_error
        if failure is not None:
            return failure
        if self.decode_error is not None and self.status_code is not None:
            by_status = classify_outcome(self.status_code, streaming=False, terminal=None,
                                         response=None, body_empty=True)  # fmt: skip
            return (by_status or ErrorCategory.CAPTURE_PARSE_ERROR).value
        outcome = classify_outcome(
            self.status_code,
            streaming=self.streaming,
            terminal=terminal,
            response=response,
            body_empty=not response_body,
            dialect=self.dialect,
            facts=found,
        )
        return outcome.value if outcome else None
