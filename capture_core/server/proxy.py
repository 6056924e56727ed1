"""The upstream proxy: forward a request to the inference worker and stream its answer back.

Bytes pass through unchanged (``aiter_raw``: no decompression, no re-encoding), headers too,
except hop-by-hop ones. When the worker cannot be reached the client gets a 502 (504 on a
timeout) with an error body in the dialect's shape; when the worker drops a stream midway the
client's connection is dropped too, as it would have been without the proxy. Either way the
transport failure is noted in ``scope["state"]`` so capture can classify it.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, Final

import anyio
import httpx
import orjson
from starlette.types import Receive, Scope, Send

from capture_core.dialects import dialect_for_path
from capture_core.records import ErrorCategory
from capture_core.server._asgi import read_body, send_whole
from capture_core.server.settings import CaptureSettings

__all__ = ["TRANSPORT_ERROR_KEY", "UpstreamProxy"]

logger = logging.getLogger(__name__)

TRANSPORT_ERROR_KEY: Final = "ngcapture.transport_error"
_HOP_BY_HOP: Final = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
        b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"host",
    }
)  # fmt: skip


def _error_body(path: str, status: int, message: str) -> bytes:
    dialect = dialect_for_path(path)
    kind = "upstream_timeout" if status == 504 else "upstream_unreachable"
    if dialect is not None and dialect.name == "messages":
        body: dict[str, Any] = {"type": "error", "error": {"type": "api_error", "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": kind}}
    return orjson.dumps(body)


def _note(scope: Scope, category: ErrorCategory) -> None:
    scope.setdefault("state", {})[TRANSPORT_ERROR_KEY] = category.value


class UpstreamProxy:
    """ASGI app forwarding every request to the worker named by the settings.

    Call :meth:`aclose` at shutdown to close the pooled connections.
    """

    def __init__(self, settings: CaptureSettings) -> None:
        self._settings = settings
        # TCP_NODELAY: a request written in two parts must not wait for a delayed ACK.
        transport = httpx.AsyncHTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            limits=httpx.Limits(
                max_connections=settings.max_connections,
                max_keepalive_connections=settings.max_connections,
            ),
        )
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(
                connect=settings.connect_timeout_s,
                read=settings.read_timeout_s,
                write=settings.write_timeout_s,
                pool=settings.connect_timeout_s,
            ),
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if body is None:
            return  # the client left before sending its request
        path: str = scope["path"]
        dialect = dialect_for_path(path)
        raw_path: bytes = scope.get("raw_path") or path.encode()
        url = self._settings.upstream_for(dialect.name if dialect else None) + raw_path.decode(
            "latin-1"
        )
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
        request = self._client.build_request(scope["method"], url, headers=headers, content=body)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            _note(scope, ErrorCategory.TIMEOUT)
            await _send_error(send, path, 504, f"upstream timed out: {type(exc).__name__}")
            return
        except httpx.TransportError as exc:
            _note(scope, ErrorCategory.CONNECTION)
            await _send_error(send, path, 502, f"upstream unreachable: {type(exc).__name__}")
            return
        try:
            await self._relay(scope, receive, send, response)
        finally:
            await response.aclose()

    async def _relay(
        self, scope: Scope, receive: Receive, send: Send, response: httpx.Response
    ) -> None:
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP]
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": headers})  # fmt: skip
        disconnected = False

        async def watch_disconnect(cancel: anyio.CancelScope) -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            cancel.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(watch_disconnect, group.cancel_scope)
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.TransportError:
                _note(scope, ErrorCategory.CONNECTION)
                logger.warning("upstream dropped the response to %s midway", scope["path"])
                raise
            group.cancel_scope.cancel()
        if not disconnected:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _send_error(send: Send, path: str, status: int, message: str) -> None:
    body = _error_body(path, status, message)
    await send_whole(send, status, [(b"content-type", b"application/json")], body)
