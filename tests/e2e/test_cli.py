"""The ``ngcapture`` services start on a free loopback port and stop cleanly on signals."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from capture_core.store_id import read_store_id
from capture_core.testing.processes import start_service


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_worker_and_server_stop_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    worker = start_service("worker", ["worker", "--seed", "3"])
    server = start_service(
        "capture-server",
        ["serve", "--upstream", worker.url, "--capture-dir", str(tmp_path / "calls")],
    )
    try:
        assert f"listening on {worker.url}" in worker.log()
        assert f"capturing model calls into {tmp_path / 'calls'}" in server.log()
        models = httpx.get(server.url + "/ng-rollout/r-1/v1/models", timeout=10)
        assert models.status_code == 200
        assert models.json()["object"] == "list"
        health = httpx.get(server.url + "/ngcapture/health", timeout=10).json()
        assert health["status"] == "ok"
        assert health["capture"]["dir"] == str((tmp_path / "calls").resolve())
        assert health["capture"]["store_id"] == read_store_id(tmp_path / "calls")
    finally:
        codes = []
        for service in (server, worker):
            service.process.send_signal(sig)
            try:
                codes.append(service.process.wait(15))
            finally:
                service.stop()  # never leave a process behind, whatever happened
    assert codes == [0, 0], (server.log(), worker.log())
    assert "stopped" in server.log()
    assert "stopped" in worker.log()
    assert not (tmp_path / "calls" / "r-1.capture.jsonl").exists()  # /v1/models: not captured
