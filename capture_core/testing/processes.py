"""Run the simulated worker and the capture server as real OS processes on loopback.

Used by ``make demo``, the end-to-end tests and the benchmarks; users can use it in theirs::

    with run_worker(seed=1) as worker, run_capture_server(worker.url, capture_dir) as server:
        client = openai.OpenAI(base_url=server.url + "/ng-rollout/0-0/v1", api_key="x")

Each process binds a free port (``--port 0``) and reports it through a port file; on exit it is
stopped with SIGTERM (then SIGKILL after a grace period), so nothing is left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ServiceProcess", "run_capture_server", "run_worker", "start_service"]

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


@dataclass
class ServiceProcess:
    """A running ``ngcapture`` service: its process and the URL it listens on."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        return self.process.returncode


def start_service(
    name: str, args: Sequence[str], *, env: dict[str, str] | None = None
) -> ServiceProcess:
    """Start ``ngcapture <args> --port 0`` and wait until it listens."""
    workdir = Path(tempfile.mkdtemp(prefix=f"ngcapture-{name}-"))
    port_file, log_path = workdir / "port", workdir / "log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "capture_core.cli", *args, "--host", "127.0.0.1",
             "--port", "0", "--port-file", str(port_file)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )  # fmt: skip
    service = ServiceProcess(name, process, 0, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{service.log()}")
        text = port_file.read_text() if port_file.exists() else ""
        if text.endswith("\n") and "listening on" in service.log():
            service.port = int(text)
            return service
        time.sleep(0.02)
    service.stop()
    raise RuntimeError(f"{name} did not start within {START_TIMEOUT_S} s:\n{service.log()}")


@contextmanager
def run_worker(
    *,
    seed: int = 0,
    ttft_ms: float = 15.0,
    ms_per_token: float = 0.2,
    staging_dir: Path | None = None,
    weight_version: int = 1,
) -> Iterator[ServiceProcess]:
    """The simulated inference worker in its own process (``staging_dir``: training mode)."""
    args = ["worker", "--seed", str(seed), "--ttft-ms", str(ttft_ms), "--ms-per-token",
            str(ms_per_token), "--weight-version", str(weight_version)]  # fmt: skip
    if staging_dir is not None:
        args += ["--staging-dir", str(staging_dir)]
    service = start_service("worker", args)
    try:
        yield service
    finally:
        service.stop()


@contextmanager
def run_capture_server(
    upstream: str,
    capture_dir: Path | None,
    *,
    model_server_name: str = "policy_model",
    lineage_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[ServiceProcess]:
    """The capture server in its own process (``capture_dir=None``: capture off).

    ``lineage_dir`` turns training capture on; its control token must then be in ``env``
    (``NGCAPTURE_CONTROL_TOKEN`` by default).
    """
    args = ["serve", "--upstream", upstream, "--model-server-name", model_server_name]
    if capture_dir is not None:
        args += ["--capture-dir", str(capture_dir)]
    if lineage_dir is not None:
        args += ["--lineage-dir", str(lineage_dir)]
    service = start_service("capture-server", args, env=env)
    try:
        yield service
    finally:
        service.stop()
