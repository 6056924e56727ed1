"""Calls the client gives up on, at each moment, through real processes on loopback.

Each abandoned call gets its own line with the category ``client_disconnected`` and the status
the client saw (none before the response headers), keeps what was seen (TTFT, the partial
stream), and the worker sees its request cancelled (it stops generating), except when the
request never reached it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import httpx
import openai
import orjson

from capture_core.records import ModelCallRecord
from capture_core.testing import request_body
from tests.e2e._raw_http import parse_response
from tests.e2e.conftest import Stack

WAIT_S = 20.0


def worker_stats(stack: Stack) -> dict[str, int]:
    stats = httpx.get(stack.worker.url + "/stats", timeout=10).json()
    assert isinstance(stats, dict)
    return stats


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def the_line(stack: Stack, rollout_id: str) -> ModelCallRecord:
    path = stack.store.path_for(rollout_id)
    wait_until(lambda: path.exists() and path.read_bytes().endswith(b"\n"), "the line")
    (record,) = stack.store.read_records(rollout_id).records
    return record


def request_bytes(rollout_id: str, body: bytes, *, fault: str | None = None,
                  delay_s: float | None = None, declared: int | None = None) -> bytes:  # fmt: skip
    extra = ""
    if fault:
        extra += f"x-ngcapture-fault: {fault}\r\n"
    if delay_s is not None:
        extra += f"x-ngcapture-fault-delay: {delay_s}\r\n"
    length = len(body) if declared is None else declared
    return (
        f"POST /ng-rollout/{rollout_id}/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        f"content-type: application/json\r\ncontent-length: {length}\r\n{extra}\r\n"
    ).encode() + body


def connect(stack: Stack) -> socket.socket:
    return socket.create_connection(("127.0.0.1", stack.captured.port), timeout=WAIT_S)


def test_client_leaves_before_its_request_body_is_complete(stack: Stack, rollout_id: str) -> None:
    body = orjson.dumps(request_body("chat"))
    served = worker_stats(stack)["requests_served"]
    with connect(stack) as sock:
        sock.sendall(request_bytes(rollout_id, body[:20], declared=len(body)))
        time.sleep(0.3)
    record = the_line(stack, rollout_id)
    assert record.error_category == "client_disconnected"
    assert record.status_code is None  # no response ever reached it
    assert record.request is None
    assert record.request_raw == body[:20].decode()
    assert record.latency_ttft_ms is None
    assert worker_stats(stack)["requests_served"] == served  # never forwarded


def test_client_leaves_before_the_response_headers(stack: Stack, rollout_id: str) -> None:
    body = orjson.dumps(request_body("chat"))
    before = worker_stats(stack)
    with connect(stack) as sock:
        sock.sendall(request_bytes(rollout_id, body, fault="timeout", delay_s=10))
        wait_until(lambda: worker_stats(stack)["requests_served"] > before["requests_served"],
                   "the worker to get the request")  # fmt: skip
    record = the_line(stack, rollout_id)
    assert record.error_category == "client_disconnected"
    assert record.status_code is None
    assert record.request == orjson.loads(body)
    assert record.latency_total_ms is not None and record.latency_total_ms < 9_000
    wait_until(
        lambda: worker_stats(stack)["requests_cancelled"] > before["requests_cancelled"],
        "the worker to see its request cancelled",
    )


def test_client_leaves_in_the_middle_of_a_json_body(stack: Stack, rollout_id: str) -> None:
    body = orjson.dumps(request_body("chat"))
    before = worker_stats(stack)
    with connect(stack) as sock:
        sock.sendall(request_bytes(rollout_id, body, fault="slow", delay_s=10))
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, "the server closed before the response headers"
            received += chunk
        sock.settimeout(0.5)  # take what body comes soon (the first part), then leave
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass
    head = parse_response(received)
    assert head.status == 200
    assert len(head.body) < int(head.headers["content-length"])  # it left mid-body
    record = the_line(stack, rollout_id)
    assert record.error_category == "client_disconnected"
    assert record.status_code == 200  # the client saw the status
    assert record.latency_ttft_ms is not None  # and the first bytes
    assert record.response_raw is not None and len(record.response_raw) < 10_000
    wait_until(
        lambda: worker_stats(stack)["requests_cancelled"] > before["requests_cancelled"],
        "the worker to see its request cancelled",
    )


def test_client_leaves_in_the_middle_of_a_stream(stack: Stack, rollout_id: str) -> None:
    before = worker_stats(stack)
    client = openai.OpenAI(base_url=stack.base(rollout_id), api_key="x", max_retries=0)
    body = request_body("chat", stream=True)
    body["stream_options"] = {"include_usage": True}
    stream = client.chat.completions.create(
        **body, extra_headers={"x-ngcapture-fault": "slow", "x-ngcapture-fault-delay": "2"}
    )
    first = next(iter(stream))
    stream.close()  # the SDK closes the connection: the user gave up
    assert first.choices[0].delta.role == "assistant"
    record = the_line(stack, rollout_id)
    assert record.error_category == "client_disconnected"
    assert record.status_code == 200
    assert record.latency_ttft_ms is not None and record.latency_ttft_ms <= record.latency_total_ms
    assert record.stream is True
    assert record.response is not None  # the partial reassembly is kept
    assert record.latency_total_ms < 10_000  # well before the stream would have ended
    wait_until(
        lambda: worker_stats(stack)["requests_cancelled"] > before["requests_cancelled"],
        "the worker to see its stream cancelled",
    )


def test_a_finished_call_is_not_an_abandoned_one(stack: Stack, rollout_id: str) -> None:
    """The client closing its connection right after the last byte changes nothing."""
    body = orjson.dumps(request_body("chat"))
    with connect(stack) as sock:
        sock.sendall(request_bytes(rollout_id, body))
        received = b""
        while True:
            received += sock.recv(65536)
            parsed = parse_response(received)
            if parsed.status and len(parsed.body) >= int(parsed.headers["content-length"]):
                break
    record = the_line(stack, rollout_id)
    assert record.error_category is None and record.status_code == 200
