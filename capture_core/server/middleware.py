"""The capture middleware: a pure ASGI wrapper that records every call of a rollout.

Per request: the ``/ng-rollout/<id>/`` prefix is stripped (always); a valid id on a dialect
path is captured. Request and response bytes are copied as they pass; non-terminal chunks go
to the client at once, while the stream's terminal event and the final body message are held
until the capture line is durable (or its write failed). The write runs in a worker thread as
its own task: if the request is cancelled (client gone, server stopping) the write still lands,
and until it has landed a pending marker (written when the call starts) makes the call visible
to other processes sharing the directory.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capture_core.dialects import TerminalDetector
from capture_core.exceptions import CaptureError, LineEncodingError
from capture_core.pending import mark_pending, unmark_pending
from capture_core.server.counters import CaptureCounters
from capture_core.server.exchange import Exchange
from capture_core.server.proxy import TRANSPORT_ERROR_KEY
from capture_core.server.routing import route_path
from capture_core.server.training import TRAINING_ROUTE_KEY
from capture_core.store import CaptureStore

__all__ = ["WARNING_HEADER", "CaptureMiddleware"]

logger = logging.getLogger(__name__)

WARNING_HEADER: Final = b"x-ngcapture-warning"
_INVALID_ID_WARNING: Final = b"invalid rollout id: call served but not captured"


class CaptureMiddleware:
    """Wraps an ASGI app (the upstream proxy) and captures prefixed calls into ``store``.

    Args:
        app: the app serving the stripped paths.
        store: where capture lines go; ``None`` disables capture (prefixes are still stripped).
        model_server_name: the name recorded in ``model_ref``.
        counters: where capture counters are kept.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: CaptureStore | None,
        model_server_name: str | None,
        counters: CaptureCounters,
    ) -> None:
        self.app = app
        self.store = store
        self.model_ref = (
            {"type": "responses_api_models", "name": model_server_name}
            if model_server_name
            else None
        )
        self.counters = counters
        self._detached: set[asyncio.Future[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_path(scope.get("raw_path") or scope["path"].encode())
        if route is None:
            await self.app(scope, receive, send)
            return
        scope = {**scope, "path": route.path, "raw_path": route.raw_path}
        if route.training and route.valid:
            scope[TRAINING_ROUTE_KEY] = route.rollout_id
        if not route.valid:
            self.counters.add("invalid_rollout_ids")
            logger.warning(
                "serving a request with invalid rollout id %s uncaptured",
                ascii(route.rollout_id[:80]),
            )
            await self.app(scope, receive, _with_warning(send))
            return
        if self.store is None or route.dialect is None:
            self.counters.add("uncaptured_requests")
            await self.app(scope, receive, send)
            return
        call = _CapturedCall(self, self.store, scope, route.rollout_id, route.dialect.name)
        await call.serve(receive, send)

    async def drain(self, timeout_s: float) -> int:
        """Wait for detached writes of this process; returns how many are still running."""
        if self._detached:
            await asyncio.wait(set(self._detached), timeout=timeout_s)
        return len(self._detached)

    def detach(self, write: asyncio.Future[None]) -> None:
        self._detached.add(write)
        write.add_done_callback(self._detached.discard)


def _with_warning(send: Send) -> Send:
    async def warn(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", []), (WARNING_HEADER, _INVALID_ID_WARNING)]
            message = {**message, "headers": headers}
        await send(message)

    return warn


class _CapturedCall:
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
            model_call_id=uuid.uuid4().hex,
            dialect=dialect,
            model_ref=owner.model_ref,
            started_at=time.time(),
        )
        self.detector: TerminalDetector | None = None
        self.held: list[Message] = []
        self.lookahead: Message | None = None
        self.holding = False
        self.t0 = time.perf_counter()

    async def serve(self, receive: Receive, send: Send) -> None:
        async def copy_request() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.exchange.request_chunks.append(message.get("body", b""))
            return message

        async def copy_response(message: Message) -> None:
            if self._observe(message):
                self.held.append(message)
            elif message["type"] == "http.response.body" and not self.exchange.streaming:
                # Keep the newest body chunk back: with a content-length the client is done as
                # soon as it has the last byte, so that byte must wait for the capture line.
                previous, self.lookahead = self.lookahead, message
                if previous is not None:
                    await send(previous)
            else:
                await send(message)

        # The call is pending from now until its line is durable; the marker is written off
        # the event loop without delaying the request.
        self.owner.counters.add("writes_outstanding")
        self.marked = asyncio.ensure_future(asyncio.to_thread(self._mark))
        self.t0 = time.perf_counter()
        self.exchange.started_at = time.time()
        try:
            await self.owner.app(self.scope, copy_request, copy_response)
        except asyncio.CancelledError:
            self._finish()
            self.owner.detach(self._start_write(asyncio.CancelledError()))
            raise
        except Exception as exc:
            self._finish()
            await self._record(self._start_write(exc))
            await self._release(send)
            raise
        self._finish()
        await self._record(self._start_write(None))
        await self._release(send)

    def _observe(self, message: Message) -> bool:
        """Copy what a response message carries; True if it must be held back."""
        kind = message["type"]
        if kind == "http.response.start":
            self.exchange.status_code = message["status"]
            for name, value in message.get("headers", []):
                lower = name.lower()
                if lower == b"content-type":
                    self.exchange.streaming = value.lower().startswith(b"text/event-stream")
                elif lower == b"content-encoding":
                    self.exchange.content_encoding = value.decode("latin-1").strip().lower()
            if self.exchange.streaming:
                self.detector = TerminalDetector(self.exchange.dialect)
            return False
        if kind != "http.response.body":
            return self.holding
        body: bytes = message.get("body", b"")
        if body:
            if self.exchange.ttft_ms is None:
                self.exchange.ttft_ms = round((time.perf_counter() - self.t0) * 1000, 2)
            self.exchange.response_chunks.append(body)
            if self.detector is not None and not self.holding:
                self.holding = self.detector.feed(body) is not None
        return self.holding or not message.get("more_body", False)

    def _finish(self) -> None:
        exchange = self.exchange
        exchange.latency_ms = round((time.perf_counter() - self.t0) * 1000, 2)
        exchange.completed_at = time.time()
        if self.detector is not None:
            exchange.terminal = self.detector.close()
        exchange.transport_error = self.scope.get("state", {}).get(TRANSPORT_ERROR_KEY)

    def _start_write(self, failure: BaseException | None) -> asyncio.Future[None]:
        async def write() -> None:
            await self.marked  # never raises: _mark guards itself
            await asyncio.to_thread(self._write, failure)

        return asyncio.ensure_future(write())

    def _mark(self) -> None:
        _guard(
            lambda: mark_pending(self.store.root, self.rollout_id, self.exchange.model_call_id),
            "mark the capture pending",
        )

    async def _record(self, write: asyncio.Future[None]) -> None:
        self.owner.detach(write)
        await asyncio.shield(write)

    def _write(self, failure: BaseException | None) -> None:
        """Build and append the line (worker thread). Never raises: failures are counted."""
        counters, root = self.owner.counters, self.store.root
        call_id = self.exchange.model_call_id
        try:
            try:
                written = self.store.record(self.rollout_id, self.exchange.line(failure))
            except LineEncodingError:
                raw = self.exchange.line(failure, objects=False)
                written = self.store.record(self.rollout_id, raw)
            counters.add("calls_captured")
            counters.add("bytes_written", written)
        except Exception as exc:
            counters.add("capture_failures")
            logger.warning("capture of call %s in rollout %s failed: %s", call_id,
                           self.rollout_id, exc)  # fmt: skip
            _guard(lambda: self.store.mark_incomplete(self.rollout_id), "mark it incomplete")
        finally:
            _guard(lambda: unmark_pending(root, self.rollout_id, call_id), "clear its marker")
            counters.add("writes_outstanding", -1)

    async def _release(self, send: Send) -> None:
        if self.lookahead is not None:
            await send(self.lookahead)
            self.lookahead = None
        for message in self.held:
            await send(message)
        self.held.clear()


def _guard(action: Callable[[], object], what: str) -> None:
    """Capture bookkeeping must never break serving: failures are logged, not raised."""
    try:
        action()
    except (OSError, CaptureError, ValueError) as exc:
        logger.warning("could not %s: %s", what, exc)
