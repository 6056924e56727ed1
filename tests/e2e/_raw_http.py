"""Raw HTTP for boundary tests: requests sent byte for byte, and a canary listener.

Python's HTTP clients normalise what they send (dot segments, absolute URLs, header casing);
an attacker does not, so these helpers write the bytes as given and read the answer by hand.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

import orjson


@dataclass
class RawResponse:
    """What came back: the status (None if the server closed without answering), headers
    (lower-case names), body bytes, and how the connection ended."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> object:
        return orjson.loads(self.body)


def parse_response(data: bytes) -> RawResponse:
    while data.startswith(b"HTTP/1.1 1") and b"\r\n\r\n" in data:  # interim (100 Continue)
        data = data.partition(b"\r\n\r\n")[2]
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1."):
        return RawResponse(None, {}, data)
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()
    length = headers.get("content-length")
    if length is not None and length.isdigit():
        body = body[: int(length)]
    return RawResponse(status, headers, body)


def send_raw(port: int, request: bytes, *, timeout_s: float = 20.0) -> RawResponse:
    """Send ``request`` as is on a new connection and read until the server closes it (or
    until a complete response with a ``content-length`` has arrived)."""
    deadline = time.monotonic() + timeout_s
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        chunks: list[bytes] = []
        while time.monotonic() < deadline:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            parsed = parse_response(b"".join(chunks))
            length = parsed.headers.get("content-length")
            if (
                parsed.status is not None
                and length is not None
                and length.isdigit()
                and len(parsed.body) >= int(length)
            ):
                break
    return parse_response(b"".join(chunks))


class Canary:
    """A listener on another loopback port that counts every connection made to it, keeps
    what it received and answers ``reply`` (``{port}`` in it becomes its own port).

    Anything the proxy forwards to the wrong place ends up here; it also serves as a tiny
    upstream whose answers a test chooses.
    """

    def __init__(
        self, reply: bytes = b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\ncanary"
    ) -> None:
        self.reply = reply
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port: int = self._sock.getsockname()[1]
        self.connections = 0
        self.received = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(1.0)
                try:
                    self.received += conn.recv(65536)
                    conn.sendall(self.reply.replace(b"{port}", str(self.port).encode()))
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
