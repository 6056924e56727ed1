"""One captured call: copy what passes, hold the end until the line is durable, write it.

Per request: request and response bytes are copied as they pass; non-terminal chunks go to the
client at once, while the stream's terminal event and the final body message are held until
the capture line is durable (or its write failed). A compressed stream is decoded as it passes,
so its terminal event is recognised.

The call is marked pending (one ``pwrite`` into this server's slots file, on the event loop)
when it starts; when it is over its line is written (:mod:`capture_core.server.call_writes`).
A non-streamed answer's status line goes to the client while the line is made durable. If the
request is cancelled (server stopping) the write still lands.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import TYPE_CHECKING

from starlette.types import Message, Receive, Scope, Send

from capture_core.dialects import TerminalDetector
from capture_core.exceptions import RequestRefusedError
from capture_core.server._asgi import REFUSED_KEY
from capture_core.server.call_writes import CallWrites
from capture_core.server.decoding import BodyDecoder, DecodeError, decoder_for
from capture_core.server.errors import send_error
from capture_core.server.exchange import Exchange
from capture_core.server.logs import RateLimitedLogger
from capture_core.server.proxy import CLIENT_GONE_KEY, TRANSPORT_ERROR_KEY
from capture_core.server.training import MODEL_CALL_ID_KEY
from capture_core.store import CaptureStore

if TYPE_CHECKING:
    from capture_core.server.middleware import CaptureMiddleware

__all__ = ["CapturedCall", "new_call_id"]

logger = logging.getLogger(__name__)
limited = RateLimitedLogger(logger)


_prefix = os.urandom(8).hex()
_counter = itertools.count()


def new_call_id() -> str:
    """A new 32-hex call id: this process's random 64-bit prefix and a counter (unique across
    processes and restarts without a system call per id, as ``uuid4`` makes)."""
    return f"{_prefix}{next(_counter):016x}"


def _new_process() -> None:
    global _prefix, _counter
    _prefix, _counter = os.urandom(8).hex(), itertools.count()


os.register_at_fork(after_in_child=_new_process)


class CapturedCall(CallWrites):
    """Per-request state of one captured call (what it writes: :class:`CallWrites`)."""

    def __init__(
        self,
        owner: CaptureMiddleware,
        store: CaptureStore,
        scope: Scope,
        rollout_id: str,
        dialect: str,
    ) -> None:
        self.owner, self.store, self.scope = owner, store, scope
        self.rollout_id = rollout_id
        self.exchange = Exchange(
            model_call_id=new_call_id(),
            dialect=dialect,
            model_ref=owner.model_ref,
            started_at=time.time(),
        )
        # Issue 18 hook: the training gate gives the call's ledger row and token entry this id.
        scope[MODEL_CALL_ID_KEY] = self.exchange.model_call_id
        self.detector: TerminalDetector | None = None
        self.decoder: BodyDecoder | None = None
        self.keep_mark = False
        self.held: list[Message] = []
        self.lookahead: Message | None = None
        self.start: Message | None = None  # a non-streamed answer's status line, not yet sent
        self.holding = False
        self.started = False
        self.done = False
        self.t0 = time.perf_counter()

    async def serve(self, receive: Receive, send: Send) -> None:
        exchange = self.exchange

        async def copy_request() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                exchange.request_chunks.append(message.get("body", b""))
            elif message["type"] == "http.disconnect" and not self.done:
                exchange.client_disconnected = True
            return message

        async def copy_response(message: Message) -> None:
            if self._observe(message):
                self.held.append(message)
            elif message["type"] == "http.response.start" and not exchange.streaming:
                # It goes with the first body chunk sent, or, for a body of one chunk, once its
                # line is on its way to the appender: the status line then travels while the
                # line is made durable, instead of before the line is even built.
                self.start = message
            elif message["type"] == "http.response.body" and not exchange.streaming:
                # Keep the newest body chunk back: with a content-length the client is done as
                # soon as it has the last byte, so that byte must wait for the capture line.
                previous, self.lookahead = self.lookahead, message
                if previous is not None:
                    await self._send_start(send)
                    await send(previous)
            else:
                await send(message)

        # Pending from now until the line is durable, visible to other processes.
        self.owner.counters.add("writes_outstanding")
        self._mark()
        try:
            await self.owner.app(self.scope, copy_request, copy_response)
        except asyncio.CancelledError:
            self._finish()
            self.owner.detach(self._start_write(asyncio.CancelledError()))
            raise
        except RequestRefusedError:
            # A chunked body over the size limit: refused like any request the server answers
            # itself (by the app around us), so not recorded as a dialect call.
            self._unmark()
            self.owner.counters.add("writes_outstanding", -1)
            raise
        except Exception as exc:
            if self.started:
                await self._complete(exc, send)
                raise
            # Nothing reached the client yet: it gets a 500 from us, and the line says so.
            limited.exception("proxy-error", "error while serving %s", self.scope["path"])
            await send_error(copy_response, self.scope["path"], 500,
                             f"capture server error: {type(exc).__name__}")  # fmt: skip
            await self._complete(exc, send)
            return
        if REFUSED_KEY in self.scope.get("state", {}):
            # Its body did not parse: the protocol answered 400 and counted the refusal; a
            # request refused is no call, as one the app refuses is not.
            self._unmark()
            self.owner.counters.add("writes_outstanding", -1)
            return
        await self._complete(None, send)

    async def _complete(self, failure: BaseException | None, send: Send) -> None:
        self._finish()
        write = self._start_write(failure)
        self.owner.detach(write)
        try:
            await self._send_start(send)
        finally:
            await asyncio.shield(write)
        await self._release(send)

    def _observe(self, message: Message) -> bool:
        """Copy what a response message carries; True if it must be held back."""
        kind = message["type"]
        exchange = self.exchange
        if kind == "http.response.start":
            self.started = True
            exchange.status_code = message["status"]
            for name, value in message.get("headers", []):
                lower = name.lower()
                if lower == b"content-type":
                    exchange.streaming = value.lower().startswith(b"text/event-stream")
                elif lower == b"content-encoding":
                    exchange.content_encoding = value.decode("latin-1").strip().lower()
            if exchange.streaming:
                # It keeps the events it parses: the line is rebuilt from them.
                self.detector = TerminalDetector(exchange.dialect, keep_events=True)
                self._start_decoding()
            return False
        if kind != "http.response.body":
            return self.holding
        body: bytes = message.get("body", b"")
        if body:
            if exchange.ttft_ms is None:
                exchange.ttft_ms = round((time.perf_counter() - self.t0) * 1000, 2)
            exchange.response_chunks.append(body)
            text = self._decode(body) if self.decoder is not None else body
            if self.detector is not None and text:
                self.holding = self.detector.feed(text) is not None
        if not message.get("more_body", False):
            self.done = True
        return self.holding or not message.get("more_body", False)

    def _start_decoding(self) -> None:
        try:
            self.decoder = decoder_for(self.exchange.content_encoding)
        except DecodeError as exc:
            self.exchange.decode_error = str(exc)
            self.detector = None
            return
        if self.decoder is not None:
            self.exchange.decoded_chunks = []

    def _decode(self, body: bytes) -> bytes:
        if self.decoder is None:
            return body
        try:
            text = self.decoder.feed(body)
        except DecodeError as exc:
            self.exchange.decode_error = str(exc)
            self.exchange.decoded_chunks = None
            self.decoder = self.detector = None
            return b""
        assert self.exchange.decoded_chunks is not None
        self.exchange.decoded_chunks.append(text)
        return text

    def _finish(self) -> None:
        exchange = self.exchange
        exchange.latency_ms = round((time.perf_counter() - self.t0) * 1000, 2)
        exchange.completed_at = time.time()
        state = self.scope.get("state", {})
        exchange.transport_error = state.get(TRANSPORT_ERROR_KEY)
        if state.get(CLIENT_GONE_KEY) and not self.done:
            exchange.client_disconnected = True
        if self.decoder is not None and exchange.decoded_chunks is not None:
            try:
                tail = self.decoder.flush()
            except DecodeError as exc:
                if not (exchange.client_disconnected or exchange.transport_error):
                    exchange.decode_error = str(exc)  # a whole stream that does not decode
                    exchange.decoded_chunks = None
            else:
                exchange.decoded_chunks.append(tail)
                if self.detector is not None and tail:
                    self.detector.feed(tail)
        if self.detector is not None:
            exchange.terminal = self.detector.close()
            # Every byte of the body went through it: its events are the whole stream.
            if exchange.decode_error is None:
                exchange.events = self.detector.events

    async def _send_start(self, send: Send) -> None:
        if self.start is not None:
            start, self.start = self.start, None
            await send(start)

    async def _release(self, send: Send) -> None:
        await self._send_start(send)
        if self.lookahead is not None:
            await send(self.lookahead)
            self.lookahead = None
        for message in self.held:
            await send(message)
        self.held.clear()
