"""``create_app(settings)``: the capture model server as one ASGI app.

Layout: screening (refuses what must not be forwarded and normalises the target) →
:class:`CaptureMiddleware` (strips prefixes and captures) → a small dispatcher serving
``/ngcapture/metrics`` and ``/ngcapture/health`` itself and forwarding everything else to the
:class:`UpstreamProxy`.
"""

from __future__ import annotations

import asyncio
import logging

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capture_core import __version__
from capture_core.appender import Appender
from capture_core.exceptions import AppenderError, RequestRefusedError
from capture_core.lineage import LineageStore
from capture_core.server._asgi import send_whole
from capture_core.server.control import CONTROL_PREFIX, control_app, load_control_token
from capture_core.server.counters import CaptureCounters
from capture_core.server.errors import send_error
from capture_core.server.large_lines import LargeLines
from capture_core.server.logs import RateLimitedLogger
from capture_core.server.middleware import CaptureMiddleware
from capture_core.server.proxy import UpstreamProxy
from capture_core.server.screening import FORWARDED_METHODS, limit_body, path_hint, screen
from capture_core.server.settings import CaptureSettings
from capture_core.server.token_capture import ServerTokenCapture
from capture_core.server.training import TrainingGate
from capture_core.server.write_threads import WriteThreads
from capture_core.store import CaptureStore
from capture_core.store_id import ensure_store_id
from capture_core.writers import CaptureWriter

__all__ = ["CaptureApp", "create_app"]

logger = logging.getLogger(__name__)
limited = RateLimitedLogger(logger)

METRICS_PATH = "/ngcapture/metrics"
HEALTH_PATH = "/ngcapture/health"
DRAIN_ON_SHUTDOWN_S = 30.0
DRAIN_AFTER_CLOSE_S = 5.0
#: Threads for large lines (each waits on the process that writes it) and capture failures.
WRITER_THREADS = 4
_SUMMARIZED = ("calls_captured", "capture_failures", "requests_refused", "uncaptured_requests",
               "invalid_rollout_ids")  # fmt: skip
_ALLOWED = ", ".join(sorted(FORWARDED_METHODS)).encode()


