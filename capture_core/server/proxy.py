"""The upstream proxy: forward a request to the configured upstream origin, relay its answer.

Where a request goes is fixed by the settings: scheme, host and port come from the upstream
URL, the path from the (already normalised) request path, so no request can steer the proxy to
another host. Only the headers the client sent are forwarded (minus hop-by-hop ones; ``host``
and ``content-length`` are set for the upstream); the client library adds none of its own. Bytes
pass through unchanged both ways (no decompression); a ``Location`` that names the upstream is
rewritten to the proxy's own prefixed path, and one that names another host is refused (502), as
is an answer the client's HTTP/1.1 could not carry (a status outside 200-599, a header name or
value that is not valid HTTP): the client never gets a dropped connection instead.

When the worker cannot be reached the client gets a 502 (504 on a timeout) with an error body in
the dialect's shape; when the worker drops a stream midway the client's connection is dropped
too. When the client goes away, before or after the response headers, the upstream request is
cancelled with it, so the worker stops generating. Transport failures and the client leaving are
noted in ``scope["state"]`` for capture to classify.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
from multidict import CIMultiDict
from starlette.types import Message, Receive, Scope, Send
from yarl import URL

from capture_core.dialects import dialect_for_path
from capture_core.records import ErrorCategory
from capture_core.server._asgi import read_body
from capture_core.server.errors import send_error
from capture_core.server.settings import CaptureSettings

__all__ = ["CLIENT_GONE_KEY", "PREFIX_KEY", "TRANSPORT_ERROR_KEY", "UpstreamProxy"]

logger = logging.getLogger(__name__)

TRANSPORT_ERROR_KEY: Final = "ngcapture.transport_error"
CLIENT_GONE_KEY: Final = "ngcapture.client_gone"
PREFIX_KEY: Final = "ngcapture.prefix"
"""Scope key: the ``/ng-rollout/<id>`` prefix the middleware stripped (bytes), if any."""

# Hop-by-hop headers (RFC 9110 §7.6.1), plus host and content-length, which are set for the
# upstream's own request rather than copied, and expect: the client's ``100-continue`` was
# answered here (the body is read whole before it is forwarded), and an upstream asked again
# may wait for a body that is never sent, beyond the read timeout.
_NOT_COPIED: Final = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host",
        "content-length", "expect",
    }
)  # fmt: skip
_NOT_COPIED_BYTES: Final = frozenset(name.encode() for name in _NOT_COPIED)
# The client library adds these unless told not to; we forward only what the client sent.
_NO_AUTO_HEADERS: Final = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
_REWRITTEN: Final = frozenset({b"location", b"content-location"})
# Both match in linear time (an upstream's header value is read on the event loop).
_LINK_URI: Final = re.compile(rb"<([^<>]*)>")
_REFRESH_HEAD: Final = re.compile(rb"[ \t]*[\d.]*[ \t]*[;,]?[ \t]*(?:url[ \t]*=[ \t]*)?", re.I)
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# RFC 9110 §5.1 and §5.5: what a header name and value may hold (uvicorn refuses the rest).
_HEADER_NAME: Final = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_HEADER_VALUE_BAD: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# How a browser reads a Location (WHATWG URL): tabs and newlines dropped, '\' as '/'.
_URL_NOISE: Final = str.maketrans({"\\": "/", "\t": None, "\n": None, "\r": None})


class AnswerRefusedError(Exception):
    """The upstream's answer cannot be passed on: a ``Location`` on another host, or a status
    or header the client's connection cannot carry."""


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where one upstream lives: the only place requests for it are sent."""

    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> _Origin:
        parts = urlsplit(url)
        scheme = parts.scheme
        port = parts.port or _DEFAULT_PORTS[scheme]
        return cls(scheme, parts.hostname or "", port, parts.path.rstrip("/"))

    def url(self, raw_path: bytes, query: bytes) -> URL:
        return URL.build(
            scheme=self.scheme,
            host=self.host,
            port=self.port,
            path=self.base_path + raw_path.decode("ascii"),
            query_string=query.decode("latin-1"),
            encoded=True,
        )

    def owns(self, location: str) -> bool:
        parts = urlsplit(location)
        try:
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme or self.scheme)
        except ValueError:
            return False
        return (parts.hostname or "").lower() == self.host.lower() and port == self.port


def _note(scope: Scope, category: ErrorCategory) -> None:
    scope.setdefault("state", {})[TRANSPORT_ERROR_KEY] = category.value


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Header names listed in ``Connection``: hop-by-hop too (RFC 9110 §7.6.1)."""
    tokens: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return frozenset(tokens)


