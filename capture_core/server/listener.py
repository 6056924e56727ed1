"""Run an ASGI app under uvicorn on a pre-bound socket: the one place servers are started.

``ngcapture worker`` and ``ngcapture serve`` both go through :func:`run_server`. The socket is
bound and listening before uvicorn starts, so connections made as soon as the port is announced
wait in the backlog instead of being refused; SIGINT/SIGTERM end in a graceful shutdown and
exit code 0.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from capture_core.server.logs import install_rate_limit
from capture_core.server.protocol import protocol_class
from capture_core.server.settings import CaptureSettings

__all__ = ["bind_socket", "run_server", "serve_capture"]


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port=0``: any free port).

    Raises:
        OSError: the address cannot be bound (``errno.EADDRINUSE`` when the port is taken).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio turns on TCP_NODELAY for accepted connections only
    # when the socket says it is TCP; without it every response waits ~40 ms for an ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def run_server(
    app: Any,
    sock: socket.socket,
    *,
    name: str,
    port_file: Path | None = None,
    proxy: bool = False,
    uvicorn_options: dict[str, Any] | None = None,
) -> int:
    """Serve ``app`` on the bound ``sock`` until SIGINT/SIGTERM; returns the exit code (0).

    Args:
        app: the ASGI app.
        sock: a socket from :func:`bind_socket`.
        name: how the service names itself in its "listening on" line.
        port_file: where to write the bound port (for supervisors and tests).
        proxy: a proxy forwards the upstream's own ``date`` and ``server`` headers.
        uvicorn_options: further ``uvicorn.Config`` options (limits, timeouts, loop).
    """
    host, bound = sock.getsockname()[:2]
    url = f"http://{host}:{bound}" if ":" not in host else f"http://[{host}]:{bound}"
    if port_file is not None:
        port_file.write_text(f"{bound}\n")
    print(f"ngcapture {name} listening on {url}", flush=True)
    options: dict[str, Any] = {"loop": "uvloop", "http": "httptools", "ws": "none"}
    options.update(uvicorn_options or {})
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=10,
        server_header=not proxy,
        date_header=not proxy,
        **options,
    )
    # uvicorn set up its loggers above (at WARNING): an access log asked for needs INFO.
    if options.get("access_log"):
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    # No message may flood the logs (uvicorn's handlers or the root's); the access log, when
    # asked for, is one line per request by design and is left alone.
    install_rate_limit("uvicorn", "uvicorn.error")
    _GracefulServer(config).run(sockets=[sock])
    print(f"ngcapture {name} stopped", flush=True)
    return 0


class _GracefulServer(uvicorn.Server):
    """uvicorn's server, but a SIGINT/SIGTERM ends in a graceful shutdown and exit code 0
    (uvicorn itself re-raises the signal after shutting down)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def serve_capture(
    settings: CaptureSettings, sock: socket.socket, *, port_file: Path | None = None
) -> int:
    """Run the capture server made from ``settings`` on ``sock``.

    The settings' limits become the server's: header size and timeout, body idle and
    keep-alive idle timeouts, client-connection cap, access log.
    """
    from capture_core.server.app import create_app

    app = create_app(settings)
    options = {
        "http": protocol_class(
            header_timeout_s=settings.header_timeout_s,
            idle_timeout_s=settings.idle_timeout_s,
            max_header_bytes=settings.max_header_bytes,
            counters=app.counters,
        ),
        "timeout_keep_alive": settings.idle_timeout_s,
        "limit_concurrency": settings.max_client_connections,
        "access_log": settings.access_log,
    }
    return run_server(app, sock, name="capture server", port_file=port_file,
                      proxy=True, uvicorn_options=options)  # fmt: skip
