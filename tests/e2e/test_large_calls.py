"""A call with a body over the large-line threshold is captured whole (by the worker process
that builds such lines), exactly like a small one."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import httpx
import orjson

from capture_core import CaptureStore
from capture_core.server.large_lines import LARGE_LINE_BYTES
from capture_core.testing import request_body
from capture_core.testing.processes import run_capture_server
from tests.e2e.conftest import Stack


def test_a_call_over_the_large_line_threshold_is_captured_whole(stack: Stack, tmp_path: Path) -> None:  # fmt: skip
    image = base64.b64encode(os.urandom(LARGE_LINE_BYTES * 3 // 4 + 1024)).decode()
    body = request_body("messages")
    body["messages"][0]["content"] = [
        {"type": "text", "text": "What is in this image?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image}},
    ]
    payload = orjson.dumps(body)
    assert len(payload) > LARGE_LINE_BYTES
    answers = []
    with run_capture_server(stack.worker.url, tmp_path / "calls") as server:
        for index in range(2):  # the pool starts on the first one and is reused
            answer = httpx.post(f"{server.url}/ng-rollout/big-{index}/v1/messages", content=payload,
                                headers={"content-type": "application/json"}, timeout=120)  # fmt: skip
            assert answer.status_code == 200
            answers.append(answer.json())
        workers = _spawned_children(server.process.pid)
    assert len(workers) == 1  # the lines were built by the one worker process, started once
    store = CaptureStore(tmp_path / "calls")
    for index in range(2):
        (record,) = store.read_records(f"big-{index}").records
        assert record.request == body
        assert record.response == answers[index]
        assert record.error_category is None and record.tokens_out is not None


def _spawned_children(pid: int) -> list[int]:
    """Processes started by ``pid`` through multiprocessing's spawn (the large-line worker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        if int(parent) == pid and b"spawn_main" in command:
            found.append(int(entry.name))
    return found
