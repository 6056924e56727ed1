"""The server's limits, on a real process with small settings (from NGCAPTURE_* variables)."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from capture_core import CaptureStore
from capture_core.testing import request_body
from capture_core.testing.processes import ServiceProcess, run_capture_server
from tests.e2e._raw_http import parse_response, send_raw
from tests.e2e.conftest import Stack

LIMIT = 4096
HEAD_LIMIT = 2048
BODY = orjson.dumps(request_body("chat"))


@pytest.fixture(scope="module")
def limited(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, CaptureStore]]:  # fmt: skip
    directory = tmp_path_factory.mktemp("limits") / "calls"
    env = {
        "NGCAPTURE_MAX_REQUEST_BODY_BYTES": str(LIMIT),
        "NGCAPTURE_HEADER_TIMEOUT_S": "1",
        "NGCAPTURE_IDLE_TIMEOUT_S": "1",
        "NGCAPTURE_MAX_CLIENT_CONNECTIONS": "4",
        "NGCAPTURE_MAX_HEADER_BYTES": str(HEAD_LIMIT),
    }
    with run_capture_server(stack.worker.url, directory, env=env) as server:
        yield server, CaptureStore(directory)


def served(stack: Stack) -> int:
    count = httpx.get(stack.worker.url + "/stats", timeout=10).json()["requests_served"]
    assert isinstance(count, int)
    return count


def metric(server: ServiceProcess, name: str) -> int:
    text = httpx.get(f"http://127.0.0.1:{server.port}/ngcapture/metrics", timeout=10).text
    (value,) = [line.split()[1] for line in text.splitlines() if line.startswith(name + " ")]
    return int(float(value))


def settled(server: ServiceProcess) -> None:
    """Wait until no capture write is outstanding."""
    deadline = time.monotonic() + 20
    while metric(server, "ngcapture_writes_outstanding"):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def read_until_closed(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def head(rollout_id: str, extra: str = "") -> bytes:
    return (f"POST /ng-rollout/{rollout_id}/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            f"content-type: application/json\r\n{extra}").encode()  # fmt: skip


def test_a_declared_body_over_the_limit_is_refused_before_anything(limited: tuple[ServiceProcess, CaptureStore], stack: Stack) -> None:  # fmt: skip
    server, store = limited
    before = served(stack)
    big = BODY[:-1] + b',"pad":"' + b"x" * LIMIT + b'"}'
    answer = send_raw(server.port, head("big-1", f"content-length: {len(big)}\r\n\r\n") + big)
    assert answer.status == 413
    assert answer.headers["connection"] == "close"
    assert "4096" in answer.json()["error"]["message"]  # type: ignore[index]
    assert served(stack) == before and not store.path_for("big-1").exists()


def test_a_chunked_body_growing_over_the_limit_is_refused(limited: tuple[ServiceProcess, CaptureStore], stack: Stack) -> None:  # fmt: skip
    server, store = limited
    before = served(stack)
    chunks = b"".join(b"%x\r\n%s\r\n" % (1024, b"x" * 1024) for _ in range(6)) + b"0\r\n\r\n"
    answer = send_raw(server.port, head("big-2", "transfer-encoding: chunked\r\n\r\n") + chunks)
    assert answer.status == 413
    assert served(stack) == before and not store.path_for("big-2").exists()
    small = send_raw(server.port, head("small-1", f"content-length: {len(BODY)}\r\n"
                                       "connection: close\r\n\r\n") + BODY)  # fmt: skip
    assert small.status == 200 and len(store.read("small-1").entries) == 1


def test_headers_must_arrive_in_time(limited: tuple[ServiceProcess, CaptureStore]) -> None:
    server, _ = limited
    refused = metric(server, "ngcapture_requests_refused_total")
    for opening in (b"", b"POST /ng-rollout/slow-1/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"):
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
            sock.sendall(opening)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        assert parse_response(received).status == 408
        assert time.monotonic() - started < 15  # ~1 s configured; a busy machine is slower
    assert metric(server, "ngcapture_requests_refused_total") == refused + 2


def test_bytes_between_requests_do_not_stop_the_clock(limited: tuple[ServiceProcess, CaptureStore]) -> None:  # fmt: skip
    """A CRLF after a response (which the parser skips, beginning no request) must not hold the
    connection open: uvicorn stops its keep-alive timer on any byte."""
    server, _ = limited
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(b"GET /ngcapture/health HTTP/1.1\r\nhost: x\r\n\r\n")
        first = b""
        while (answer := parse_response(first)).status is None or len(answer.body) < int(
            answer.headers["content-length"]
        ):
            first += sock.recv(65536)
        assert answer.status == 200
        sock.sendall(b"\r\n")
        rest = read_until_closed(sock)  # closed after ~1 s (the header timeout), not never
    assert parse_response(rest).status == 408
    assert time.monotonic() - started < 15


def test_a_head_over_the_limit_gets_a_431_before_it_is_read(limited: tuple[ServiceProcess, CaptureStore], stack: Stack) -> None:  # fmt: skip
    server, store = limited
    before, refused = served(stack), metric(server, "ngcapture_requests_refused_total")
    big = head("hdr-1", "x-big: " + "a" * HEAD_LIMIT + f"\r\ncontent-length: {len(BODY)}\r\n\r\n")
    answer = send_raw(server.port, big + BODY)
    assert answer.status == 431 and answer.headers["connection"] == "close"
    assert str(HEAD_LIMIT) in answer.json()["error"]["message"]  # type: ignore[index]
    assert metric(server, "ngcapture_requests_refused_total") == refused + 1
    settled(server)
    assert served(stack) == before and not store.path_for("hdr-1").exists()
    # A head whose end comes in the next read, with a body larger than the head limit behind
    # it: only the head's bytes count.
    padded = BODY[:-1] + b',"pad":"' + b"x" * (HEAD_LIMIT + 1000) + b'"}'
    assert len(padded) <= LIMIT
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(head("hdr-2", f"content-length: {len(padded)}\r\nconnection: close\r\n"))
        time.sleep(0.3)  # two reads
        sock.sendall(b"\r\n" + padded)
        answer = parse_response(read_until_closed(sock))
    assert answer.status == 200 and len(store.read("hdr-2").entries) == 1


def test_the_rest_of_a_body_answered_early_is_not_a_request_head(limited: tuple[ServiceProcess, CaptureStore]) -> None:  # fmt: skip
    """The health route answers without reading the body; the rest of that body, longer than
    the head limit, is still a body: no 431, and the connection serves the next request."""
    server, _ = limited
    refused = metric(server, "ngcapture_requests_refused_total")
    body = b"x" * LIMIT  # within the body limit; its last read alone is over the head limit
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(b"POST /ngcapture/health HTTP/1.1\r\nhost: x\r\n"
                     b"content-length: %d\r\n\r\n" % len(body) + body[:100])  # fmt: skip
        for piece in (body[100:200], body[200:]):  # after the answer, in separate reads
            time.sleep(0.3)
            sock.sendall(piece)
        time.sleep(0.3)
        sock.sendall(b"GET /ngcapture/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        received = read_until_closed(sock)
    statuses = [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", received)]
    assert statuses == [200, 200]
    assert metric(server, "ngcapture_requests_refused_total") == refused


def test_a_body_the_parser_rejects_is_refused_not_recorded(limited: tuple[ServiceProcess, CaptureStore], stack: Stack) -> None:  # fmt: skip
    """A chunk size that overflows fails in the parser after the headers, while the capture
    waits for the body: the client gets a 400, and no call is recorded (not as abandoned)."""
    server, store = limited
    before, refused = served(stack), metric(server, "ngcapture_requests_refused_total")
    bad = head("bad-chunk", "transfer-encoding: chunked\r\n\r\n") + b"ffffffffffffffffff1\r\nx\r\n"
    assert send_raw(server.port, bad).status == 400
    assert send_raw(server.port, b"GARBAGE\r\n\r\n").status == 400  # no request at all
    assert metric(server, "ngcapture_requests_refused_total") == refused + 2
    settled(server)
    assert served(stack) == before and not store.path_for("bad-chunk").exists()


def test_a_stalled_body_is_cut_off_and_recorded_as_abandoned(limited: tuple[ServiceProcess, CaptureStore]) -> None:  # fmt: skip
    server, store = limited
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(head("stall-1", f"content-length: {len(BODY)}\r\n\r\n") + BODY[:10])
        closed = sock.recv(65536)  # the server closes the connection after ~1 s of silence
    assert closed == b""
    deadline = time.monotonic() + 20
    while not store.path_for("stall-1").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (record,) = store.read_records("stall-1").records
    assert record.error_category == "client_disconnected" and record.status_code is None
    assert record.request_raw == BODY[:10].decode()


def test_connections_over_the_cap_get_a_503(limited: tuple[ServiceProcess, CaptureStore]) -> None:
    server, _ = limited
    slow = head("cap-0", f"content-length: {len(BODY)}\r\nx-ngcapture-fault: timeout\r\n"
                "x-ngcapture-fault-delay: 3\r\nconnection: close\r\n\r\n") + BODY  # fmt: skip
    results: list[int | None] = []
    # the cap counts open connections, the new one included: 3 busy + 1 new reach it
    busy = [threading.Thread(target=lambda: results.append(send_raw(server.port, slow).status))
            for _ in range(3)]  # fmt: skip
    for thread in busy:
        thread.start()
    time.sleep(0.5)
    over = send_raw(server.port, head("cap-5", f"content-length: {len(BODY)}\r\n"
                                      "connection: close\r\n\r\n") + BODY)  # fmt: skip
    for thread in busy:
        thread.join(30)
    assert over.status == 503
    assert results == [200] * 3


class _EndlessUpstream:
    """An upstream whose answer never ends: it writes 64 KiB at a time for as long as the proxy
    takes them, and notes when the proxy closes the connection."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.sent = 0
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._sock.settimeout(30)
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(30)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: 1073741824\r\n\r\n")  # fmt: skip
            deadline = time.monotonic() + 60
            try:
                while time.monotonic() < deadline:
                    self.sent += conn.send(b"x" * 65536)
            except OSError:
                self.closed.set()

    def close(self) -> None:
        self._sock.close()
        self._thread.join(5)


def test_a_client_that_stops_reading_is_dropped_and_the_upstream_with_it(tmp_path: Path) -> None:
    """uvicorn waits for a client's buffer to drain forever; the idle timeout bounds it, so a
    client that reads nothing cannot hold an upstream connection (and a worker generating)."""
    upstream = _EndlessUpstream()
    env = {"NGCAPTURE_IDLE_TIMEOUT_S": "1"}
    try:
        with run_capture_server(f"http://127.0.0.1:{upstream.port}", tmp_path / "calls", env=env) as server:  # fmt: skip
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            try:
                client.connect(("127.0.0.1", server.port))
                client.sendall(head("deaf-1", f"content-length: {len(BODY)}\r\n\r\n") + BODY)
                assert upstream.closed.wait(30), (
                    f"the upstream was never let go ({upstream.sent} B)"
                )
                store = CaptureStore(tmp_path / "calls")
                deadline = time.monotonic() + 20
                while not store.path_for("deaf-1").exists():
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                (record,) = store.read_records("deaf-1").records
            finally:
                client.close()
    finally:
        upstream.close()
    assert record.error_category == "client_disconnected"
    assert record.status_code == 200  # the status line reached it; the body did not
