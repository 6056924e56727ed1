"""A real uvicorn server on 127.0.0.1 in a thread, for tests of one ASGI app."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.types import ASGIApp


@contextmanager
def serve_in_thread(app: ASGIApp, **options: Any) -> Iterator[int]:
    """Run ``app`` under uvicorn (``options``: more ``uvicorn.Config`` settings) on a free
    loopback port; yields the port, and stops the server on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, log_level="critical", lifespan="off", timeout_graceful_shutdown=2, **options
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"
