"""The server's limits, on a real process with small settings (from NGCAPTURE_* variables)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from capture_core import CaptureStore
from capture_core.testing import request_body
from capture_core.testing.processes import ServiceProcess, run_capture_server
from tests.e2e._raw_http import parse_response, send_raw
from tests.e2e.conftest import Stack

LIMIT = 4096
BODY = orjson.dumps(request_body("chat"))


@pytest.fixture(scope="module")
def limited(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, CaptureStore]]:  # fmt: skip
    directory = tmp_path_factory.mktemp("limits") / "calls"
    env = {
        "NGCAPTURE_MAX_REQUEST_BODY_BYTES": str(LIMIT),
        "NGCAPTURE_HEADER_TIMEOUT_S": "1",
        "NGCAPTURE_IDLE_TIMEOUT_S": "1",
        "NGCAPTURE_MAX_CLIENT_CONNECTIONS": "4",
    }
    with run_capture_server(stack.worker.url, directory, env=env) as server:
        yield server, CaptureStore(directory)


def served(stack: Stack) -> int:
    count = httpx.get(stack.worker.url + "/stats", timeout=10).json()["requests_served"]
    assert isinstance(count, int)
    return count


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
    for opening in (b"", b"POST /ng-rollout/slow-1/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"):
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
            sock.sendall(opening)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        assert parse_response(received).status == 408
        assert time.monotonic() - started < 15  # ~1 s configured; a busy machine is slower


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
