"""uvicorn's httptools protocol, with what a server at a trust boundary needs on top.

- The request target is kept as sent (``scope["ngcapture.target"]``): httptools would turn an
  absolute-form ``http://other-host/x`` into the path ``/x`` and the app could not refuse it.
- Header timeout: a connection must send a request's headers within ``header_timeout_s`` of
  opening or of the request's first byte (uvicorn has none: a client that connects and sends
  nothing, or headers a byte a minute, would hold a connection forever).
- Body idle timeout: a request whose body stalls for ``idle_timeout_s`` is closed; the app sees
  the client go.
- Requests the HTTP parser itself rejects get a JSON error body instead of plain text.

Timers are armed only when a read leaves a request unfinished, so the common small request
that arrives in one read costs nothing extra.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from capture_core.server.errors import error_body

__all__ = ["TARGET_KEY", "protocol_class"]

TARGET_KEY: Final = "ngcapture.target"


def _close_with(transport: asyncio.Transport, status: int, reason: bytes, body: bytes) -> None:
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % (status, reason, len(body))
    )
    if not transport.is_closing():
        transport.write(head + body)
    transport.close()


class CaptureHttpProtocol(HttpToolsProtocol):
    """See the module docstring; timeouts come from :func:`protocol_class`."""

    header_timeout_s: float = 60.0
    idle_timeout_s: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_headers = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_seen = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_headers = True  # nothing received yet: the headers are what we wait for
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._in_headers:
            self._arm_header_timer()
        elif self.cycle is not None and self.cycle.more_body and not self.cycle.response_complete:
            self._body_seen = self.loop.time()
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(self.idle_timeout_s, self._body_idle)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self.scope[TARGET_KEY] = self.url  # type: ignore[typeddict-unknown-key]
        if not self.url.startswith(b"/"):
            self.url = b"/"  # parseable; the app refuses the request by its real target
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def send_400_response(self, msg: str) -> None:
        self._cancel_timers()
        _close_with(self.transport, 400, b"Bad Request", error_body(None, 400, msg))

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_late)

    def _header_late(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing():
            message = f"request headers not received within {self.header_timeout_s:g} s"
            _close_with(self.transport, 408, b"Request Timeout", error_body(None, 408, message))

    def _body_idle(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        idle = self.loop.time() - self._body_seen
        if idle < self.idle_timeout_s:  # data came meanwhile: wait for the rest of the window
            self._body_timer = self.loop.call_later(self.idle_timeout_s - idle, self._body_idle)
            return
        self.transport.close()  # the app sees the client go

    def _cancel_timers(self) -> None:
        for name in ("_header_timer", "_body_timer"):
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)


def protocol_class(*, header_timeout_s: float, idle_timeout_s: float) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these timeouts."""
    return type(
        "CaptureHttpProtocol",
        (CaptureHttpProtocol,),
        {"header_timeout_s": header_timeout_s, "idle_timeout_s": idle_timeout_s},
    )
