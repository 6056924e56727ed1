"""The capture server's HTTP protocol (``server/protocol.py``) under a real uvicorn on loopback:
its read timeout drops a client that takes nothing of its answer, never one that reads slowly."""

from __future__ import annotations

import asyncio
import socket
import time
from contextlib import AbstractContextManager

import pytest
from starlette.types import Receive, Scope, Send

from capture_core.server.protocol import protocol_class
from tests._uvicorn import serve_in_thread

ANSWER = 8 * 1024 * 1024  # one message, far over the transport's high-water mark
IDLE_S = 1.0


async def _whole_answer(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers every request with ``ANSWER`` bytes in a single body message (as the training
    gate sends its answers)."""
    headers = [(b"content-length", str(ANSWER).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"x" * ANSWER})


def _served() -> AbstractContextManager[int]:
    return serve_in_thread(
        _whole_answer, http=protocol_class(header_timeout_s=5, idle_timeout_s=IDLE_S)
    )


def _read(port: int, *, pause_s: float, deadline_s: float) -> int:
    """Bytes of the answer received, reading 64 KiB every ``pause_s`` (until it ends, the
    server closes, or ``deadline_s``)."""
    received = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        client.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                chunk = client.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += len(chunk)
            if received >= ANSWER:
                break
            time.sleep(pause_s)
    return received


def test_a_slow_steady_reader_gets_the_whole_answer() -> None:
    """~2.5 MiB/s for an 8 MiB answer takes ~3 s, three times the read timeout: the buffer
    stays over its high-water mark all along, but it shrinks, so the client is reading."""
    with _served() as port:
        assert _read(port, pause_s=0.025, deadline_s=30) >= ANSWER


@pytest.mark.parametrize("taken", [0, 1])
def test_a_client_that_stops_reading_is_dropped(taken: int) -> None:
    with _served() as port, socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        client.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        for _ in range(taken):
            client.recv(65536)  # a little, then nothing more
        time.sleep(IDLE_S * 3)
        received, deadline = 0, time.monotonic() + 10
        while time.monotonic() < deadline:  # what was sent before the drop, then the end
            try:
                chunk = client.recv(1 << 20)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += len(chunk)
    assert received < ANSWER  # dropped before the whole answer went out


async def _slow_stream(scope: Scope, receive: Receive, send: Send) -> None:
    """A GET answered with 8 chunks 0.25 s apart, never calling ``receive`` (so uvicorn keeps
    reading paused once a pipelined request is queued); a POST gets its body back."""
    if scope["method"] == "POST":
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"got %d" % len(body)})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for n in range(8):
        await send({"type": "http.response.body", "body": b"chunk%d\n" % n, "more_body": True})
        await asyncio.sleep(0.25)
    await send({"type": "http.response.body", "body": b"DONE\n"})


def test_time_the_server_does_not_read_is_not_the_client_s_silence() -> None:
    """A pipelined POST waits, unread, for the 2 s stream before it: its body timeout (1 s)
    must not close the connection under that stream."""
    http = protocol_class(header_timeout_s=IDLE_S, idle_timeout_s=IDLE_S)
    with (
        serve_in_thread(_slow_stream, http=http) as port,
        socket.create_connection(("127.0.0.1", port), timeout=10) as client,
    ):
        client.sendall(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n"
                       b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 20\r\n"
                       b"connection: close\r\n\r\n0123456789")  # fmt: skip
        received, started = b"", time.monotonic()
        while b"DONE" not in received:
            chunk = client.recv(65536)
            assert chunk, f"closed under the stream after {time.monotonic() - started:.1f} s"
            received += chunk
        client.sendall(b"0123456789")  # the rest of the body, now that it is its turn
        while chunk := client.recv(65536):
            received += chunk
    assert b"\r\ngot 20\r\n" in received  # its whole body, read in its turn
