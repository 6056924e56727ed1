"""Real processes on loopback: one simulated worker, capture servers with capture on and off."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from capture_core import CaptureStore
from capture_core.testing.processes import ServiceProcess, run_capture_server, run_worker


@dataclass
class Stack:
    worker: ServiceProcess
    captured: ServiceProcess
    uncaptured: ServiceProcess
    store: CaptureStore

    def base(self, rollout_id: str, *, capture: bool = True, v1: bool = True) -> str:
        server = self.captured if capture else self.uncaptured
        return f"{server.url}/ng-rollout/{rollout_id}" + ("/v1" if v1 else "")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    capture_dir = tmp_path_factory.mktemp("e2e") / "model-calls"
    with (
        run_worker(seed=7, ttft_ms=5, ms_per_token=0.05) as worker,
        run_capture_server(worker.url, capture_dir) as captured,
        run_capture_server(worker.url, None) as uncaptured,
    ):
        yield Stack(worker, captured, uncaptured, CaptureStore(capture_dir))


@pytest.fixture
def rollout_id(request: pytest.FixtureRequest) -> str:
    """A fresh rollout id per test (the store is shared by the session)."""
    name = request.node.name.replace("[", "-").replace("]", "")
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:150]


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0