class CaptureApp:
    """The ASGI app made by :func:`create_app`; its parts stay reachable for tests and tools.

    Attributes:
        settings: the settings it was made with.
        store: the capture store, or ``None`` when capture is off.
        counters: the process's capture counters.
        middleware: the capture middleware (outermost layer).
    """

    def __init__(self, settings: CaptureSettings) -> None:
        self.settings = settings
        directory = settings.capture_dir
        self.store = CaptureStore(directory, create=True) if directory is not None else None
        # The directory's id lets a collector check that it reads where this server writes.
        self.store_id = ensure_store_id(directory) if directory is not None else None
        # This process as a writer of the directory: live lock, failure log, marker directory.
        self.writer = CaptureWriter(directory, journal=False) if directory is not None else None
        # Lines are appended, made durable and journaled by a process of their own.
        self.appender = (
            Appender(directory, self.writer.token, segment_bytes=settings.journal_segment_bytes)
            if directory is not None and self.writer is not None
            else None
        )
        self.executor = (
            WriteThreads(WRITER_THREADS, name="ngcapture-write") if directory is not None else None
        )
        self.large_lines = LargeLines() if directory is not None else None
        self.counters = CaptureCounters()
        self._summary: asyncio.Future[None] | None = None
        # Training capture keeps ledgers; their control plane refuses to run without a token.
        self.lineage = LineageStore(settings.lineage_dir) if settings.lineage_dir else None
        self.control: ASGIApp | None = (
            control_app(self.lineage, token=load_control_token(settings))
            if self.lineage is not None
            else None
        )
        self.proxy = UpstreamProxy(settings)
        # Issue 18 hook: token-id capture rides on the training gate (settings demand lineage).
        self.tokens = ServerTokenCapture.from_config(settings.token_capture)
        self.training = (
            TrainingGate(self.lineage, self.proxy, tokens=self.tokens) if self.lineage else None
        )
        self.middleware = CaptureMiddleware(
            self._dispatch,
            store=self.store,
            model_server_name=settings.model_server_name,
            counters=self.counters,
            writer=self.writer,
            executor=self.executor,
            large_lines=self.large_lines,
            appender=self.appender,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":  # never forwarded (uvicorn is run with ws="none" anyway)
            await send({"type": "websocket.close", "code": 1008})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.settings.max_request_body_bytes
        try:
            target = screen(scope, max_body_bytes=limit)
        except RequestRefusedError as exc:
            await self._refuse(scope, send, exc)
            return
        scope = {**scope, "raw_path": target.raw_path, "path": target.path,
                 "query_string": target.query}  # fmt: skip
        if any(name == b"transfer-encoding" for name, _ in scope["headers"]):
            receive = limit_body(receive, limit)  # no declared length to check up front
        try:
            await self.middleware(scope, receive, send)
        except RequestRefusedError as exc:  # a chunked body over the limit, not captured
            await self._refuse(scope, send, exc)

    async def _refuse(self, scope: Scope, send: Send, exc: RequestRefusedError) -> None:
        self.counters.add("requests_refused")
        target = scope.get("ngcapture.target") or scope.get("raw_path") or b""
        limited.warning("refused", "refused %s %s: %s", scope.get("method"),
                        ascii(target[:120]), exc.reason)  # fmt: skip
        headers = [(b"connection", b"close")]
        if exc.status == 405:
            headers.append((b"allow", _ALLOWED))
        await send_error(send, path_hint(scope), exc.status, exc.reason, extra_headers=headers)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if path == METRICS_PATH:
            await _plain(send, self.counters.prometheus(), b"text/plain; version=0.0.4")
        elif path == HEALTH_PATH:
            await send_whole(send, 200, [(b"content-type", b"application/json")], self._health())
        elif isinstance(path, str) and path.startswith(CONTROL_PREFIX + "/"):
            if self.control is None:  # never forwarded upstream
                await _plain(send, "training capture is not enabled\n", b"text/plain", 404)
            else:
                await self.control(scope, receive, send)
        elif self.training is not None and TrainingGate.handles(scope):
            await self.training(scope, receive, send)
        else:
            await self.proxy(scope, receive, send)

    def _health(self) -> bytes:
        """``GET /ngcapture/health``: alive, and where captures go (for collectors to check)."""
        return orjson.dumps({
            "status": "ok",
            "version": __version__,
            "capture": {
                "enabled": self.store is not None,
                "dir": str(self.store.root) if self.store is not None else None,
                "store_id": self.store_id,
            },
        })  # fmt: skip

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "lifespan.startup":
                if self.settings.summary_interval_s > 0:
                    self._summary = asyncio.ensure_future(
                        self._summarize(self.settings.summary_interval_s)
                    )
                if self.appender is not None:
                    try:  # now, so the first call does not wait for it
                        await self.appender.start()
                    except AppenderError as exc:  # the first call tries again, or records why
                        logger.warning("%s", exc)
                where = self.store.root if self.store else "off"
                logger.info("capture server up; upstream %s; capture %s",
                            self.settings.upstream_url, where)  # fmt: skip
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._summary is not None:
                    self._summary.cancel()
                left = await self.middleware.drain(DRAIN_ON_SHUTDOWN_S)
                if left:
                    logger.warning("%d capture write(s) still running at shutdown", left)
                if self.appender is not None:
                    await self.appender.aclose()
                    if left:  # what the appender never answered is recorded as failed now
                        await self.middleware.drain(DRAIN_AFTER_CLOSE_S)
                await self.proxy.aclose()
                if self.tokens is not None:  # issue 18 hook: a configured sink is closed
                    await self.tokens.aclose()
                self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _summarize(self, interval_s: float) -> None:
        """Log one line per interval with what happened in it (nothing when nothing did)."""
        last = self.counters.snapshot()
        while True:
            await asyncio.sleep(interval_s)
            now = self.counters.snapshot()
            delta = {name: now[name] - last[name] for name in now}
            last = now
            if any(delta[name] for name in _SUMMARIZED):
                logger.info(
                    "last %g s: %d call(s) captured (%s written), %d capture failure(s), "
                    "%d request(s) refused, %d uncaptured, %d invalid rollout id(s); "
                    "%d write(s) outstanding",
                    interval_s, delta["calls_captured"], _size(delta["bytes_written"]),
                    delta["capture_failures"], delta["requests_refused"],
                    delta["uncaptured_requests"], delta["invalid_rollout_ids"],
                    now["writes_outstanding"],
                )  # fmt: skip

    def close(self) -> None:
        """Release the writer registration and the write threads (after the last write)."""
        if self.executor is not None:
            self.executor.shutdown()
        if self.large_lines is not None:
            self.large_lines.close()
        if self.writer is not None:
            self.writer.close()


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} B"
    size = float(count)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"


async def _plain(send: Send, text: str, content_type: bytes, status: int = 200) -> None:
    await send_whole(send, status, [(b"content-type", content_type)], text.encode())


def create_app(settings: CaptureSettings | None = None) -> CaptureApp:
    """Make the capture server app (settings default to the ``NGCAPTURE_*`` environment).

    Example:
        >>> app = create_app(CaptureSettings(upstream_url="http://127.0.0.1:8001"))
        >>> app.store is None  # capture is opt-in
        True
    """
    return CaptureApp(settings or CaptureSettings())