class _DisconnectWatch:
    """Cancels the current task when the client disconnects (until :meth:`stop`)."""

    def __init__(self, receive: Receive) -> None:
        self.fired = False
        self._stopped = False
        self._task = asyncio.current_task()
        self._waiter = asyncio.ensure_future(self._wait(receive))

    async def _wait(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self._stopped and self._task is not None:
            self.fired = True
            self._task.cancel()

    def stop(self) -> None:
        self._stopped = True
        self._waiter.cancel()


class UpstreamProxy:
    """ASGI app forwarding every request to the upstream origin named by the settings.

    Call :meth:`aclose` at shutdown to close the pooled connections.
    """

    def __init__(self, settings: CaptureSettings) -> None:
        self._settings = settings
        self._origins = {
            dialect: _Origin.parse(settings.upstream_for(dialect))
            for dialect in (None, "responses", "chat", "messages")
        }
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # made in the running loop, on first use
            settings = self._settings
            connector = aiohttp.TCPConnector(
                limit=settings.max_connections,
                limit_per_host=0,
                keepalive_timeout=settings.upstream_keepalive_s,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                # Never keep cookies: one client's cookies must not go out with another's call.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=_NO_AUTO_HEADERS,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=settings.connect_timeout_s,
                    sock_read=settings.read_timeout_s,
                ),
                trust_env=False,
                requote_redirect_url=False,
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if body is None:
            scope.setdefault("state", {})[CLIENT_GONE_KEY] = True
            return  # the client left before sending its request
        path: str = scope["path"]
        dialect = dialect_for_path(path)
        origin = self._origins[dialect.name if dialect else None]
        url = origin.url(scope["raw_path"], scope.get("query_string") or b"")
        sent = scope["headers"]
        dropped = _NOT_COPIED_BYTES | _connection_tokens(sent)
        headers = CIMultiDict(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in sent if k not in dropped
        )
        has_body = bool(body) or any(
            k in (b"content-length", b"transfer-encoding") for k, _ in sent
        )
        watch = _DisconnectWatch(receive)
        response: aiohttp.ClientResponse | None = None
        finished = False
        try:
            try:
                response = await self._client().request(
                    scope["method"], url, headers=headers, data=body if has_body else None,
                    allow_redirects=False,
                )  # fmt: skip
            except TimeoutError as exc:
                _note(scope, ErrorCategory.TIMEOUT)
                watch.stop()
                await send_error(send, path, 504, f"upstream timed out: {type(exc).__name__}")
                return
            except aiohttp.ClientError as exc:
                _note(scope, ErrorCategory.CONNECTION)
                watch.stop()
                await send_error(send, path, 502, f"upstream unreachable: {type(exc).__name__}")
                return
            finished = await self._relay(scope, send, response, origin, watch)
        except asyncio.CancelledError:
            if not watch.fired:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            scope.setdefault("state", {})[CLIENT_GONE_KEY] = True
        finally:
            watch.stop()
            if response is not None:
                if finished:
                    response.release()
                else:  # drop the connection: the worker sees its client go
                    response.close()

    async def _relay(
        self,
        scope: Scope,
        send: Send,
        response: aiohttp.ClientResponse,
        origin: _Origin,
        watch: _DisconnectWatch,
    ) -> bool:
        """Relay status, headers and body; True when the whole body was relayed."""
        try:
            if not 200 <= response.status <= 599:
                raise AnswerRefusedError(f"upstream answered with status {response.status}")
            headers = self._response_headers(scope, response, origin)
        except AnswerRefusedError as exc:
            watch.stop()
            _note(scope, ErrorCategory.UPSTREAM_ERROR)
            await send_error(send, scope["path"], 502, str(exc))
            return False
        start: Message = {"type": "http.response.start", "status": response.status,
                          "headers": headers}  # fmt: skip
        await send(start)
        content = response.content
        try:
            async for chunk in content.iter_any():
                last = content.at_eof()
                if last:
                    watch.stop()
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return True
        except TimeoutError:
            _note(scope, ErrorCategory.TIMEOUT)
            logger.warning("upstream stalled in the response to %s", scope["path"])
            raise
        except aiohttp.ClientError:
            _note(scope, ErrorCategory.CONNECTION)
            logger.warning("upstream dropped the response to %s midway", scope["path"])
            raise
        watch.stop()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    def _response_headers(
        self, scope: Scope, response: aiohttp.ClientResponse, origin: _Origin
    ) -> list[tuple[bytes, bytes]]:
        raw: Any = response.raw_headers
        dropped = (_NOT_COPIED_BYTES - {b"content-length"}) | _connection_tokens(
            [(k.lower(), v) for k, v in raw]
        )
        headers: list[tuple[bytes, bytes]] = []
        for name, value in raw:
            lower = name.lower()
            if lower in dropped:
                continue
            if not _HEADER_NAME.match(lower) or _HEADER_VALUE_BAD.search(value):
                raise AnswerRefusedError("upstream answered with a header that is not valid HTTP")
            if lower in _REWRITTEN:
                headers.append(
                    (lower, _rewrite_location(value, origin, scope.get(PREFIX_KEY, b"")))
                )
            elif lower == b"refresh":  # a redirect after a delay: as a Location
                headers.append((lower, _rewrite_refresh(value, origin, scope.get(PREFIX_KEY, b""))))
            elif lower == b"link":  # links to the upstream point at the proxy instead
                headers.append((lower, _rewrite_links(value, origin, scope.get(PREFIX_KEY, b""))))
            else:
                headers.append((lower, value))
        return headers


def _rewrite_location(value: bytes, origin: _Origin, prefix: bytes) -> bytes:
    """Point a ``Location`` that names the upstream at the proxy's own prefixed path.

    Raises:
        AnswerRefusedError: it names another host (read as a browser would: ``\\host`` too).
    """
    text = value.decode("latin-1").strip().translate(_URL_NOISE)
    try:
        parts = urlsplit(text)
        elsewhere = bool(parts.scheme or parts.netloc or text.startswith("//"))
        if elsewhere and not origin.owns(text):
            raise AnswerRefusedError(
                "upstream redirected to another host; the redirect was refused"
            )
    except ValueError:  # ``http://[::1/x``: not a URL a client could follow either
        raise AnswerRefusedError("upstream redirected to something that is not a URL") from None
    if elsewhere:
        text = parts.path or "/"
        if parts.query:
            text += "?" + parts.query
    elif not text.startswith("/"):
        return value  # relative to the request's own (prefixed) URL: already right
    if origin.base_path and (text == origin.base_path or text.startswith(origin.base_path + "/")):
        text = text[len(origin.base_path) :] or "/"
    return prefix + text.encode("latin-1")


def _rewrite_refresh(value: bytes, origin: _Origin, prefix: bytes) -> bytes:
    """A ``Refresh: <seconds>; url=<URL>`` (or ``<seconds> <URL>``, as browsers read it) with
    its URL read as a ``Location``.

    Raises:
        AnswerRefusedError: the URL names another host, or is not a URL.
    """
    head = _REFRESH_HEAD.match(value)
    start = head.end() if head is not None else 0
    rest = value[start:]
    quote = rest[:1] if rest[:1] in (b"'", b'"') else b""
    url, tail = rest[len(quote) :], b""
    if quote and (end := url.find(quote)) >= 0:
        url, tail = url[:end], url[end:]
    if not url.strip():
        return value  # a delay alone: the same page again
    return value[:start] + quote + _rewrite_location(url, origin, prefix) + tail


def _rewrite_links(value: bytes, origin: _Origin, prefix: bytes) -> bytes:
    """A ``Link`` header with each target on the upstream pointed at the proxy; a target on
    another host is a link, not a redirect, and is left as it is."""

    def rewrite(found: re.Match[bytes]) -> bytes:
        try:
            return b"<" + _rewrite_location(found[1], origin, prefix) + b">"
        except AnswerRefusedError:
            return found[0]

    return _LINK_URI.sub(rewrite, value)
