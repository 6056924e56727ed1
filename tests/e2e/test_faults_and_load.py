"""Faults, disconnects, two servers at once and hostile paths, with real processes."""

from __future__ import annotations

import asyncio
import http.client
import socket
import time
from pathlib import Path

import httpx
import orjson
import pytest

from capture_core import CaptureStore
from capture_core.pending import pending_calls, pending_writes
from capture_core.testing import request_body
from capture_core.testing.processes import run_capture_server
from tests.e2e.conftest import Stack

PATHS = {"responses": "/responses", "chat": "/chat/completions", "messages": "/messages"}


def post(stack: Stack, rollout_id: str, dialect: str, *, capture: bool, stream: bool,
         fault: str | None = None) -> httpx.Response:  # fmt: skip
    headers = {"content-type": "application/json"}
    if fault:
        headers["x-ngcapture-fault"] = fault
    body = orjson.dumps(request_body(dialect, stream=stream))
    return httpx.post(stack.base(rollout_id, capture=capture) + PATHS[dialect], content=body,
                      headers=headers, timeout=30)  # fmt: skip


@pytest.mark.parametrize(
    ("fault", "stream", "status", "category"),
    [
        ("429", False, 429, "rate_limit"),
        ("500", False, 500, "upstream_error"),
        ("500", True, 500, "upstream_error"),
        ("truncate", True, 200, "stream_truncated"),
        ("inband_error", True, 200, "upstream_error"),
        ("malformed", False, 200, "capture_parse_error"),
    ],
)
@pytest.mark.parametrize("dialect", ["responses", "chat", "messages"])
def test_faults_are_classified_and_the_client_sees_what_it_would_without_capture(
    stack: Stack, rollout_id: str, dialect: str, fault: str, stream: bool, status: int,
    category: str,
) -> None:  # fmt: skip
    with_capture = post(stack, rollout_id, dialect, capture=True, stream=stream, fault=fault)
    without = post(stack, rollout_id, dialect, capture=False, stream=stream, fault=fault)
    assert with_capture.status_code == without.status_code == status
    assert with_capture.content == without.content
    (record,) = stack.store.read_records(rollout_id).records
    assert record.error_category == category
    assert record.status_code == status
    if fault == "truncate":
        assert record.response is not None  # the partial reassembly is kept
        assert record.response_raw == with_capture.text
    if fault in ("429", "500"):
        assert record.error_message


def test_upstream_down_is_a_connection_error(tmp_path: Path) -> None:
    # A port bound but never listening: connections are refused, and while the socket is
    # held no other process can take the port and answer.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{held.getsockname()[1]}"
        with run_capture_server(dead, tmp_path / "calls") as server:
            response = httpx.post(server.url + "/ng-rollout/r-1/v1/chat/completions",
                                  json=request_body("chat"), timeout=30)  # fmt: skip
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"
    (record,) = CaptureStore(tmp_path / "calls").read_records("r-1").records
    assert record.error_category == "connection"
    assert record.status_code == 502


def test_a_client_that_disconnects_mid_stream_still_gets_its_line(stack: Stack) -> None:
    rollout_id = "disconnect-0"
    body = orjson.dumps(request_body("chat", stream=True))
    url = stack.base(rollout_id) + "/chat/completions?" + "fault=none"
    with httpx.Client(timeout=30) as client, client.stream(
        "POST", url, content=body,
        headers={"content-type": "application/json", "x-ngcapture-fault": "slow"},
    ) as response:  # fmt: skip
        # Keep the iterator: a dropped one is finalized at once and closes the response,
        # which is the client leaving before the pending check (seen in CI: the line said
        # client_disconnected 4 ms after the first event).
        chunks = response.iter_bytes()
        first = next(chunks)
        assert first
        # The worker is still streaming slowly: the call is visibly pending.
        assert len(pending_writes(stack.store.root, rollout_id)) == 1
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not stack.store.path_for(rollout_id).exists():
        time.sleep(0.05)
    while time.monotonic() < deadline and pending_writes(stack.store.root, rollout_id):
        time.sleep(0.05)
    assert pending_writes(stack.store.root, rollout_id) == []
    (record,) = stack.store.read_records(rollout_id).records
    assert record.status_code == 200
    assert record.error_category == "client_disconnected"
    assert record.response_raw and record.response_raw.startswith(first.decode())
    metrics = httpx.get(stack.captured.url + "/ngcapture/metrics", timeout=10).text
    assert "ngcapture_writes_outstanding 0" in metrics


