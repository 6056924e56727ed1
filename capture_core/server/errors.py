"""Error answers the capture server gives itself, shaped like the dialect the client speaks.

OpenAI-style clients (Responses, Chat Completions, and any other path) get
``{"error": {"message", "type", "param", "code"}}``; Anthropic Messages clients get
``{"type": "error", "error": {"type", "message"}}``, so each SDK raises its usual error type
with our message in it.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
from starlette.types import Send

from capture_core.dialects import dialect_for_path
from capture_core.server._asgi import send_whole

__all__ = ["error_body", "send_error"]

_OPENAI_TYPES: Final = {
    400: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    502: "upstream_unreachable",
    504: "upstream_timeout",
}
_ANTHROPIC_TYPES: Final = {
    400: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "request_too_large",
}
_CODES: Final = {
    400: "invalid_request_target",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
    502: "upstream_unreachable",
    504: "upstream_timeout",
}


def error_body(path: str | None, status: int, message: str) -> bytes:
    """The JSON error body for ``status`` in the shape of the dialect served at ``path``.

    Example:
        >>> error_body("/v1/messages", 413, "too large")
        b'{"type":"error","error":{"type":"request_too_large","message":"too large"}}'
    """
    dialect = dialect_for_path(path) if path else None
    if dialect is not None and dialect.name == "messages":
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        code = _CODES.get(status, "proxy_error")
        kind = _OPENAI_TYPES.get(status, code)
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return orjson.dumps(body)


async def send_error(
    send: Send,
    path: str | None,
    status: int,
    message: str,
    *,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer with :func:`error_body` as ``application/json``."""
    headers = [(b"content-type", b"application/json"), *(extra_headers or [])]
    await send_whole(send, status, headers, error_body(path, status, message))
