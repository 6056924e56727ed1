"""A capture server out of file descriptors still leaves per-call evidence on disk.

The ``RLIMIT_NOFILE`` of the server and of its appender process (which opens the capture files)
is cut below what they already hold (``prlimit`` on the real processes), so no capture file can
be opened: every call is still served over the client's open connection, and every lost capture
is in the failure log, which a restarted server does not erase and which the collector turns
into one gap per call. The server alone out of descriptors loses nothing: its appender still
opens the files.
"""

from __future__ import annotations

import http.client
import resource
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from capture_core import CaptureStore
from capture_core.collect.attachment import capture_attachment
from capture_core.failures import read_capture_failures
from capture_core.testing import request_body
from capture_core.testing.processes import ServiceProcess, run_capture_server
from tests.e2e.conftest import Stack

CALLS = 8


def with_children(pid: int) -> list[int]:
    """``pid`` and its child processes (the capture server's appender)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert children, "the server has no appender process"
    return [pid, *map(int, children)]


@contextmanager
def limited(pids: list[int], resource_id: int, soft: int) -> Iterator[None]:
    """The soft limit ``resource_id`` of every process in ``pids`` set to ``soft`` meanwhile."""
    before = {pid: resource.prlimit(pid, resource_id) for pid in pids}
    try:
        for pid, (_, hard) in before.items():
            resource.prlimit(pid, resource_id, (soft, hard))
        yield
    finally:
        for pid, limits in before.items():
            resource.prlimit(pid, resource_id, limits)


def post(connection: http.client.HTTPConnection, rollout_id: str, *, pad: int = 0) -> int:
    body = request_body("chat")
    body["messages"][0]["content"] += " " * pad
    connection.request("POST", f"/ng-rollout/{rollout_id}/v1/chat/completions",
                       orjson.dumps(body), {"content-type": "application/json"})  # fmt: skip
    response = connection.getresponse()
    response.read()
    return response.status


def test_out_of_descriptors_every_lost_capture_is_on_disk_after_a_restart(stack: Stack, tmp_path: Path) -> None:  # fmt: skip
    directory = tmp_path / "calls"
    with run_capture_server(stack.worker.url, directory) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        for index in range(3):  # warm: the client's and the upstream connections are open
            assert post(connection, f"warm-{index}") == 200
        pids = with_children(server.process.pid)
        try:
            with limited(pids, resource.RLIMIT_NOFILE, 3):  # nothing new opens
                statuses = [post(connection, f"e-{index}") for index in range(CALLS)]
                metrics, log_size = _failures_and_metrics(connection, directory, server)
        finally:
            connection.close()
    assert statuses == [200] * CALLS  # the calls themselves were served
    assert log_size < 64 * 1024, server.log()[-3000:]  # logging stayed rate-limited
    assert f"ngcapture_capture_failures_total {CALLS}" in metrics
    first_logs = sorted((directory / ".failures").iterdir())
    with run_capture_server(stack.worker.url, directory) as restarted:  # a restart...
        again = http.client.HTTPConnection("127.0.0.1", restarted.port, timeout=30)
        assert post(again, "after-restart") == 200
        again.close()
    store = CaptureStore(directory)
    assert len(store.read("after-restart").entries) == 1
    # ...keeps every failure of the first process, one per call, with why
    failures = read_capture_failures(directory).failures
    assert sorted(f.rollout_id for f in failures) == sorted(f"e-{i}" for i in range(CALLS))
    assert all("EMFILE" in f.reason for f in failures), [f.reason for f in failures]
    assert all(path in sorted((directory / ".failures").iterdir()) for path in first_logs)
    for index in range(CALLS):
        assert not store.path_for(f"e-{index}").exists()
        gaps = capture_attachment([directory], f"e-{index}", drain_timeout_s=1).gaps
        assert [gap.code for gap in gaps] == ["model_call_capture_failed"]


def _failures_and_metrics(
    connection: http.client.HTTPConnection, directory: Path, server: ServiceProcess
) -> tuple[str, int]:
    """Once every call's failure is logged: the metrics page, and the server log's size after
    new clients hit ``EMFILE`` in the accept loop."""
    deadline = time.monotonic() + 30
    while len(read_capture_failures(directory).failures) < CALLS:
        assert time.monotonic() < deadline, "failures did not reach the log"
        time.sleep(0.05)
    connection.request("GET", "/ngcapture/metrics")
    metrics = connection.getresponse().read().decode()
    for _ in range(40):
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.1) as s:
                s.sendall(b"GET /ngcapture/health HTTP/1.1\r\nhost: x\r\n\r\n")
                s.recv(100)
        except OSError:
            pass
    return metrics, server.log_path.stat().st_size


def test_a_server_out_of_descriptors_still_captures_every_call(stack: Stack, tmp_path: Path) -> None:  # fmt: skip
    directory = tmp_path / "calls"
    with run_capture_server(stack.worker.url, directory) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        for index in range(3):
            assert post(connection, f"warm-{index}") == 200
        try:  # the server itself can open nothing; its appender opens the capture files
            with limited([server.process.pid], resource.RLIMIT_NOFILE, 3):
                statuses = [post(connection, f"s-{index}") for index in range(CALLS)]
        finally:
            connection.close()
    assert statuses == [200] * CALLS
    store = CaptureStore(directory)
    assert [len(store.read(f"s-{index}").entries) for index in range(CALLS)] == [1] * CALLS
    assert read_capture_failures(directory).failures == []


def test_out_of_space_losses_are_counted_per_call(stack: Stack, tmp_path: Path) -> None:
    """A capture file that may not grow (``RLIMIT_FSIZE`` on the server and its appender: writes
    past it fail with
    ``EFBIG``, as on a full disk) loses each call on its own line of the failure log, not one
    per rollout. The limit is set above the failure log's size, which stays small."""
    directory = tmp_path / "calls"
    with run_capture_server(stack.worker.url, directory) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        assert post(connection, "full", pad=256 * 1024) == 200  # a capture file of ~256 KiB
        size = CaptureStore(directory).path_for("full").stat().st_size
        try:
            with limited(with_children(server.process.pid), resource.RLIMIT_FSIZE, size + 16):
                statuses = [post(connection, "full") for _ in range(CALLS)]
                deadline = time.monotonic() + 30
                while len(read_capture_failures(directory).failures) < CALLS:
                    assert time.monotonic() < deadline, "failures did not reach the log"
                    time.sleep(0.05)
        finally:
            connection.close()
    assert statuses == [200] * CALLS
    failures = read_capture_failures(directory).failures
    assert [f.rollout_id for f in failures] == ["full"] * CALLS
    assert len({f.model_call_id for f in failures}) == CALLS
    assert all("EFBIG" in f.reason for f in failures), [f.reason for f in failures]
    store = CaptureStore(directory)
    assert len(store.read("full").entries) == 1  # the failed appends left nothing behind
    gaps = capture_attachment([directory], "full", drain_timeout_s=1).gaps
    assert [gap.code for gap in gaps] == ["model_call_capture_failed"] * CALLS
