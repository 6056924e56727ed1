"""The capture middleware: a pure ASGI wrapper that records every call of a rollout.

Per request: the ``/ng-rollout/<id>/`` prefix is stripped (always); a valid id on a dialect
path is captured by a :class:`~capture_core.server.captured_call.CapturedCall`; a non-POST
request on a dialect path is refused; an invalid id is served uncaptured and says so.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capture_core.appender import Appender
from capture_core.server.captured_call import CapturedCall
from capture_core.server.counters import CaptureCounters
from capture_core.server.errors import send_error
from capture_core.server.large_lines import LargeLines
from capture_core.server.logs import RateLimitedLogger
from capture_core.server.proxy import PREFIX_KEY
from capture_core.server.routing import route_path
from capture_core.server.training import TRAINING_ROUTE_KEY
from capture_core.server.write_threads import WriteThreads
from capture_core.store import CaptureStore
from capture_core.writers import CaptureWriter

__all__ = ["WARNING_HEADER", "CaptureMiddleware"]

logger = logging.getLogger(__name__)
limited = RateLimitedLogger(logger)

WARNING_HEADER: Final = b"x-ngcapture-warning"
_INVALID_ID_WARNING: Final = b"invalid rollout id: call served but not captured"


class CaptureMiddleware:
    """Wraps an ASGI app (the upstream proxy) and captures prefixed calls into ``store``.

    Args:
        app: the app serving the stripped paths.
        store: where capture lines go; ``None`` disables capture (prefixes are still stripped).
        model_server_name: the name recorded in ``model_ref``.
        counters: where capture counters are kept.
        writer: this process's registration in the capture directory (pending markers named
            for it, its failure log); without one, markers carry no writer and failures are
            only logged and counted.
        executor: the threads lines are written on (default: the event loop's default
            executor).
        large_lines: where lines of calls over :data:`LARGE_LINE_BYTES` are built and written
            (another process); without it they are written like the others.
        appender: the process the other lines are appended by (their lines are built on the
            event loop); without it, they are built and appended on ``executor``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: CaptureStore | None,
        model_server_name: str | None,
        counters: CaptureCounters,
        writer: CaptureWriter | None = None,
        executor: WriteThreads | None = None,
        large_lines: LargeLines | None = None,
        appender: Appender | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.model_ref = (
            {"type": "responses_api_models", "name": model_server_name}
            if model_server_name
            else None
        )
        self.counters = counters
        self.writer = writer
        self.executor = executor
        self.large_lines = large_lines
        self.appender = appender
        self._detached: set[asyncio.Future[int | None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        route = route_path(raw_path)
        if route is None:
            await self.app(scope, receive, send)
            return
        prefix = raw_path.partition(b"?")[0][: -len(route.raw_path)]
        scope = {**scope, "path": route.path, "raw_path": route.raw_path, PREFIX_KEY: prefix}
        if route.training and route.valid:
            scope[TRAINING_ROUTE_KEY] = route.rollout_id
        if not route.valid:
            self.counters.add("invalid_rollout_ids")
            limited.warning(
                "invalid-id",
                "serving a request with invalid rollout id %s uncaptured",
                ascii(route.rollout_id[:80]),
            )
            await self.app(scope, receive, _with_warning(send))
            return
        if route.dialect is not None and scope["method"] != "POST":
            self.counters.add("requests_refused")
            await send_error(send, route.path, 405, f"{route.path} takes POST requests",
                             extra_headers=[(b"allow", b"POST")])  # fmt: skip
            return
        if self.store is None or route.dialect is None:
            self.counters.add("uncaptured_requests")
            await self.app(scope, receive, send)
            return
        call = CapturedCall(self, self.store, scope, route.rollout_id, route.dialect.name)
        await call.serve(receive, send)

    async def drain(self, timeout_s: float) -> int:
        """Wait for detached writes of this process; returns how many are still running."""
        if self._detached:
            await asyncio.wait(set(self._detached), timeout=timeout_s)
        return len(self._detached)

    def detach(self, write: asyncio.Future[int | None]) -> None:
        self._detached.add(write)
        write.add_done_callback(self._detached.discard)


def _with_warning(send: Send) -> Send:
    async def warn(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", []), (WARNING_HEADER, _INVALID_ID_WARNING)]
            message = {**message, "headers": headers}
        await send(message)

    return warn
