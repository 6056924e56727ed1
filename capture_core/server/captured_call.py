"""One captured call: copy what passes, hold the end until the line is durable, write it.

Per request: request and response bytes are copied as they pass; non-terminal chunks go to the
client at once, while the stream's terminal event and the final body message are held until
the capture line is durable (or its write failed). A compressed stream is decoded as it passes,
so its terminal event is recognised.

The call is marked pending (one ``pwrite`` into this server's slots file, on the event loop)
when it starts. When the call is over its line is built on the event loop and sent to the
server's appender process (:mod:`capture_core.appender`), which appends it, makes it durable
and answers; a middleware without an appender builds and appends it in one hand-off to a writer
thread instead, and calls over :data:`LARGE_LINE_BYTES` go to a worker process (building their
line would hold the GIL for a fifth of a second). The write's future clears the mark and
counts the outcome, on the loop only. If the request is cancelled (server stopping) the write
still lands. When the line cannot be written, the failure goes to the process's failure log
(opened at start-up, so it needs no new descriptor) and the rollout is marked incomplete.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.types import Message, Receive, Scope, Send

from capture_core._locking import os_reason
from capture_core.dialects import TerminalDetector
from capture_core.exceptions import CaptureError, CaptureStoreError, RequestRefusedError
from capture_core.facts_journal import journal_fields
from capture_core.outcome import classify_exception
from capture_core.pending import mark_pending, unmark_pending
from capture_core.records import CaptureFailure
from capture_core.server.decoding import BodyDecoder, DecodeError, decoder_for
from capture_core.server.errors import send_error
from capture_core.server.exchange import Exchange
from capture_core.server.large_lines import LARGE_LINE_BYTES, append_exchange, encode_exchange
from capture_core.server.logs import RateLimitedLogger
from capture_core.server.proxy import CLIENT_GONE_KEY, TRANSPORT_ERROR_KEY
from capture_core.server.training import MODEL_CALL_ID_KEY
from capture_core.store import DATA_SUFFIX, CaptureStore
from capture_core.writers import out_of_descriptors

if TYPE_CHECKING:
    from capture_core.appender import Appender
    from capture_core.server.middleware import CaptureMiddleware

__all__ = ["CapturedCall", "new_call_id"]

logger = logging.getLogger(__name__)
limited = RateLimitedLogger(logger)

T = TypeVar("T")

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


class CapturedCall:
    """Per-request state of one captured call."""

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

    def _mark(self) -> None:
        writer = self.owner.writer
        if writer is not None:
            if not writer.mark(self.rollout_id, self.exchange.model_call_id):
                self.owner.counters.add("marker_failures")
            return
        call_id = self.exchange.model_call_id
        _guard(lambda: mark_pending(self.store.root, self.rollout_id, call_id), "mark it pending")

    def _start_write(self, failure: BaseException | None) -> asyncio.Future[int | None]:
        appender = self.owner.appender
        write: asyncio.Future[int | None]
        if appender is not None and self.exchange.size < LARGE_LINE_BYTES:
            write = self._send(appender, failure)
        else:
            write = self._in_thread(self._write, failure)
        write.add_done_callback(self._count)
        return write

    def _in_thread(self, action: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        threads = self.owner.executor
        if threads is not None:
            return threads.run(action, *args)
        return asyncio.get_running_loop().run_in_executor(None, action, *args)

    def _send(
        self, appender: Appender, failure: BaseException | None
    ) -> asyncio.Future[int | None]:
        """Build the line and hand it to the appender now (on its socket when this returns);
        the future gets the bytes written, or ``None`` when it failed (logged and recorded, on
        a writer thread)."""
        category = classify_exception(failure).value if failure is not None else None
        exchange = self.exchange
        try:
            name, payload, line = encode_exchange(self.store, self.rollout_id, exchange, category)
            sent: asyncio.Future[int] = appender.submit(name, payload, _journal_fields(line))
        except Exception as exc:
            return asyncio.ensure_future(self._answered(None, exc))
        return asyncio.ensure_future(self._answered(sent, None))

    async def _answered(
        self, sent: asyncio.Future[int] | None, error: Exception | None
    ) -> int | None:
        """The appender's answer, or the failure recorded (never raises)."""
        try:
            if sent is not None:
                return await sent
        except Exception as exc:
            error = exc
        assert error is not None  # either an answer or an error
        try:
            recorded = await self._in_thread(self._failed, error)
        except RuntimeError:  # the server's threads are gone (it is stopping): here, then
            recorded = self._failed(error)
        self.keep_mark = not recorded
        return None

    def _count(self, write: asyncio.Future[int | None]) -> None:
        """Count the write's outcome and clear the call's mark, on the event loop: counters and
        marks are only touched there, so the loop never waits for a lock a writer thread holds
        while it waits for the GIL."""
        counters = self.owner.counters
        written = None if write.cancelled() or write.exception() else write.result()
        if written is None:
            counters.bump(capture_failures=1, writes_outstanding=-1)
        else:
            counters.bump(calls_captured=1, bytes_written=written, writes_outstanding=-1)
        if not self.keep_mark:
            self._unmark()

    async def _send_start(self, send: Send) -> None:
        if self.start is not None:
            start, self.start = self.start, None
            await send(start)

    def _write(self, failure: BaseException | None) -> int | None:
        """Build and append the line (writer thread); the bytes written, or ``None`` when it
        failed (the failure is logged and recorded). Never raises."""
        category = classify_exception(failure).value if failure is not None else None
        large = self.owner.large_lines
        try:
            if large is not None and self.exchange.size >= LARGE_LINE_BYTES:
                # Parsing and encoding tens of MiB holds the GIL for a fifth of a second:
                # done in another process, so the other calls do not wait for it (which
                # parses the stream again rather than receive its events pickled).
                self.exchange.events = None
                written = large.write(self.store, self.rollout_id, self.exchange, category)
            else:
                written = self._append(self.exchange, category)
        except Exception as exc:
            # When nothing else on disk can say this call was lost, its mark stays to say so.
            self.keep_mark = not self._failed(exc)
            return None
        return written

    def _append(self, exchange: Exchange, category: str | None) -> int:
        writer = self.owner.writer
        try:
            appended, line = append_exchange(self.store, self.rollout_id, exchange, category)
        except CaptureStoreError as exc:
            if writer is None or not out_of_descriptors(exc):
                raise
            # Out of descriptors: free the spare one and try once more.
            appended, line = writer.with_spare_descriptor(
                lambda: append_exchange(self.store, self.rollout_id, exchange, category)
            )
        if writer is not None:
            writer.note_facts(f"{self.rollout_id}{DATA_SUFFIX}", appended, line)
        return appended.written

    def _failed(self, exc: Exception) -> bool:
        """Log and record a failed write; whether it is on disk (the failure log, or at least
        the rollout's incomplete marker)."""
        exchange, writer = self.exchange, self.owner.writer
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        reason = os_reason(cause) if isinstance(cause, OSError) else str(exc)
        limited.warning("capture-failed", "capture of call %s in rollout %s failed: %s",
                        exchange.model_call_id, self.rollout_id, reason)  # fmt: skip
        logged = False
        if writer is not None:
            failure = CaptureFailure(
                rollout_id=self.rollout_id, model_call_id=exchange.model_call_id,
                dialect=exchange.dialect, started_at=exchange.started_at, failed_at=time.time(),
                reason=reason, writer=writer.token,
            )  # fmt: skip
            logged = _guard(lambda: writer.record_failure(failure), "log the capture failure")
        marked = _guard(lambda: self.store.mark_incomplete(self.rollout_id), "mark it incomplete")
        return logged or marked

    def _unmark(self) -> None:
        writer, call_id = self.owner.writer, self.exchange.model_call_id
        if writer is not None:
            _guard(lambda: writer.unmark(self.rollout_id, call_id), "clear its marker")
        else:
            _guard(lambda: unmark_pending(self.store.root, self.rollout_id, call_id),
                   "clear its marker")  # fmt: skip

    async def _release(self, send: Send) -> None:
        await self._send_start(send)
        if self.lookahead is not None:
            await send(self.lookahead)
            self.lookahead = None
        for message in self.held:
            await send(message)
        self.held.clear()


def _journal_fields(line: dict[str, Any]) -> bytes:
    """What the line's facts journal entry repeats of it (empty: no entry; a line the journal
    cannot encode is read from its bodies, like one without facts)."""
    try:
        return journal_fields(line) or b""
    except (TypeError, ValueError):
        return b""


def _guard(action: Callable[[], object], what: str) -> bool:
    """Capture bookkeeping must never break serving: failures are logged, not raised.
    Returns whether ``action`` succeeded."""
    try:
        action()
    except (OSError, CaptureError, ValueError) as exc:
        limited.warning(what, "could not %s: %s", what, exc)
        return False
    return True
