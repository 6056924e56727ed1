"""Token-id capture through the real capture server (reference §12.3, the served-model cases).

A simulated worker in training mode stages every call; capture servers (eval capture on and
off) started with ``NGCAPTURE_TOKEN_ID_CAPTURE_CONFIG`` record each training-route call's
:class:`TokenEntry` in the token store. The SDKs speak to them over loopback; what the worker
staged is the oracle for the token ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from capture_core import CaptureStore
from capture_core.lineage import LineageStore
from capture_core.staging import FilesystemStagingSink
from capture_core.testing.processes import ServiceProcess, run_capture_server, run_worker
from capture_core.tokens import TOKEN_FIELDS, TokenCaptureStore, TokenEntry

REPO = Path(__file__).resolve().parents[2]
QUESTION = "Which is larger? (A) 2 (B) 3"
FORBIDDEN = (b"ng_commit_coords", b"prompt_token_ids", b"generation_token_ids",
             b"generation_log_probs", b"token_id:")  # fmt: skip
TIMEOUT_S = 30.0


@dataclass
class Tokens:
    worker: ServiceProcess
    with_eval: ServiceProcess
    without_eval: ServiceProcess
    refusing: ServiceProcess
    staging: Path
    lineage: LineageStore
    captures: CaptureStore
    store: TokenCaptureStore
    marks: Path

    def server(self, eval_capture: bool) -> ServiceProcess:
        return self.with_eval if eval_capture else self.without_eval

    def staged(self, rollout_id: str) -> tuple[list[int], list[int], list[float]]:
        """What the worker staged for the rollout's one call: prompt, generated, log-probs."""
        (row,) = self.lineage.manifest(rollout_id).records
        assert row.staging_key is not None
        (snapshot,) = FilesystemStagingSink(self.staging).fetch([row.staging_key])
        pairs = list(zip(snapshot.token_ids_delta, snapshot.token_mask_delta, strict=True))
        logprobs = [lp for lp, m in zip(snapshot.generation_log_probs_delta,
                                        snapshot.token_mask_delta, strict=True) if m == 1.0]  # fmt: skip
        return [t for t, m in pairs if m == 0.0], [t for t, m in pairs if m == 1.0], logprobs


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tokens]:
    root = tmp_path_factory.mktemp("tokens")
    staging, lineage, captures = root / "staging", root / "lineage", root / "captures"
    config = root / "token-capture.json"
    config.write_text(json.dumps({"token_id_capture": {"enabled": True,
                                                       "dir": str(root / "tokens")}}))  # fmt: skip
    marks = root / "marks.jsonl"
    refusing = root / "refusing.json"
    refusing.write_text(json.dumps({"token_id_capture": {
        "enabled": True, "sink": "tests.e2e._token_sinks:RefusingSink",
        "sink_kwargs": {"marks": str(marks)}}}))  # fmt: skip
    env = {"NGCAPTURE_CONTROL_TOKEN": "test-token", "NGCAPTURE_TOKEN_ID_CAPTURE_CONFIG": str(config),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    with (
        run_worker(seed=5, staging_dir=staging, ttft_ms=0, ms_per_token=0) as worker,
        run_capture_server(worker.url, captures, lineage_dir=lineage, env=env) as with_eval,
        run_capture_server(worker.url, None, lineage_dir=lineage, env=env) as without_eval,
        run_capture_server(worker.url, None, lineage_dir=lineage,
                           env={**env, "NGCAPTURE_TOKEN_ID_CAPTURE_CONFIG": str(refusing)},
                           ) as refusing_server,
    ):  # fmt: skip
        yield Tokens(worker, with_eval, without_eval, refusing_server, staging,
                     LineageStore(lineage), CaptureStore(captures),
                     TokenCaptureStore(root / "tokens"), marks)  # fmt: skip


class Recorder(httpx.BaseTransport):
    """Keeps every response's bytes and headers (the SDKs hide them)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.bodies: list[bytes] = []
        self.headers: list[httpx.Headers] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        try:
            data = response.read()
        finally:
            response.close()
        self.bodies.append(data)
        self.headers.append(response.headers)
        return httpx.Response(response.status_code, headers=response.headers, content=data,
                              request=request)  # fmt: skip

    def close(self) -> None:
        self.inner.close()


def training_url(server: ServiceProcess, rollout_id: str) -> str:
    return f"{server.url}/ng-rollout/{rollout_id}/training-token-capture"


def call(server: ServiceProcess, rollout_id: str, dialect: str, *, stream: bool) -> Recorder:
    """One SDK call on the training route; returns what went over the wire."""
    recorder = Recorder()
    if dialect == "messages":
        import httpx2

        class Recorder2(httpx2.BaseTransport):
            def __init__(self) -> None:
                self.inner = httpx2.HTTPTransport()

            def handle_request(self, request: httpx2.Request) -> httpx2.Response:
                response = self.inner.handle_request(request)
                try:
                    data = response.read()
                finally:
                    response.close()
                recorder.bodies.append(data)
                recorder.headers.append(httpx.Headers(dict(response.headers)))
                return httpx2.Response(response.status_code, headers=response.headers,
                                       content=data, request=request)  # fmt: skip

            def close(self) -> None:
                self.inner.close()

        with anthropic.Anthropic(base_url=training_url(server, rollout_id), api_key="x",
                                 max_retries=0, timeout=TIMEOUT_S,
                                 http_client=httpx2.Client(transport=Recorder2())) as claude:  # fmt: skip
            kwargs: dict[str, Any] = {"model": "sim-model-1", "max_tokens": 256,
                                      "messages": [{"role": "user", "content": QUESTION}]}  # fmt: skip
            if stream:
                with claude.messages.stream(**kwargs) as stream_events:
                    message = stream_events.get_final_message()
            else:
                message = claude.messages.create(**kwargs)
            assert any(block.type == "text" and block.text for block in message.content)
        return recorder
    with openai.OpenAI(base_url=training_url(server, rollout_id) + "/v1", api_key="x",
                       max_retries=0, timeout=TIMEOUT_S,
                       http_client=httpx.Client(transport=recorder)) as client:  # type: ignore[arg-type]  # fmt: skip
        if dialect == "chat":
            messages: Any = [{"role": "user", "content": QUESTION}]
            if stream:
                chunks = list(client.chat.completions.create(model="sim-model-1",
                                                             messages=messages, stream=True))  # fmt: skip
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                completion = client.chat.completions.create(model="sim-model-1", messages=messages)
                assert completion.choices[0].message.content
        elif stream:
            events = list(client.responses.create(model="sim-model-1", input=QUESTION,
                                                  stream=True))  # fmt: skip
            assert events[-1].type == "response.completed"
        else:
            assert client.responses.create(model="sim-model-1", input=QUESTION).output_text
    return recorder


@pytest.mark.parametrize("eval_capture", [True, False], ids=["eval-on", "eval-off"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_training_call_records_the_worker_tokens_once(
    tokens: Tokens, dialect: str, stream: bool, eval_capture: bool
) -> None:
    rollout_id = f"tok-{dialect}-{int(stream)}-{int(eval_capture)}"
    recorder = call(tokens.server(eval_capture), rollout_id, dialect, stream=stream)
    (body,) = recorder.bodies
    for needle in FORBIDDEN:  # streamed Messages included: the tokens never reach the wire
        assert needle not in body, needle
    (entry,) = tokens.store.read_entries(rollout_id)
    assert entry.model_call_id == recorder.headers[0]["x-ng-model-call-id"]
    prompt, generated, logprobs = tokens.staged(rollout_id)
    assert entry.prompt_token_ids == prompt
    assert entry.generation_token_ids == generated
    assert entry.generation_log_probs == logprobs
    assert entry.output_items and entry.token_item_index == len(entry.output_items) - 1
    assert all(not set(item) & set(TOKEN_FIELDS) for item in entry.output_items)
    assert not tokens.store.is_incomplete(rollout_id)
    if eval_capture:  # the token entry and the model-call capture line are the same call
        (line,) = tokens.captures.read(rollout_id).entries
        assert line.data["model_call_id"] == entry.model_call_id
    else:
        assert not tokens.captures.exists(rollout_id)


def test_prefix_without_the_training_segment_records_no_tokens(tokens: Tokens) -> None:
    rollout_id = "tok-eval-only"
    url = f"{tokens.with_eval.url}/ng-rollout/{rollout_id}/v1/chat/completions"
    body = {"model": "sim-model-1", "messages": [{"role": "user", "content": QUESTION}]}
    assert httpx.post(url, json=body, timeout=TIMEOUT_S).status_code == 200
    assert len(tokens.captures.read(rollout_id).entries) == 1
    assert list(tokens.store.root.glob(f"{rollout_id}.*")) == []


def test_uncorrelated_and_untagged_calls_leave_no_token_files(tokens: Tokens) -> None:
    before = sorted(p.name for p in tokens.store.root.iterdir())
    body = {"model": "sim-model-1", "messages": [{"role": "user", "content": QUESTION}]}
    for server in (tokens.with_eval, tokens.without_eval):
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=TIMEOUT_S)
        assert response.status_code == 200
    assert sorted(p.name for p in tokens.store.root.iterdir()) == before


def test_configured_sink_that_refuses_serves_the_call_and_marks_it(tokens: Tokens) -> None:
    rollout_id = "tok-refused"
    recorder = call(tokens.refusing, rollout_id, "responses", stream=True)
    call_id = recorder.headers[0]["x-ng-model-call-id"]
    marks = [orjson.loads(line) for line in tokens.marks.read_bytes().splitlines()]
    assert marks == [[rollout_id, call_id]]
    assert len(tokens.lineage.manifest(rollout_id).records) == 1  # staging went on


def test_retired_rollout_refuses_calls_until_delete(tokens: Tokens) -> None:
    rollout_id = "tok-retired"
    call(tokens.without_eval, rollout_id, "chat", stream=False)
    snapshot = tokens.store.freeze_now(rollout_id)
    assert tokens.store.drop_now(rollout_id, snapshot_id=snapshot.snapshot_id,
                                 version=snapshot.version)  # fmt: skip
    with pytest.raises(openai.ConflictError, match="retired"):
        call(tokens.without_eval, rollout_id, "chat", stream=False)
    with pytest.raises(anthropic.ConflictError, match="retired"):
        call(tokens.without_eval, rollout_id, "messages", stream=True)
    tokens.store.delete(rollout_id)
    tokens.lineage.delete([rollout_id])
    call(tokens.without_eval, rollout_id, "chat", stream=True)
    (entry,) = tokens.store.read_entries(rollout_id)
    assert isinstance(entry, TokenEntry)
