"""Turn the bytes of one finished exchange into its raw capture line (runs off the event loop).

Parsing follows the capture rules: a request or response body is kept as an object only when
it parses to a JSON object, otherwise as raw text; a stream is reassembled and also kept raw;
gzip/deflate bodies are decoded for capture only (the client got the bytes unchanged).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from capture_core.dialects import TerminalKind, reassemble_stream
from capture_core.outcome import classify_exception, classify_outcome, classify_status

__all__ = ["Exchange"]


def _decoded(body: bytes, encoding: str | None) -> bytes:
    if not body or encoding in (None, "", "identity"):
        return body
    try:
        if encoding == "gzip":
            return zlib.decompress(body, 16 + zlib.MAX_WBITS)
        if encoding == "deflate":
            return zlib.decompress(body)
    except zlib.error:
        return body
    return body  # an encoding we cannot decode: kept raw, reported as a parse error


def _json_object(body: bytes) -> dict[str, Any] | None:
    if not body:
        return None
    try:
        value = orjson.loads(body)
    except (orjson.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _exception_status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries, read defensively (a lazy property may raise)."""
    for path in (("status",), ("status_code",), ("response", "status_code")):
        value: object = exc
        try:
            for name in path:
                value = getattr(value, name)
        except Exception:  # any error from a property means the value is missing
            continue
        if type(value) is int:
            return value
    return None


@dataclass
class Exchange:
    """Everything observed about one captured call, filled in while it is served."""

    model_call_id: str
    dialect: str
    model_ref: dict[str, str] | None
    started_at: float
    request_chunks: list[bytes] = field(default_factory=list)
    response_chunks: list[bytes] = field(default_factory=list)
    status_code: int | None = None
    streaming: bool = False
    content_encoding: str | None = None
    terminal: TerminalKind | None = None
    transport_error: str | None = None
    completed_at: float | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None

    def line(self, failure: BaseException | None = None, *, objects: bool = True) -> dict[str, Any]:
        """The raw capture line, keys in the spec's order.

        ``objects=False`` keeps both bodies as raw text only: the fallback for bodies that
        parse but cannot be encoded again (JSON nested deeper than the encoder allows).
        """
        request_body = b"".join(self.request_chunks)
        response_body = _decoded(b"".join(self.response_chunks), self.content_encoding)
        request = _json_object(request_body) if objects else None
        response: dict[str, Any] | None = None
        status = self.status_code
        if failure is not None:
            status = status if status is not None else _exception_status(failure)
            by_status = classify_status(status)
            category: str | None = (
                by_status.value if by_status else classify_exception(failure).value
            )
            if self.transport_error is not None:
                category = self.transport_error
        else:
            if self.streaming:
                rebuilt = reassemble_stream(self.dialect, response_body)
                response = rebuilt.response if objects else None
                terminal = self.terminal or rebuilt.terminal
            else:
                response = _json_object(response_body) if objects else None
                terminal = None
            outcome = classify_outcome(
                status,
                streaming=self.streaming,
                terminal=terminal,
                response=response,
                body_empty=not response_body,
                dialect=self.dialect,
            )
            category = self.transport_error or (outcome.value if outcome else None)
        line: dict[str, Any] = {
            "model_call_id": self.model_call_id,
            "dialect": self.dialect,
            "model_ref": self.model_ref,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "latency_ms": self.latency_ms,
            "latency_ttft_ms": self.ttft_ms,
            "status_code": status,
            "error_category": category,
            "request": request,
            "response": response,
        }
        if request_body and request is None:
            line["request_raw"] = request_body.decode("utf-8", "replace")
        if response_body and (self.streaming or response is None):
            line["response_raw"] = response_body.decode("utf-8", "replace")
        return line
