"""``create_app(settings)``: the capture model server as one ASGI app.

Layout: :class:`CaptureMiddleware` (outermost, strips prefixes and captures) → a small
dispatcher serving ``/ngcapture/metrics`` and ``/ngcapture/health`` itself and forwarding
everything else to the :class:`UpstreamProxy`.
"""

from __future__ import annotations

import logging

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capture_core import __version__
from capture_core.lineage import LineageStore
from capture_core.server._asgi import send_whole
from capture_core.server.control import CONTROL_PREFIX, control_app, load_control_token
from capture_core.server.counters import CaptureCounters
from capture_core.server.middleware import CaptureMiddleware
from capture_core.server.proxy import UpstreamProxy
from capture_core.server.settings import CaptureSettings
from capture_core.server.training import TrainingGate
from capture_core.store import CaptureStore
from capture_core.store_id import ensure_store_id

__all__ = ["CaptureApp", "create_app"]

logger = logging.getLogger(__name__)

METRICS_PATH = "/ngcapture/metrics"
HEALTH_PATH = "/ngcapture/health"
DRAIN_ON_SHUTDOWN_S = 30.0


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
        self.counters = CaptureCounters()
        # Training capture keeps ledgers; their control plane refuses to run without a token.
        self.lineage = LineageStore(settings.lineage_dir) if settings.lineage_dir else None
        self.control: ASGIApp | None = (
            control_app(self.lineage, token=load_control_token(settings))
            if self.lineage is not None
            else None
        )
        self.proxy = UpstreamProxy(settings)
        self.training = TrainingGate(self.lineage, self.proxy) if self.lineage else None
        self.middleware = CaptureMiddleware(
            self._dispatch,
            store=self.store,
            model_server_name=settings.model_server_name,
            counters=self.counters,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await self.middleware(scope, receive, send)

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
                where = self.store.root if self.store else "off"
                logger.info("capture server up; upstream %s; capture %s",
                            self.settings.upstream_url, where)  # fmt: skip
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                left = await self.middleware.drain(DRAIN_ON_SHUTDOWN_S)
                if left:
                    logger.warning("%d capture write(s) still running at shutdown", left)
                await self.proxy.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


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
