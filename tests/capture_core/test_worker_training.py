"""The simulated worker's training mode, in process."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx

from capture_core.staging import COMMIT_COORDS_KEY, CaptureAdmission, CaptureMode
from capture_core.testing import SimulatedWorker, WorkerConfig
from capture_core.testing.tokenizer import ByteTokenizer


def post(worker: SimulatedWorker, path: str, body: dict[str, Any]) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=worker)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
            return await client.post(path, json=body)

    return asyncio.run(go())


def admission(rollout_id: str = "r-0") -> dict[str, Any]:
    return CaptureAdmission(
        rollout_id=rollout_id, model_call_id=uuid.uuid4().hex, mode=CaptureMode.TEXT
    ).model_dump(mode="json")


def test_a_root_call_is_staged_and_answered_with_tokens(tmp_path: Path) -> None:
    worker = SimulatedWorker(WorkerConfig(ttft_ms=0, ms_per_token=0, staging_dir=str(tmp_path)))
    messages = [{"role": "user", "content": "Which is larger? (A) 2 (B) 3"}]
    response = post(worker, "/v1/chat/completions",
                    {"model": "m", "messages": messages, "ng_capture": admission()})  # fmt: skip
    assert response.status_code == 200, response.text
    payload = response.json()
    choice = payload["choices"][0]
    tokenizer = ByteTokenizer()
    assert payload["prompt_token_ids"] == tokenizer.render_prompt(messages)
    assert tokenizer.decode(choice["token_ids"]) == choice["message"]["content"] + "<|end|>"
    tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
    assert tokens == [f"token_id:{t}" for t in choice["token_ids"]]
    coords = payload[COMMIT_COORDS_KEY]
    assert coords["disposition"] == "staged"
    assert coords["cum_len"] == len(payload["prompt_token_ids"]) + len(choice["token_ids"])
    assert any(tmp_path.rglob("*.stage"))


def test_a_messages_call_is_staged_with_top_level_token_fields(tmp_path: Path) -> None:
    worker = SimulatedWorker(WorkerConfig(ttft_ms=0, ms_per_token=0, staging_dir=str(tmp_path)))
    messages = [{"role": "user", "content": [{"type": "text", "text": "Which? (A) 2 (B) 3"}]}]
    body = {"model": "m", "max_tokens": 64, "system": "be brief", "messages": messages,
            "ng_capture": admission()}  # fmt: skip
    response = post(worker, "/v1/messages", body)
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["type"] == "message"
    tokenizer = ByteTokenizer()
    turns = [{"role": "system", "content": "be brief"}, *messages]
    assert payload["prompt_token_ids"] == tokenizer.render_prompt(turns)
    text = "".join(b["text"] for b in payload["content"] if b["type"] == "text")
    assert tokenizer.decode(payload["generation_token_ids"]) == text + "<|end|>"
    assert len(payload["generation_log_probs"]) == len(payload["generation_token_ids"])
    coords = payload[COMMIT_COORDS_KEY]
    assert coords["disposition"] == "staged"
    assert coords["cum_len"] == len(payload["prompt_token_ids"]) + len(
        payload["generation_token_ids"]
    )
    assert any(tmp_path.rglob("*.stage"))


def test_training_requests_that_cannot_be_served_are_refused_clearly(tmp_path: Path) -> None:
    configured = SimulatedWorker(WorkerConfig(ttft_ms=0, ms_per_token=0,
                                              staging_dir=str(tmp_path)))  # fmt: skip
    plain = SimulatedWorker(WorkerConfig(ttft_ms=0, ms_per_token=0))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "ng_capture": admission()}  # fmt: skip
    streamed = post(configured, "/v1/chat/completions", {**body, "stream": True})
    assert streamed.status_code == 422
    assert "non-streaming backend requests" in streamed.text
    assert post(plain, "/v1/chat/completions", body).status_code == 503
    bad = post(configured, "/v1/chat/completions", {**body, "ng_capture": {"mode": "text"}})
    assert bad.status_code == 400
    assert "ng_capture" in bad.text
    assert not list(tmp_path.rglob("*.stage"))


def test_routed_experts_are_returned_and_staged_in_extras(tmp_path: Path) -> None:
    from capture_core.staging import EMPTY_EXTRAS_DIGEST, FilesystemStagingSink

    worker = SimulatedWorker(WorkerConfig(ttft_ms=0, ms_per_token=0, staging_dir=str(tmp_path),
                                          routed_experts=True))  # fmt: skip
    body = {"model": "m", "messages": [{"role": "user", "content": "Pick (A) or (B)"}],
            "ng_capture": admission("r-9")}  # fmt: skip
    payload = post(worker, "/v1/chat/completions", body).json()
    routes = payload["choices"][0]["message"]["routed_experts"]
    rows = len(payload["prompt_token_ids"]) + len(payload["choices"][0]["token_ids"]) - 1
    assert len(routes) == rows
    coords = payload[COMMIT_COORDS_KEY]
    assert coords["disposition"] == "staged"
    assert coords["extras_digest"] != EMPTY_EXTRAS_DIGEST
    (snapshot,) = FilesystemStagingSink(tmp_path).fetch([coords["staging_key"]])
    assert snapshot.extras is not None
    assert snapshot.extras["routed_experts"] == routes


def _staged(tmp_path: Path, body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    from capture_core.staging import FilesystemStagingSink

    worker = SimulatedWorker(WorkerConfig(ttft_ms=0, ms_per_token=0, staging_dir=str(tmp_path)))
    payload = post(worker, "/v1/chat/completions", body).json()
    coords = payload[COMMIT_COORDS_KEY]
    assert coords["disposition"] == "staged", coords
    (snapshot,) = FilesystemStagingSink(tmp_path).fetch([coords["staging_key"]])
    return payload, snapshot


def test_the_adapter_reads_the_workers_own_payloads(tmp_path: Path) -> None:
    """Text, tool call and an image turn from the simulated worker, read by the adapter."""
    from capture_core.adapters import VLLMCaptureAdapter
    from capture_core.testing.tokenizer import IMAGE_TOKENS

    adapter = VLLMCaptureAdapter()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}}}}]  # fmt: skip
    image = [{"type": "text", "text": "What is shown? (A) cat (B) dog"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]  # fmt: skip
    cases = {
        "text": {"messages": [{"role": "user", "content": "Pick (A) or (B)"}]},
        "tool": {"messages": [{"role": "user", "content": "Look it up"}], "tools": tools},
        "image": {"messages": [{"role": "user", "content": image}]},
    }
    for name, extra in cases.items():
        body = {"model": "m", "ng_capture": admission(f"r-{name}"), **extra}
        payload, snapshot = _staged(tmp_path / name, body)
        prompt = adapter.extract_prompt_ids(payload)
        generated, logprobs = adapter.extract_generation(payload)
        assert snapshot.token_ids_delta == prompt + generated
        assert generated == payload["choices"][0]["token_ids"]
        assert [lp for lp, m in zip(snapshot.generation_log_probs_delta, snapshot.token_mask_delta,
                                    strict=True) if m == 1] == logprobs  # fmt: skip
        if name == "tool":
            assert payload["choices"][0]["message"]["tool_calls"]
        if name == "image":
            (span,) = payload["media_spans"]
            assert span["length"] == IMAGE_TOKENS
            assert snapshot.extras == {"media_spans": payload["media_spans"]}
        else:
            assert "media_spans" not in payload


def test_two_choices_or_missing_ids_give_capture_failed(tmp_path: Path) -> None:
    from capture_core.adapters import VLLMCaptureAdapter
    from capture_core.staging import CaptureAdmission, RolloutTokenCapture
    from capture_core.testing import InMemoryStagingSink

    worker = SimulatedWorker(WorkerConfig(ttft_ms=0, ms_per_token=0, staging_dir=str(tmp_path)))
    body = {"model": "m", "messages": [{"role": "user", "content": "Pick (A) or (B)"}],
            "ng_capture": admission("r-x")}  # fmt: skip
    payload = post(worker, "/v1/chat/completions", body).json()
    capture = RolloutTokenCapture(sink=InMemoryStagingSink(), weight_version_fn=lambda: 1,
                                  adapter=VLLMCaptureAdapter())  # fmt: skip
    two = {**payload, "choices": payload["choices"] * 2}
    missing = {k: v for k, v in payload.items() if k != "prompt_token_ids"}
    for broken in (two, missing):
        call = capture.begin_call(CaptureAdmission.model_validate(admission("r-y")))
        coords = capture.complete_call_from_response(call, broken)
        assert coords.disposition == "capture_failed"
        assert call.failure_reason == "extraction_failed"
