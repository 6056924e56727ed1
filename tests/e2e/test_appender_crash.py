"""A capture server whose appender process is killed mid-run loses no evidence.

Calls keep coming from 16 clients while the appender is killed with SIGKILL: every call is
still answered; every call's line is in the store or its failure is in the failure log (the
appender died before saying whether the line landed), so the collector has an answer for each
one; a new appender takes over, and the calls after it are captured again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx

from capture_core import CaptureStore
from capture_core.failures import read_capture_failures
from capture_core.testing import request_body
from capture_core.testing.processes import run_capture_server
from tests.e2e.conftest import Stack
from tests.e2e.test_descriptor_exhaustion import with_children

CLIENTS = 16
CALLS_EACH = 25


def test_killing_the_appender_mid_run_loses_no_evidence(stack: Stack, tmp_path: Path) -> None:
    directory = tmp_path / "calls"
    body = request_body("chat")
    with run_capture_server(stack.worker.url, directory) as server:
        warm = httpx.post(f"{server.url}/ng-rollout/warm/v1/chat/completions", json=body)
        assert warm.status_code == 200  # its line landed: the appender runs
        first = with_children(server.process.pid)[1]
        killed_at: list[float] = []

        async def client(index: int, answered: list[int]) -> None:
            async with httpx.AsyncClient(timeout=60) as http:
                for call in range(CALLS_EACH):
                    url = f"{server.url}/ng-rollout/c{index}/v1/chat/completions"
                    answer = await http.post(url, json=body)
                    answered.append(answer.status_code)
                    if index == 0 and call == 5:
                        killed_at.append(time.time())
                        os.kill(first, signal.SIGKILL)  # while the other 15 are mid-call

        async def run() -> list[int]:
            answered: list[int] = []
            await asyncio.gather(*(client(index, answered) for index in range(CLIENTS)))
            return answered

        statuses = asyncio.run(run())
        second = with_children(server.process.pid)[1:]
    assert statuses == [200] * CLIENTS * CALLS_EACH
    assert second and first not in second  # a new appender took over
    store = CaptureStore(directory)
    landed = {e.data["model_call_id"] for i in range(CLIENTS) for e in store.read(f"c{i}").entries}
    failures = read_capture_failures(directory).failures
    assert all("appender process" in f.reason for f in failures), [f.reason for f in failures]
    failed = {f.model_call_id for f in failures}
    # Every call has its line or its failure (a failure may name a line that landed after all).
    assert len(landed | failed) == CLIENTS * CALLS_EACH, (len(landed), len(failed))
    # The client that killed it made 19 more calls: captured by the new appender.
    after = [e for e in store.read("c0").entries if e.data["started_at"] > killed_at[0]]
    assert after, "nothing captured after the appender was started again"
