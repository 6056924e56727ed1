"""The client's answer: the worker's JSON served as JSON or buffered SSE, or a failure."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import Send

from capture_core.server._asgi import send_whole
from capture_core.server.buffered_sse import (
    chat_events,
    messages_events,
    responses_events,
    responses_failure_events,
)
from capture_core.server.training.call import _Call, _Upstream


def _serialize(call: _Call, payload: dict[str, Any]) -> tuple[bytes, list[bytes]]:
    if not call.client_stream:
        return b"application/json", [orjson.dumps(payload)]
    if call.dialect == "chat":
        return b"text/event-stream", chat_events(payload, include_usage=call.include_usage)
    if call.dialect == "messages":
        return b"text/event-stream", messages_events(payload)
    return b"text/event-stream", responses_events(payload)


async def _send_failure(call: _Call, message: str, send: Send) -> None:
    if call.client_stream and call.dialect == "responses":
        model = call.body.get("model")
        events = responses_failure_events(message, model=model if isinstance(model, str) else None)
        await _send(send, 200, [(b"content-type", b"text/event-stream")], b"".join(events))
        return
    error: dict[str, Any] = {"error": {"message": message, "type": "server_error",
                                       "param": None, "code": "server_error"}}  # fmt: skip
    if call.dialect == "messages":
        error = {"type": "error", "error": {"type": "api_error", "message": message}}
    await _send(send, 500, [(b"content-type", b"application/json")], orjson.dumps(error))


def _json_object(upstream: _Upstream) -> dict[str, Any] | None:
    if upstream.status != 200:
        return None
    try:
        payload = orjson.loads(upstream.body)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None


def _passed_headers(upstream: _Upstream) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in upstream.headers if k.lower() != b"content-length"]


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    if any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers):
        headers = [*headers, (b"cache-control", b"no-cache")]
    await send_whole(send, status, headers, body)
