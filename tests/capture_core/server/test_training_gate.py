"""Message-level checks of the training gate: ledger first, then the first byte."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.types import Message

from capture_core.lineage import LineageStore
from capture_core.server.training import TRAINING_ROUTE_KEY, TrainingGate, answer
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
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
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

    monkeypatch.setattr(answer, "responses_events", broken)
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

    monkeypatch.setattr(answer, "chat_events", broken)
    body = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], "stream": True}
    status, _ = serve(gate, "/v1/chat/completions", body, "gate-chat-failed")
    assert status == 500
    assert gate.ledger.manifest("gate-chat-failed").records == []


def test_messages_serialization_failure_is_an_anthropic_500(
    gate: TrainingGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(message: Any) -> list[bytes]:
        raise ValueError("cannot serialize")

    monkeypatch.setattr(answer, "messages_events", broken)
    body = {"model": "m", "max_tokens": 16, "stream": True,
            "messages": [{"role": "user", "content": QUESTION}]}  # fmt: skip
    status, raw = serve(gate, "/v1/messages", body, "gate-messages-failed")
    assert status == 500
    assert orjson.loads(raw) == {
        "type": "error",
        "error": {"type": "api_error", "message": "cannot serialize"},
    }
    manifest = gate.ledger.manifest("gate-messages-failed")
    assert manifest.records == []
    assert [f.reason for f in manifest.failures] == ["request_finished_without_staged_coordinates"]


class Tamper:
    """An upstream that asks the real worker, then rewrites its JSON answer with ``edit``."""

    def __init__(self, worker: Any, edit: Any) -> None:
        self.worker, self.edit = worker, edit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        start: list[Message] = []
        chunks: list[bytes] = []

        async def collect(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.append(message)
            else:
                chunks.append(message.get("body", b""))

        await self.worker(scope, receive, collect)
        payload = orjson.loads(b"".join(chunks))
        self.edit(payload)
        body = orjson.dumps(payload)
        headers = [(k, v) for k, v in start[0]["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _drop(payload: dict[str, Any]) -> None:
    del payload["ng_commit_coords"]


def _other_call(payload: dict[str, Any]) -> None:
    payload["ng_commit_coords"]["model_call_id"] = "someone-else"


def _malformed(payload: dict[str, Any]) -> None:
    payload["ng_commit_coords"]["delta_len"] = "many"


def _wrong_prev_len(payload: dict[str, Any]) -> None:
    payload["ng_commit_coords"]["prev_len"] += 1
    payload["ng_commit_coords"]["cum_len"] += 1


def _capture_failed(payload: dict[str, Any]) -> None:
    coords = payload["ng_commit_coords"]
    for name in ("digest", "extras_digest", "staging_key", "chain_hash", "cumulative_hash"):
        coords[name] = None
    coords.update(disposition="capture_failed", delta_len=0, cum_len=coords["prev_len"])


def _no_served_id(payload: dict[str, Any]) -> None:
    del payload["id"]


@pytest.mark.parametrize(
    ("edit", "reasons"),
    [
        (_drop, ["worker_response_missing_commit_coordinates",
                 "request_finished_without_staged_coordinates"]),
        (_other_call, ["invalid_worker_commit_coordinates"]),
        (_malformed, ["invalid_worker_commit_coordinates"]),
        (_wrong_prev_len, ["invalid_worker_commit_coordinates"]),
        (_capture_failed, ["worker_capture_failed"]),
    ],
    ids=["missing", "other-call", "malformed", "wrong-prev-len", "capture-failed"],
)  # fmt: skip
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_bad_worker_coordinates_give_a_failure_row_and_the_stripped_answer(
    tmp_path: Path, path: str, stream: bool, edit: Any, reasons: list[str]
) -> None:
    worker = SimulatedWorker(
        WorkerConfig(ttft_ms=0, ms_per_token=0, staging_dir=str(tmp_path / "staging"))
    )
    gate = TrainingGate(LineageStore(tmp_path / "lineage"), Tamper(worker, edit))
    rollout_id = "gate-bad-coords"
    body: dict[str, Any] = {"model": "m", "stream": stream}
    if path.endswith("responses"):
        body["input"] = QUESTION
    else:
        body["messages"] = [{"role": "user", "content": QUESTION}]
    seen: list[list[str]] = []

    def check(message: Message) -> None:  # failure rows are durable before the first byte
        fresh = LineageStore(gate.ledger.root).manifest(rollout_id)
        seen.append([f.reason for f in fresh.failures])

    status, raw = serve(gate, path, body, rollout_id, check)
    assert status == 200
    assert seen and all(s == reasons for s in seen)
    for needle in (b"ng_commit_coords", b"token_id:", b"prompt_token_ids",
                   b"generation_token_ids", b"generation_log_probs", b"routed_experts"):  # fmt: skip
        assert needle not in raw, needle
    if stream:
        events = parse_sse(raw)
        last = "response.completed" if path.endswith("responses") else None
        assert events[-1].event == last
        assert last is not None or events[-1].data == "[DONE]"
    else:
        answer = orjson.loads(raw)
        text = (
            answer["choices"][0]["message"]["content"]
            if "choices" in answer
            else answer["output"][-1]["content"][0]["text"]
        )
        assert text
    manifest = gate.ledger.manifest(rollout_id)
    assert manifest.records == []
    assert [f.reason for f in manifest.failures] == reasons
    assert len({f.model_call_id for f in manifest.failures}) == 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_served_answer_without_id_is_invalid_coordinates(tmp_path: Path, path: str) -> None:
    # JSON only: a buffered SSE answer cannot be serialized without an id (that is a 500).
    worker = SimulatedWorker(
        WorkerConfig(ttft_ms=0, ms_per_token=0, staging_dir=str(tmp_path / "staging"))
    )
    gate = TrainingGate(LineageStore(tmp_path / "lineage"), Tamper(worker, _no_served_id))
    body: dict[str, Any] = {"model": "m"}
    if path.endswith("responses"):
        body["input"] = QUESTION
    else:
        body["messages"] = [{"role": "user", "content": QUESTION}]
    status, raw = serve(gate, path, body, "gate-no-id")
    assert status == 200
    assert b"ng_commit_coords" not in raw and b"token_id:" not in raw
    manifest = gate.ledger.manifest("gate-no-id")
    assert manifest.records == []
    assert [f.reason for f in manifest.failures] == ["invalid_worker_commit_coordinates"]