def test_two_servers_200_concurrent_calls_into_one_rollout(stack: Stack, tmp_path: Path) -> None:
    capture_dir = tmp_path / "shared"
    with (
        run_capture_server(stack.worker.url, capture_dir) as first,
        run_capture_server(stack.worker.url, capture_dir) as second,
    ):
        urls = [first.url, second.url]

        async def fire() -> list[int]:
            limits = httpx.Limits(max_connections=100)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:

                async def one(i: int) -> int:
                    dialect = ("responses", "chat", "messages")[i % 3]
                    body = request_body(dialect, stream=i % 2 == 0, prompt=f"question {i}")
                    url = f"{urls[i % 2]}/ng-rollout/shared-0/v1{PATHS[dialect]}"
                    response = await client.post(url, json=body)
                    return response.status_code

                return await asyncio.gather(*(one(i) for i in range(200)))

        statuses = asyncio.run(fire())
    assert statuses == [200] * 200
    result = CaptureStore(capture_dir).read_records("shared-0")
    assert result.damaged == []
    assert len(result.records) == 200
    assert len({r.model_call_id for r in result.records}) == 200
    assert [r.call_index for r in result.records] == list(range(200))
    assert {r.dialect for r in result.records} == {"responses", "chat", "messages"}
    assert all(r.error_category is None for r in result.records)
    assert pending_writes(capture_dir, "shared-0") == []


HOSTILE = [
    "/ng-rollout/../v1/chat/completions",
    "/ng-rollout/%2e%2e/v1/chat/completions",
    "/ng-rollout/%2E%2E%2Fetc/v1/chat/completions",
    "/ng-rollout/a%2Fb/v1/chat/completions",
    "/ng-rollout/a%00b/v1/chat/completions",
    "/ng-rollout/" + "a" * 10_000 + "/v1/chat/completions",
    "/ng-rollout/r%C3%B6llout/v1/chat/completions",
    "/ng-rollout/.hidden/v1/chat/completions",
]


def raw_post(port: int, path: str, body: bytes) -> tuple[int, dict[str, str]]:
    """POST with the path sent exactly as written (httpx would remove dot segments)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body, {"content-type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        connection.close()


def test_hostile_paths_are_served_uncaptured_and_counted(stack: Stack, tmp_path: Path) -> None:
    capture_dir = tmp_path / "hostile" / "calls"
    before = set(tmp_path.rglob("*"))
    body = orjson.dumps(request_body("chat"))
    with run_capture_server(stack.worker.url, capture_dir) as server:
        statuses = []
        for path in HOSTILE:
            status, headers = raw_post(server.port, path, body)
            statuses.append(status)
            # served uncaptured and saying so, or refused outright (dot segments and encoded
            # separators that would change where the request goes)
            assert status in (200, 400), path
            if status == 200:
                assert headers["x-ngcapture-warning"].startswith("invalid rollout id"), path
        metrics = httpx.get(server.url + "/ngcapture/metrics", timeout=10).text
    assert f"ngcapture_invalid_rollout_ids_total {statuses.count(200)}" in metrics
    assert f"ngcapture_requests_refused_total {statuses.count(400)}" in metrics
    assert "ngcapture_calls_captured_total 0" in metrics
    created = set(tmp_path.rglob("*")) - before
    # only the capture directory (its parents, its bookkeeping) exist now: no capture file,
    # no pending marker, no failure, nothing outside it
    assert all(p == capture_dir or capture_dir in p.parents or p in capture_dir.parents
               for p in created), created  # fmt: skip
    assert not list(capture_dir.glob("*.capture.*"))
    assert pending_calls(capture_dir) == []
    assert all(p.stat().st_size == 0 for p in (capture_dir / ".failures").iterdir())


@pytest.mark.parametrize("stream", [False, True])
def test_a_finished_response_always_has_its_line(stack: Stack, stream: bool) -> None:
    """Once the client has the whole answer, its capture line is durable (no waiting)."""
    rollout_id = f"durable-{int(stream)}"
    path = stack.store.path_for(rollout_id)
    body = orjson.dumps(request_body("chat", stream=stream))
    with httpx.Client(timeout=30) as client:
        for i in range(40):
            response = client.post(stack.base(rollout_id) + "/chat/completions", content=body,
                                   headers={"content-type": "application/json"})  # fmt: skip
            assert response.status_code == 200
            assert path.read_bytes().count(b"\n") == i + 1
