"""Message-level checks of the training gate: ledger first, then the first byte."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.types import Message

from capture_core.lineage import LineageStore
from capture_core.server import training
from capture_core.server.training import TRAINING_ROUTE_KEY, TrainingGate
from capture_core.sse import parse_sse
from capture_core.testing import SimulatedWorker, WorkerConfig

QUESTION = "Which is larger? (A) 2 (B) 3"


def serve(gate: TrainingGate, path: str, body: dict[str, Any], rollout_id: str,
          on_send: Any = None) -> tuple[int, bytes]:  # fmt: skip
    raw = orjson.dumps(body)
    scope = {
        "type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
        "query_string": b"", "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(raw)).encode())],
        "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80),
        TRAINING_ROUTE_KEY: rollout_id,
    }  # fmt: skip
    sent: list[Message] = []

    async def go() -> None:
        messages = [{"type": "http.request", "body": raw, "more_body": False}]

        async def receive() -> Message:
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if on_send is not None:
                on_send(message)
            sent.append(message)

        await asyncio.wait_for(gate(scope, receive, send), 30)

    asyncio.run(go())
    status = sent[0]["status"]
    return status, b"".join(m.get("body", b"") for m in sent[1:])


@pytest.fixture
def gate(tmp_path: Path) -> TrainingGate:
    worker = SimulatedWorker(
        WorkerConfig(ttft_ms=0, ms_per_token=0, staging_dir=str(tmp_path / "staging"))
    )
    return TrainingGate(LineageStore(tmp_path / "lineage"), worker)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_ledger_row_is_durable_before_the_first_send(
    gate: TrainingGate, path: str, stream: bool
) -> None:
    rollout_id = "gate-first-byte"
    body: dict[str, Any] = {"model": "m", "stream": stream}
    if path.endswith("responses"):
        body["input"] = QUESTION
    else:
        body["messages"] = [{"role": "user", "content": QUESTION}]
    seen: list[int] = []

    def check(message: Message) -> None:
        # A fresh store object reads the file: the row is on disk, not in memory.
        seen.append(len(LineageStore(gate.ledger.root).manifest(rollout_id).records))

    status, raw = serve(gate, path, body, rollout_id, check)
    assert status == 200
    assert seen and set(seen) == {1}
    assert b"token_id:" not in raw and b"ng_commit_coords" not in raw


def test_responses_serialization_failure_ends_in_response_failed(
    gate: TrainingGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(response: Any) -> list[bytes]:
        raise ValueError("cannot serialize")

    monkeypatch.setattr(training, "responses_events", broken)
    rollout_id = "gate-failed"
    body = {"model": "m", "input": QUESTION, "stream": True}
    status, raw = serve(gate, "/v1/responses", body, rollout_id)
    assert status == 200
    assert [e.event for e in parse_sse(raw)] == ["response.created", "response.failed"]
    manifest = gate.ledger.manifest(rollout_id)
    assert manifest.records == []
    assert [f.reason for f in manifest.failures] == ["request_finished_without_staged_coordinates"]


def test_chat_serialization_failure_is_a_500(
    gate: TrainingGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(completion: Any, *, include_usage: bool) -> list[bytes]:
        raise ValueError("cannot serialize")

    monkeypatch.setattr(training, "chat_events", broken)
    body = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], "stream": True}
    status, _ = serve(gate, "/v1/chat/completions", body, "gate-chat-failed")
    assert status == 500
    assert gate.ledger.manifest("gate-chat-failed").records == []
