"""What the capture server refuses before routing: bad targets, methods, upgrades, huge bodies.

:func:`screen` runs first on every HTTP request. It answers (by raising
:class:`~capture_core.exceptions.RequestRefusedError`) what must never be forwarded, and returns
the normalised target everything after it routes and forwards by.
"""

from __future__ import annotations

from typing import Final

from starlette.types import Message, Receive, Scope

from capture_core.exceptions import RequestRefusedError
from capture_core.server.protocol import TARGET_KEY
from capture_core.server.target import Target, normalize_target

__all__ = ["FORWARDED_METHODS", "limit_body", "path_hint", "screen"]

#: Methods that are forwarded; others (CONNECT, TRACE, anything unknown) are refused with 405.
FORWARDED_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def path_hint(scope: Scope) -> str | None:
    """The path a refused request seems to aim at, only to shape its error body."""
    target: bytes = scope.get(TARGET_KEY) or scope.get("raw_path") or b""
    slash = target.find(b"/", 1 if target.startswith(b"/") else 0)
    if not target.startswith(b"/"):
        target = target[slash:] if slash >= 0 else b""
    path = target.partition(b"?")[0].decode("latin-1")
    rest = path.split("/ng-rollout/", 1)[-1]
    return "/" + rest.split("/", 1)[1] if "/ng-rollout/" in path and "/" in rest else path


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            if not value.isdigit():
                raise RequestRefusedError(400, "content-length is not a number")
            return int(value)
    return None


def screen(scope: Scope, *, max_body_bytes: int) -> Target:
    """Check an HTTP request before anything else sees it; return its normalised target.

    Raises:
        RequestRefusedError: 400 for a target that is not an origin-form path (or would change
            where it goes when normalised) or an upgrade request, 405 for a method that is not
            forwarded, 413 for a declared body over ``max_body_bytes``.
    """
    target = scope.get(TARGET_KEY)
    if target is None:  # not served by our protocol: rebuild it from what the server parsed
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
    normalized = normalize_target(target)
    if scope["method"] not in FORWARDED_METHODS:
        raise RequestRefusedError(405, f"method {scope['method']} is not forwarded")
    for name, value in scope["headers"]:
        if name == b"upgrade" or (
            name == b"connection"
            and b"upgrade" in (token.strip() for token in value.lower().split(b","))
        ):
            raise RequestRefusedError(400, "protocol upgrades are not supported")
    length = _content_length(scope)
    if length is not None and length > max_body_bytes:
        raise RequestRefusedError(
            413, f"request body of {length} bytes is over the limit of {max_body_bytes} bytes"
        )
    return normalized


def limit_body(receive: Receive, max_body_bytes: int) -> Receive:
    """A ``receive`` that refuses (413) a body growing past ``max_body_bytes`` (chunked bodies:
    a declared length was checked by :func:`screen`)."""
    seen = 0

    async def limited() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > max_body_bytes:
                raise RequestRefusedError(
                    413, f"request body is over the limit of {max_body_bytes} bytes"
                )
        return message

    return limited
