"""Token-id capture in the training gate (reference §11.3 and §12.3's served-model cases).

The gate runs in process in front of the simulated worker in training mode (or a worker whose
answer is edited); entries go to a real :class:`TokenCaptureStore` or to a recording sink.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.types import Message

from capture_core.lineage import LineageStore
from capture_core.server.token_capture import (
    ServerTokenCapture,
    read_worker_tokens,
    served_output_items,
)
from capture_core.server.training import MODEL_CALL_ID_KEY, TRAINING_ROUTE_KEY, TrainingGate
from capture_core.sse import parse_sse
from capture_core.staging import FilesystemStagingSink
from capture_core.testing import SimulatedWorker, WorkerConfig
from capture_core.tokens import (
    TOKEN_FIELDS,
    TokenCaptureStore,
    TokenEntry,
    TokenIdCaptureConfig,
)
from tests.capture_core.tokens.sinks import RecordingSink

QUESTION = "Which is larger? (A) 2 (B) 3"
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
FORBIDDEN = (b"ng_commit_coords", b"token_id:", b"prompt_token_ids", b"generation_token_ids",
             b"generation_log_probs", b"routed_experts", b"media_spans")  # fmt: skip


def config(directory: Path | None, **block: Any) -> TokenIdCaptureConfig:
    settings: dict[str, Any] = {"enabled": True, **block}
    if directory is not None:
        settings["dir"] = str(directory)
    return TokenIdCaptureConfig.from_global_config({"token_id_capture": settings})


def request(dialect: str, *, stream: bool = False, content: Any = QUESTION) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "sim-model-1", "stream": stream}
    if dialect == "responses":
        body["input"] = content
    else:
        body["messages"] = [{"role": "user", "content": content}]
    if dialect == "messages":
        body["max_tokens"] = 256
    return body


class Served:
    def __init__(self, status: int, headers: dict[bytes, bytes], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def call_id(self) -> str:
        return self.headers[b"x-ng-model-call-id"].decode()


def serve(
    gate: TrainingGate,
    path: str,
    body: dict[str, Any] | bytes,
    rollout_id: str,
    *,
    call_id: str | None = None,
    on_start: Any = None,
) -> Served:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    scope: dict[str, Any] = {
        "type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
        "query_string": b"", "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(raw)).encode())],
        "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80),
        TRAINING_ROUTE_KEY: rollout_id,
    }  # fmt: skip
    if call_id is not None:
        scope[MODEL_CALL_ID_KEY] = call_id
    assert TrainingGate.handles(scope)
    sent: list[Message] = []

    async def go() -> None:
        messages = [{"type": "http.request", "body": raw, "more_body": False}]

        async def receive() -> Message:
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start" and on_start is not None:
                on_start(message)
            sent.append(message)

        await asyncio.wait_for(gate(scope, receive, send), 30)

    asyncio.run(go())
    return Served(sent[0]["status"], dict(sent[0]["headers"]),
                  b"".join(m.get("body", b"") for m in sent[1:]))  # fmt: skip


class Upstream:
    """The simulated worker, with its JSON answers (and status) optionally rewritten."""

    def __init__(self, worker: SimulatedWorker, edit: Any = None, status: int = 200) -> None:
        self.worker, self.edit, self.status = worker, edit, status
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        if self.edit is None and self.status == 200:
            await self.worker(scope, receive, send)
            return
        start: list[Message] = []
        chunks: list[bytes] = []

        async def collect(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.append(message)
            else:
                chunks.append(message.get("body", b""))

        await self.worker(scope, receive, collect)
        payload = orjson.loads(b"".join(chunks))
        if self.edit is not None:
            self.edit(payload)
        body = orjson.dumps(payload)
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


class Setup:
    def __init__(self, root: Path, *, routed_experts: bool = False) -> None:
        self.root = root
        self.staging = root / "staging"
        self.worker = SimulatedWorker(WorkerConfig(ttft_ms=0, ms_per_token=0, seed=7,
                                                   staging_dir=str(self.staging),
                                                   routed_experts=routed_experts))  # fmt: skip
        self.ledger = LineageStore(root / "lineage")
        self.store = TokenCaptureStore(root / "tokens", create=True)

    def gate(self, *, sink: Any = "store", edit: Any = None, status: int = 200,
             upstream: Any = None) -> TrainingGate:  # fmt: skip
        directory = self.root / "tokens"
        if sink == "store":
            tokens = ServerTokenCapture.from_config(config(directory))
        else:
            tokens = ServerTokenCapture(config(directory), sink)
        self.upstream = upstream or Upstream(self.worker, edit, status)
        return TrainingGate(self.ledger, self.upstream, tokens=tokens)

    def staged(self, rollout_id: str) -> tuple[list[int], list[int], list[float], Any]:
        """The worker's own record of the rollout's one call: prompt, generated, log-probs."""
        (row,) = self.ledger.manifest(rollout_id).records
        assert row.staging_key is not None
        (snapshot,) = FilesystemStagingSink(self.staging).fetch([row.staging_key])
        ids, mask = snapshot.token_ids_delta, snapshot.token_mask_delta
        prompt = [t for t, m in zip(ids, mask, strict=True) if m == 0.0]
        generated = [t for t, m in zip(ids, mask, strict=True) if m == 1.0]
        assert prompt + generated == ids
        logprobs = [lp for lp, m in zip(snapshot.generation_log_probs_delta, mask, strict=True)
                    if m == 1.0]  # fmt: skip
        return prompt, generated, logprobs, snapshot


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_one_entry_per_call_equal_to_the_worker_tokens_and_durable_first(
    setup: Setup, dialect: str, stream: bool
) -> None:
    gate = setup.gate()
    rollout_id = f"tok-{dialect}-{int(stream)}"
    seen: list[int] = []

    def check(message: Message) -> None:  # a fresh store reads the file before the first byte
        seen.append(len(TokenCaptureStore(setup.store.root).read_entries(rollout_id)))

    served = serve(gate, PATHS[dialect], request(dialect, stream=stream), rollout_id,
                   call_id="evalrecordid0", on_start=check)  # fmt: skip
    assert served.status == 200
    assert seen == [1]
    for needle in FORBIDDEN:  # the wire never carries token fields
        assert needle not in served.body, needle
    (entry,) = setup.store.read_entries(rollout_id)
    # the id is the model-call capture line's (the middleware's), and the ledger row's
    assert entry.model_call_id == "evalrecordid0" == served.call_id
    (row,) = setup.ledger.manifest(rollout_id).records
    assert row.model_call_id == entry.model_call_id
    prompt, generated, logprobs, _ = setup.staged(rollout_id)
    assert entry.prompt_token_ids == prompt
    assert entry.generation_token_ids == generated
    assert entry.generation_log_probs == logprobs
    assert entry.model == "sim-model-1"
    assert entry.routed_experts is None and entry.media_spans is None
    # content items carry everything but the token arrays, which are stored once
    assert entry.output_items
    assert entry.token_item_index == len(entry.output_items) - 1
    for item in entry.output_items:
        assert not set(item) & set(TOKEN_FIELDS)
    text = _served_text(dialect, served.body, stream)
    assert text and text in orjson.dumps(entry.output_items).decode()
    assert not setup.store.is_incomplete(rollout_id)
    snapshot = setup.store.freeze_now(rollout_id)
    assert not snapshot.incomplete  # the call's intent is satisfied by its entry


def _served_text(dialect: str, body: bytes, stream: bool) -> str:
    if stream:
        text = ""
        for event in parse_sse(body):
            if event.data in ("", "[DONE]"):
                continue
            data = orjson.loads(event.data)
            if dialect == "chat":
                for choice in data.get("choices", []):
                    text += choice["delta"].get("content") or ""
            elif dialect == "messages" and data.get("type") == "content_block_delta":
                text += data["delta"].get("text", "")
            elif dialect == "responses" and data.get("type") == "response.completed":
                return _served_text(dialect, orjson.dumps(data["response"]), stream=False)
        return text
    answer = orjson.loads(body)
    if dialect == "chat":
        return str(answer["choices"][0]["message"]["content"])
    if dialect == "messages":
        return "".join(b["text"] for b in answer["content"] if b["type"] == "text")
    return "".join(part["text"] for item in answer["output"] if item["type"] == "message"
                   for part in item["content"])  # fmt: skip


def test_chat_entry_carries_routed_experts_and_media_spans(tmp_path: Path) -> None:
    setup = Setup(tmp_path, routed_experts=True)
    gate = setup.gate()
    content = [{"type": "text", "text": "What is in the picture?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]  # fmt: skip
    served = serve(gate, PATHS["chat"], request("chat", content=content), "tok-moe")
    assert served.status == 200
    for needle in FORBIDDEN:
        assert needle not in served.body, needle
    (entry,) = setup.store.read_entries("tok-moe")
    prompt, generated, _, snapshot = setup.staged("tok-moe")
    assert (entry.prompt_token_ids, entry.generation_token_ids) == (prompt, generated)
    assert snapshot.extras is not None
    assert entry.routed_experts == snapshot.extras["routed_experts"]
    assert entry.media_spans == snapshot.extras["media_spans"]
    assert entry.media_spans and entry.media_spans[0]["modality"] == "image"


def test_call_id_is_minted_when_eval_capture_is_off(setup: Setup) -> None:
    served = serve(setup.gate(), PATHS["responses"], request("responses"), "tok-minted")
    (entry,) = setup.store.read_entries("tok-minted")
    assert entry.model_call_id == served.call_id
    assert len(served.call_id) == 32


def test_continuation_builds_one_chain(setup: Setup) -> None:
    gate = setup.gate()
    messages: list[dict[str, Any]] = []
    for question in [QUESTION, "And which is smaller? (A) 5 (B) 4"]:
        messages.append({"role": "user", "content": question})
        served = serve(gate, PATHS["chat"], {"model": "m", "messages": messages}, "tok-chain")
        answer = orjson.loads(served.body)["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": answer})
    first, second = setup.store.read_entries("tok-chain")
    parent = first.prompt_token_ids + first.generation_token_ids
    assert second.prompt_token_ids[: len(parent)] == parent
    from capture_core.tokens import trajectories_for_rollout

    build = trajectories_for_rollout("tok-chain", [setup.store.root])
    assert build is not None and not build.mask_sample, build
    assert build.metrics.chains == 1 and build.metrics.delivered_fraction == 1.0


# -- failures are isolated: the call is served, the rollout marked ------------------------------


def _no_tokens(payload: dict[str, Any]) -> None:
    payload.pop("prompt_token_ids", None)
    for choice in payload.get("choices", []):
        choice.pop("token_ids", None)
        choice["logprobs"] = None
    for item in payload.get("output", []):
        for name in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
            item.pop(name, None)
    for name in ("generation_token_ids", "generation_log_probs"):
        payload.pop(name, None)


def _mismatched(payload: dict[str, Any]) -> None:  # the entry's constructor refuses it
    for item in [payload, *payload.get("output", [])]:
        if "generation_log_probs" in item:
            item["generation_log_probs"] = item["generation_log_probs"][:-1]
    for choice in payload.get("choices", []):
        choice["token_ids"] = choice["token_ids"][:-1]
        choice["logprobs"]["content"] = choice["logprobs"]["content"][:-1]
        choice["logprobs"]["content"].append({"token": "token_id:1", "logprob": float("-1")})
        choice["logprobs"]["content"].append({"token": "token_id:2", "logprob": float("-1")})


def _partial(payload: dict[str, Any]) -> None:
    for item in [payload, *payload.get("output", [])]:
        item.pop("generation_log_probs", None)
    for choice in payload.get("choices", []):
        choice["logprobs"] = None


def _bad_ids(payload: dict[str, Any]) -> None:
    for item in [payload, *payload.get("output", [])]:
        if "prompt_token_ids" in item:
            item["prompt_token_ids"] = [1.5, "x"]


@pytest.mark.parametrize("edit", [_no_tokens, _mismatched, _partial, _bad_ids],
                         ids=["no-ids", "mismatched", "partial", "bad-ids"])  # fmt: skip
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_unusable_tokens_serve_the_call_and_mark_the_rollout(
    setup: Setup, dialect: str, edit: Any
) -> None:
    rollout_id = f"tok-bad-{dialect}-{edit.__name__.strip('_')}"
    served = serve(setup.gate(edit=edit), PATHS[dialect], request(dialect), rollout_id)
    assert served.status == 200
    assert _served_text(dialect, served.body, stream=False)
    assert setup.store.read_entries(rollout_id) == []
    assert setup.store.is_incomplete(rollout_id)
    incomplete = (setup.store.root / f"{rollout_id}.tokens.incomplete").read_text()
    assert incomplete == served.call_id + "\n"
    assert len(setup.ledger.manifest(rollout_id).records) == 1  # staging is not affected


class FailingPutSink(RecordingSink):
    async def put(self, entry: TokenEntry) -> None:
        raise OSError("staging service unavailable")


class FailingMarkSink(FailingPutSink):
    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        raise OSError("cannot mark either")


def test_failed_put_gives_200_no_entries_and_incomplete(setup: Setup) -> None:
    sink = FailingPutSink()
    served = serve(setup.gate(sink=sink), PATHS["responses"], request("responses"), "tok-put")
    assert served.status == 200
    assert sink.entries == []
    assert sink.marks == [("tok-put", served.call_id)]


def test_failed_put_and_failed_mark_still_serve(setup: Setup) -> None:
    sink = FailingMarkSink()
    served = serve(setup.gate(sink=sink), PATHS["chat"], request("chat"), "tok-put-mark")
    assert served.status == 200
    assert orjson.loads(served.body)["choices"][0]["message"]["content"]


def test_installed_sink_receives_entries_without_a_dir(setup: Setup) -> None:
    from capture_core.tokens import install_token_sink

    sink = RecordingSink()
    install_token_sink(sink)
    try:
        tokens = ServerTokenCapture.from_config(config(None))
    finally:
        install_token_sink(None)
    assert tokens is not None and tokens.sink is sink
    gate = TrainingGate(setup.ledger, setup.worker, tokens=tokens)
    served = serve(gate, PATHS["messages"], request("messages", stream=True), "tok-installed")
    (entry,) = sink.entries
    assert entry.model_call_id == served.call_id and sink.marks == []
    assert not (setup.root / "tokens" / "tok-installed.tokens.jsonl").exists()


def test_external_staging_writes_and_marks_nothing(setup: Setup) -> None:
    tokens = ServerTokenCapture.from_config(config(None, rebuild_response=False))
    assert tokens is not None and tokens.sink is None
    gate = TrainingGate(setup.ledger, Upstream(setup.worker, _no_tokens), tokens=tokens)
    served = serve(gate, PATHS["responses"], request("responses"), "tok-external")
    assert served.status == 200
    assert list((setup.root / "tokens").iterdir()) == []
    assert len(setup.ledger.manifest("tok-external").records) == 1


def test_token_capture_off_leaves_no_token_files(setup: Setup) -> None:
    assert ServerTokenCapture.from_config(None) is None
    assert ServerTokenCapture.from_config(TokenIdCaptureConfig()) is None
    gate = TrainingGate(setup.ledger, setup.worker)
    assert serve(gate, PATHS["chat"], request("chat"), "tok-off").status == 200
    assert list((setup.root / "tokens").iterdir()) == []


def test_worker_error_marks_the_rollout(setup: Setup) -> None:
    served = serve(setup.gate(status=500), PATHS["chat"], request("chat"), "tok-500")
    assert served.status == 500
    assert setup.store.is_incomplete("tok-500")
    assert setup.store.read_entries("tok-500") == []


def test_unresolved_parent_is_served_and_marks_the_rollout(setup: Setup) -> None:
    gate = setup.gate()
    serve(gate, PATHS["chat"], request("chat"), "tok-unresolved")
    invented = {"model": "m", "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "an answer nobody served"},
        {"role": "user", "content": "And now?"}]}  # fmt: skip
    served = serve(gate, PATHS["chat"], invented, "tok-unresolved")
    assert served.status == 200
    assert len(setup.store.read_entries("tok-unresolved")) == 1
    assert setup.store.is_incomplete("tok-unresolved")
    lines = (setup.store.root / "tok-unresolved.tokens.incomplete").read_text().splitlines()
    assert lines == [served.call_id]


def test_body_that_is_not_an_object_is_forwarded_and_not_announced(setup: Setup) -> None:
    served = serve(setup.gate(), PATHS["chat"], b"[1, 2]", "tok-array")
    assert served.status >= 400  # the worker judges it; nothing was generated
    assert not setup.store.is_incomplete("tok-array")
    assert not (setup.store.root / "tok-array.tokens.intents").exists()


# -- fences: a frozen or retired rollout refuses calls before generation -----------------------


@pytest.mark.parametrize("dialect", ["chat", "messages"])
def test_retired_rollout_refuses_calls_until_delete(setup: Setup, dialect: str) -> None:
    gate = setup.gate()
    rollout_id = f"tok-retired-{dialect}"
    assert serve(gate, PATHS[dialect], request(dialect), rollout_id).status == 200
    snapshot = setup.store.freeze_now(rollout_id)
    assert setup.store.drop_now(rollout_id, snapshot_id=snapshot.snapshot_id,
                                version=snapshot.version)  # fmt: skip
    asked = setup.upstream.calls
    refused = serve(gate, PATHS[dialect], request(dialect), rollout_id)
    assert refused.status == 409
    error = orjson.loads(refused.body)
    message = error["error"]["message"]
    assert "retired" in message and "delete" in message
    if dialect == "messages":
        assert error["type"] == "error"
    assert setup.upstream.calls == asked  # the worker never saw it
    assert len(setup.ledger.manifest(rollout_id).records) == 1  # nor did the ledger
    setup.store.delete(rollout_id)
    assert serve(gate, PATHS[dialect], request(dialect), rollout_id).status == 200
    assert len(setup.store.read_entries(rollout_id)) == 1


def test_frozen_rollout_refuses_calls(setup: Setup) -> None:
    gate = setup.gate()
    serve(gate, PATHS["responses"], request("responses"), "tok-frozen")
    setup.store.freeze_now("tok-frozen")
    refused = serve(gate, PATHS["responses"], request("responses"), "tok-frozen")
    assert refused.status == 409
    assert "frozen" in orjson.loads(refused.body)["error"]["message"]


class BrokenIntentSink(RecordingSink):
    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        raise OSError("disk full")


def test_intent_failure_fails_the_call_with_503(setup: Setup) -> None:
    sink = BrokenIntentSink()
    refused = serve(setup.gate(sink=sink), PATHS["chat"], request("chat"), "tok-intent")
    assert refused.status == 503
    assert "disk full" in orjson.loads(refused.body)["error"]["message"]
    assert sink.entries == [] and setup.upstream.calls == 0


# -- other endpoints under the training prefix --------------------------------------------------


class Completions:
    """An upstream serving ``/v1/completions`` (an endpoint the gate does not capture)."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await receive()
        body = orjson.dumps({"object": "text_completion", "choices": [{"text": "x"}]})
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body, "more_body": False})


