"""uvicorn's httptools protocol, with what a server at a trust boundary needs on top.

- The request target is kept as sent (``scope["ngcapture.target"]``): httptools would turn an
  absolute-form ``http://other-host/x`` into the path ``/x`` and the app could not refuse it.
- Header timeout: a connection must send a request's headers within ``header_timeout_s`` of
  opening, of the request's first byte, or of bytes between requests that begin none (uvicorn
  has none, and stops its keep-alive timer on any byte: a client that sends one ``CRLF`` after
  a response, or headers a byte a minute, would hold a connection forever).
- Header size: a request head (request line and headers) over ``max_header_bytes`` gets a 431
  and the connection is closed, before httptools buffers it (it has no limit of its own).
- Body idle timeout: a request whose body stalls for ``idle_timeout_s`` is closed; the app sees
  the client go. Time while uvicorn itself does not read (a pipelined request waiting for the
  answer before it) does not count, for the header timeout either. The rest of a body the app
  answered before reading it all is still a body (not the next request's head: not counted
  against the head limit).
- Read timeout: a client that takes nothing of its answer for ``idle_timeout_s`` (the
  transport's buffer stays over its high-water mark and does not shrink) is dropped; the app
  sees the client go and the upstream request is cancelled (uvicorn would wait for it forever,
  holding an upstream connection and the worker's generation).
- Requests the HTTP parser itself rejects get a JSON error body instead of plain text; one
  rejected while its body was read is marked refused in its scope (``REFUSED_KEY``), so capture
  does not record it as a call the client abandoned.
- Every request answered here (400, 408, 431) counts in ``requests_refused``, and is logged
  at a bounded rate.

Timers are armed only when a read leaves a request unfinished, so the common small request
that arrives in one read costs nothing extra.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from capture_core.server._asgi import REFUSED_KEY
from capture_core.server.counters import CaptureCounters
from capture_core.server.errors import error_body
from capture_core.server.logs import RateLimitedLogger
from capture_core.server.settings import DEFAULT_MAX_HEADER_BYTES

__all__ = ["REFUSED_KEY", "TARGET_KEY", "protocol_class"]

TARGET_KEY: Final = "ngcapture.target"
_HEAD_END: Final = b"\r\n\r\n"

limited = RateLimitedLogger(logging.getLogger(__name__))


def _close_with(transport: asyncio.Transport, status: int, reason: bytes, body: bytes) -> None:
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % (status, reason, len(body))
    )
    if not transport.is_closing():
        transport.write(head + body)
    transport.close()


class CaptureHttpProtocol(HttpToolsProtocol):
    """See the module docstring; limits and counters come from :func:`protocol_class`."""

    header_timeout_s: float = 60.0
    idle_timeout_s: float = 60.0
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    counters: CaptureCounters | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_headers = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_seen = 0.0
        self._write_timer: asyncio.TimerHandle | None = None
        self._body_done = True  # no request body is being read (uvicorn's ``more_body`` stays
        # True when the app answered before the body ended: the rest still arrives)
        self._write_buffered = 0  # the transport's buffer when the read timer was armed
        self._head_bytes = 0  # of the request head being read
        self._head_tail = b""  # the last bytes of the previous read, when no head ended in it

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_headers = True  # nothing received yet: the headers are what we wait for
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if (self._in_headers or self._body_done) and self._head_too_large(data):
            return
        super().data_received(data)
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._in_headers:
            self._arm_header_timer()
        elif not self._body_done:  # a body, or the rest of one the app answered early
            self._body_seen = self.loop.time()
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(self.idle_timeout_s, self._body_idle)
        elif cycle is None or cycle.response_complete:
            # Bytes between requests that begin none (the CRLFs the parser skips): uvicorn
            # stopped its keep-alive timer on them, so the next request's headers are waited
            # for as any are.
            self._in_headers = True
            self._arm_header_timer()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_buffered = self.transport.get_write_buffer_size()
            self._write_timer = self.loop.call_later(self.idle_timeout_s, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _not_reading(self) -> None:
        self._write_timer = None
        buffered = self.transport.get_write_buffer_size()
        if buffered < self._write_buffered:  # it took some: a slow reader, not a dead one
            self._write_buffered = buffered
            self._write_timer = self.loop.call_later(self.idle_timeout_s, self._not_reading)
            return
        if not self.transport.is_closing():
            limited.warning("not-reading", "dropped %s: it read nothing of its answer for %g s",
                            self.client, self.idle_timeout_s)  # fmt: skip
        self.transport.abort()  # close() would wait for the buffer to drain: it never does

    def _head_too_large(self, data: bytes) -> bool:
        """Count ``data``'s bytes up to the end of the head being read (all of them when it
        does not end here); over the limit, answer 431 and close."""
        seen = self._head_tail + data  # the end may straddle two reads
        end = seen.find(_HEAD_END)
        if end < 0:
            self._head_bytes += len(data)
            self._head_tail = seen[-3:]
        else:
            self._head_bytes += max(0, end + len(_HEAD_END) - len(self._head_tail))
            self._head_tail = b""
        if self._head_bytes <= self.max_header_bytes:
            return False
        message = f"request line and headers larger than {self.max_header_bytes} bytes"
        self._refused(431, b"Request Header Fields Too Large", message)
        return True

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._body_done = False
        self._head_bytes, self._head_tail = 0, b""
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self.scope[TARGET_KEY] = self.url  # type: ignore[typeddict-unknown-key]
        if not self.url.startswith(b"/"):
            self.url = b"/"  # parseable; the app refuses the request by its real target
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._body_done = True
        super().on_message_complete()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def send_400_response(self, msg: str) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not cycle.response_complete:
            # Its body did not parse: the app reading it must see a refusal, not a client
            # that went away.
            cycle.scope.setdefault("state", {})[REFUSED_KEY] = msg
        self._refused(400, b"Bad Request", msg)

    def _refused(self, status: int, reason: bytes, message: str) -> None:
        # The read timeout stays: a client that reads nothing would keep the answer (and so
        # the connection) waiting to be flushed forever.
        self._cancel_timers("_header_timer", "_body_timer")
        if self.counters is not None:
            self.counters.add("requests_refused")
        limited.warning("refused-http", "refused a request from %s: %s", self.client, message)
        _close_with(self.transport, status, reason, error_body(None, status, message))

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_late)

    def _header_late(self) -> None:
        self._header_timer = None
        if self.flow.read_paused:  # we stopped reading (a pipelined request waits its turn)
            self._arm_header_timer()
            return
        if self._in_headers and not self.transport.is_closing():
            message = f"request headers not received within {self.header_timeout_s:g} s"
            self._refused(408, b"Request Timeout", message)

    def _body_idle(self) -> None:
        self._body_timer = None
        if self._body_done or self.transport.is_closing():
            return
        if self.flow.read_paused:
            # uvicorn stopped reading (a pipelined request waits for the answer before it):
            # the silence is ours, not the client's; its window starts again from here.
            self._body_seen = self.loop.time()
        idle = self.loop.time() - self._body_seen
        if idle < self.idle_timeout_s:  # data came meanwhile: wait for the rest of the window
            self._body_timer = self.loop.call_later(self.idle_timeout_s - idle, self._body_idle)
            return
        self.transport.close()  # the app sees the client go

    def _cancel_timers(self, *names: str) -> None:
        for name in names or ("_header_timer", "_body_timer", "_write_timer"):
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)


def protocol_class(
    *,
    header_timeout_s: float,
    idle_timeout_s: float,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    counters: CaptureCounters | None = None,
) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these limits, counting the
    requests it answers itself in ``counters``."""
    return type(
        "CaptureHttpProtocol",
        (CaptureHttpProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "idle_timeout_s": idle_timeout_s,
            "max_header_bytes": max_header_bytes,
            "counters": counters,
        },
    )
