"""Upstreams that compress, run as their own uvicorn processes for the compression tests.

``gzip``: the simulated worker behind Starlette's ``GZipMiddleware`` (compresses only when the
client accepts gzip). ``br`` and ``zstd``: the worker behind a middleware that always answers
in that coding, whatever the client accepts (some gateways do), streams included, one
compressed block per event so a proxy that decodes incrementally sees each event as it comes.

Run: ``python -m tests.e2e._compressing_upstreams gzip|br|zstd --port-file FILE``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import brotli
import zstandard
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capture_core.server.listener import bind_socket, run_server
from capture_core.testing.worker import SimulatedWorker, WorkerConfig


class _Encoder:
    def __init__(self, coding: str) -> None:
        if coding == "br":
            self._brotli = brotli.Compressor()
            self._zstd = None
        else:
            self._brotli = None
            self._zstd = zstandard.ZstdCompressor().compressobj()

    def block(self, data: bytes, *, last: bool) -> bytes:
        if self._brotli is not None:
            out = self._brotli.process(data) + self._brotli.flush()
            return out + self._brotli.finish() if last else out
        assert self._zstd is not None
        out = self._zstd.compress(data)
        mode = zstandard.COMPRESSOBJ_FLUSH_FINISH if last else zstandard.COMPRESSOBJ_FLUSH_BLOCK
        return out + self._zstd.flush(mode)


class AlwaysEncode:
    """Answer every response in ``coding``, ignoring ``accept-encoding``."""

    def __init__(self, app: ASGIApp, coding: str) -> None:
        self.app, self.coding = app, coding

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        encoder = _Encoder(self.coding)

        async def encoded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message["headers"] if k.lower() != b"content-length"]
                headers.append((b"content-encoding", self.coding.encode()))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                last = not message.get("more_body", False)
                message = {**message, "body": encoder.block(message.get("body", b""), last=last)}
            await send(message)

        await self.app(scope, receive, encoded)


def make_app(kind: str) -> Any:
    worker = SimulatedWorker(WorkerConfig(seed=7, ttft_ms=0, ms_per_token=0))
    if kind == "gzip":
        return GZipMiddleware(worker, minimum_size=16)
    return AlwaysEncode(worker, kind)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("gzip", "br", "zstd"))
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args(argv)
    return run_server(make_app(args.kind), bind_socket("127.0.0.1", 0), name=f"{args.kind}-worker",
                      port_file=args.port_file)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