def test_unobserved_endpoint_is_forwarded_and_marks_the_rollout(setup: Setup) -> None:
    upstream = Completions()
    gate = setup.gate(upstream=upstream)
    served = serve(gate, "/v1/completions", {"model": "m", "prompt": "x"}, "hole-0")
    assert served.status == 200 and upstream.paths == ["/v1/completions"]
    assert orjson.loads(served.body)["object"] == "text_completion"
    assert setup.store.is_incomplete("hole-0")
    assert setup.store.read_entries("hole-0") == []


def test_unobserved_endpoint_error_marks_nothing(setup: Setup) -> None:
    gate = setup.gate(upstream=Completions(status=404))
    assert serve(gate, "/v1/completions", {"prompt": "x"}, "hole-1").status == 404
    assert not setup.store.is_incomplete("hole-1")


def test_unobserved_endpoint_marking_failure_still_forwards(setup: Setup) -> None:
    sink = FailingMarkSink()
    gate = setup.gate(sink=sink, upstream=Completions())
    served = serve(gate, "/v1/completions", {"model": "m", "prompt": "x"}, "hole-2")
    assert served.status == 200
    assert orjson.loads(served.body)["choices"] == [{"text": "x"}]


# -- reading token fields per dialect -----------------------------------------------------------


def test_read_worker_tokens_per_dialect() -> None:
    responses = {"output": [{"type": "reasoning"}, {"type": "message", "prompt_token_ids": [1],
                 "generation_token_ids": [2], "generation_log_probs": [-0.5]}]}  # fmt: skip
    found = read_worker_tokens("responses", responses)
    assert found is not None and found.carrier == 1
    assert found.fields["prompt_token_ids"] == [1] and found.fields["media_spans"] is None
    gym_chat = {"choices": [{"message": {"content": "x", "prompt_token_ids": [1],
                "generation_token_ids": [2], "generation_log_probs": [-0.5]}}]}  # fmt: skip
    found = read_worker_tokens("chat", gym_chat)
    assert found is not None and found.carrier == 0
    vllm_chat = {"prompt_token_ids": [1, 2], "choices": [{"message": {"content": "x"},
                 "logprobs": {"content": [{"token": "token_id:9", "logprob": -0.25}]}}]}  # fmt: skip
    found = read_worker_tokens("chat", vllm_chat)
    assert found is not None
    assert found.fields["generation_token_ids"] == [9]
    assert found.fields["generation_log_probs"] == [-0.25]
    assert read_worker_tokens("chat", {"choices": [{"message": {"content": "x"}}]}) is None
    messages = {"content": [], "prompt_token_ids": [1], "generation_token_ids": [],
                "generation_log_probs": []}  # fmt: skip
    found = read_worker_tokens("messages", messages)
    assert found is not None and found.carrier is None
    assert read_worker_tokens("messages", {"content": []}) is None
    with pytest.raises(ValueError, match="missing: generation_log_probs"):
        read_worker_tokens("messages", {"prompt_token_ids": [1], "generation_token_ids": [2]})
    two = {"output": [{"prompt_token_ids": [1], "generation_token_ids": [2],
                       "generation_log_probs": [0.0]}] * 2}  # fmt: skip
    with pytest.raises(ValueError, match="multiple"):
        read_worker_tokens("responses", two)


def test_messages_content_becomes_responses_items() -> None:
    served = {"content": [
        {"type": "thinking", "thinking": "hmm", "signature": "s"},
        {"type": "text", "text": "I will look."},
        {"type": "text", "text": " Now."},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
        {"type": "server_tool_use", "id": "s1", "name": "web", "input": {}}]}  # fmt: skip
    items = served_output_items("messages", served)
    assert [item["type"] for item in items] == [
        "reasoning", "message", "function_call", "server_tool_use"]  # fmt: skip
    assert items[0]["summary"] == [{"type": "summary_text", "text": "hmm"}]
    assert [p["text"] for p in items[1]["content"]] == ["I will look.", " Now."]
    assert items[2] == {"type": "function_call", "call_id": "toolu_1", "name": "lookup",
                        "arguments": '{"q":"x"}', "status": "completed"}  # fmt: skip
