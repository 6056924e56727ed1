"""Training-capture routing through real processes: a staging worker behind capture servers.

The official ``openai`` and ``anthropic`` SDKs talk to ``/ng-rollout/<id>/training-token-capture/v1``; the worker
stages the tokens and the capture server commits the ledger row, strips every token field and
answers in the client's mode (JSON or buffered SSE).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from capture_core import CaptureStore
from capture_core.lineage import LineageStore
from capture_core.staging import FilesystemStagingSink, build_receipt, verify_and_linearize
from capture_core.testing.processes import ServiceProcess, run_capture_server, run_worker

FORBIDDEN = (
    b"ng_commit_coords",
    b"prompt_token_ids",
    b"generation_token_ids",
    b"generation_log_probs",
    b"routed_experts",
    b"token_id:",
)
TIMEOUT_S = 30.0


@dataclass
class Training:
    worker: ServiceProcess
    with_eval: ServiceProcess
    without_eval: ServiceProcess
    staging_dir: Path
    lineage: LineageStore
    store: CaptureStore

    def server(self, eval_capture: bool) -> ServiceProcess:
        return self.with_eval if eval_capture else self.without_eval


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Training]:
    root = tmp_path_factory.mktemp("training")
    staging, lineage, captures = root / "staging", root / "lineage", root / "captures"
    env = {"NGCAPTURE_CONTROL_TOKEN": "test-token"}
    with (
        run_worker(seed=5, staging_dir=staging, ttft_ms=0, ms_per_token=0) as worker,
        run_capture_server(worker.url, captures, lineage_dir=lineage, env=env) as with_eval,
        run_capture_server(worker.url, None, lineage_dir=lineage, env=env) as without_eval,
    ):
        yield Training(
            worker, with_eval, without_eval, staging, LineageStore(lineage), CaptureStore(captures)
        )


@dataclass
class Recorder(httpx.BaseTransport):
    """Reads every response fully and keeps its bytes and headers."""

    inner: httpx.HTTPTransport = field(default_factory=httpx.HTTPTransport)
    bodies: list[bytes] = field(default_factory=list)
    headers: list[httpx.Headers] = field(default_factory=list)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        try:
            data = response.read()
        finally:
            response.close()
        self.bodies.append(data)
        self.headers.append(response.headers)
        return httpx.Response(
            response.status_code, headers=response.headers, content=data, request=request
        )

    def close(self) -> None:
        self.inner.close()


@contextmanager
def sdk(server: ServiceProcess, rollout_id: str) -> Iterator[tuple[openai.OpenAI, Recorder]]:
    recorder = Recorder()
    with openai.OpenAI(
        base_url=f"{server.url}/ng-rollout/{rollout_id}/training-token-capture/v1",
        api_key="x",
        max_retries=0,
        timeout=TIMEOUT_S,
        http_client=httpx.Client(transport=recorder, timeout=TIMEOUT_S),
    ) as client:
        yield client, recorder


@dataclass
class AnthropicRecorder(httpx2.BaseTransport):
    """:class:`Recorder` for the ``anthropic`` SDK, which speaks ``httpx2``."""

    inner: httpx2.HTTPTransport = field(default_factory=httpx2.HTTPTransport)
    bodies: list[bytes] = field(default_factory=list)
    headers: list[httpx2.Headers] = field(default_factory=list)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self.inner.handle_request(request)
        try:
            data = response.read()
        finally:
            response.close()
        self.bodies.append(data)
        self.headers.append(response.headers)
        return httpx2.Response(
            response.status_code, headers=response.headers, content=data, request=request
        )

    def close(self) -> None:
        self.inner.close()


@contextmanager
def anthropic_sdk(
    server: ServiceProcess, rollout_id: str
) -> Iterator[tuple[anthropic.Anthropic, AnthropicRecorder]]:
    recorder = AnthropicRecorder()
    with anthropic.Anthropic(
        base_url=f"{server.url}/ng-rollout/{rollout_id}/training-token-capture",
        api_key="x",
        max_retries=0,
        timeout=TIMEOUT_S,
        http_client=httpx2.Client(transport=recorder, timeout=TIMEOUT_S),
    ) as client:
        yield client, recorder


@pytest.fixture
def open_anthropic() -> Iterator[Any]:
    """``open_anthropic(server, rollout_id)`` -> (client, recorder); closed after the test."""
    with ExitStack() as stack:
        yield lambda server, rollout_id: stack.enter_context(anthropic_sdk(server, rollout_id))


def messages_call(
    client: anthropic.Anthropic, messages: list[dict[str, Any]], *, stream: bool
) -> tuple[str, list[dict[str, Any]]]:
    """One Messages call; returns the served id and the answer's content blocks."""
    kwargs: dict[str, Any] = {"model": "sim-model-1", "max_tokens": 256, "messages": messages}
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason is not None
    return message.id, [block.model_dump(exclude_none=True) for block in message.content]


def text_of(content: list[dict[str, Any]]) -> str:
    return "".join(block["text"] for block in content if block["type"] == "text")


@pytest.fixture
def open_sdk() -> Iterator[Any]:
    """``open_sdk(server, rollout_id)`` -> (client, recorder); closed after the test."""
    with ExitStack() as stack:
        yield lambda server, rollout_id: stack.enter_context(sdk(server, rollout_id))


def chat_call(
    client: openai.OpenAI, messages: list[dict[str, Any]], *, stream: bool
) -> tuple[str, str]:
    """One chat call; returns the served id and the answer's text."""
    if not stream:
        completion = client.chat.completions.create(model="sim-model-1", messages=messages)  # type: ignore[arg-type]
        assert completion.object == "chat.completion"
        assert completion.choices[0].logprobs is None
        return completion.id, completion.choices[0].message.content or ""
    chunks = list(
        client.chat.completions.create(
            model="sim-model-1",
            messages=messages,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-2].choices[0].finish_reason is not None
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks[0].id, text


def responses_call(client: openai.OpenAI, question: str, *, stream: bool) -> tuple[str, str]:
    if not stream:
        response = client.responses.create(model="sim-model-1", input=question)
        assert response.status == "completed"
        return response.id, response.output_text
    events = list(client.responses.create(model="sim-model-1", input=question, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert len([k for k in kinds if k == "response.output_item.done"]) == len(final.output)
    return final.id, final.output_text


@pytest.mark.parametrize("eval_capture", [True, False], ids=["eval-on", "eval-off"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_sdk_parses_answer_and_ledger_has_one_row(
    training: Training,
    open_sdk: Any,
    open_anthropic: Any,
    dialect: str,
    stream: bool,
    eval_capture: bool,
) -> None:
    rollout_id = f"route-{dialect}-{int(stream)}-{int(eval_capture)}"
    opener = open_anthropic if dialect == "messages" else open_sdk
    client, recorder = opener(training.server(eval_capture), rollout_id)
    question = "Which is larger? (A) 2 (B) 3"
    if dialect == "messages":
        served_id, content = messages_call(
            client, [{"role": "user", "content": question}], stream=stream
        )
        text = text_of(content)
    elif dialect == "chat":
        served_id, text = chat_call(client, [{"role": "user", "content": question}], stream=stream)
    else:
        served_id, text = responses_call(client, question, stream=stream)
    assert text
    (body,) = recorder.bodies
    for needle in FORBIDDEN:
        assert needle not in body, needle
    kind = recorder.headers[0]["content-type"]
    assert kind.startswith("text/event-stream" if stream else "application/json")
    manifest = training.lineage.manifest(rollout_id)
    assert manifest.failures == []
    (row,) = manifest.records
    assert row.response_id == served_id
    assert row.parent_call_id is None and row.mode == "text"
    assert row.model_call_id == recorder.headers[0]["x-ng-model-call-id"]
    assert training.store.exists(rollout_id) is eval_capture


def test_chat_continuation_resolves_parent_and_linearizes(
    training: Training, open_sdk: Any
) -> None:
    rollout_id = "route-continuation"
    client, _ = open_sdk(training.with_eval, rollout_id)
    messages: list[dict[str, Any]] = []
    served: list[str] = []
    for index, question in enumerate(["Which is larger? (A) 2 (B) 3", "And smaller? (A) 5 (B) 4"]):
        messages.append({"role": "user", "content": question})
        served_id, text = chat_call(client, messages, stream=index == 1)
        served.append(served_id)
        messages.append({"role": "assistant", "content": text})
    manifest = training.lineage.manifest(rollout_id)
    assert manifest.failures == []
    first, second = manifest.records
    assert [first.response_id, second.response_id] == served
    assert second.parent_call_id == first.model_call_id
    assert second.prev_len == first.cum_len and second.mode == "token_in"
    outcome = build_receipt(manifest, terminal_response_id=served[-1])
    assert not outcome.masked, outcome.problems
    assert outcome.receipt is not None
    keys = [row.staging_key for row in outcome.receipt.manifest]
    rows = FilesystemStagingSink(training.staging_dir).fetch_raw(keys)
    linear = verify_and_linearize(outcome.receipt, rows)
    assert list(linear.model_call_ids) == [first.model_call_id, second.model_call_id]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_continuation_resolves_parent_and_linearizes(
    training: Training, open_anthropic: Any, stream: bool
) -> None:
    rollout_id = f"route-messages-continuation-{int(stream)}"
    client, recorder = open_anthropic(training.with_eval, rollout_id)
    messages: list[dict[str, Any]] = []
    served: list[str] = []
    for index, question in enumerate(["Which is larger? (A) 2 (B) 3", "And smaller? (A) 5 (B) 4"]):
        messages.append({"role": "user", "content": question})
        served_id, content = messages_call(client, messages, stream=stream and index == 1)
        assert text_of(content)
        served.append(served_id)
        messages.append({"role": "assistant", "content": content})
    for body in recorder.bodies:
        for needle in FORBIDDEN:
            assert needle not in body, needle
    manifest = training.lineage.manifest(rollout_id)
    assert manifest.failures == []
    first, second = manifest.records
    assert [first.response_id, second.response_id] == served
    assert second.parent_call_id == first.model_call_id
    assert second.prev_len == first.cum_len and second.mode == "token_in"
    outcome = build_receipt(manifest, terminal_response_id=served[-1])
    assert not outcome.masked, outcome.problems
    assert outcome.receipt is not None
    keys = [row.staging_key for row in outcome.receipt.manifest]
    rows = FilesystemStagingSink(training.staging_dir).fetch_raw(keys)
    linear = verify_and_linearize(outcome.receipt, rows)
    assert list(linear.model_call_ids) == [first.model_call_id, second.model_call_id]


def test_unresolvable_continuation_is_served_with_a_failure_row(
    training: Training, open_sdk: Any
) -> None:
    rollout_id = "route-unresolved"
    client, _ = open_sdk(training.without_eval, rollout_id)
    chat_call(client, [{"role": "user", "content": "Which is larger? (A) 2 (B) 3"}], stream=False)
    invented = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "an answer nobody served"},
        {"role": "user", "content": "And now?"},
    ]
    _, text = chat_call(client, invented, stream=True)
    assert text
    manifest = training.lineage.manifest(rollout_id)
    assert len(manifest.records) == 1
    assert [f.reason for f in manifest.failures] == ["unresolved_parent"]


def test_call_after_retire_is_served_but_not_admitted(training: Training, open_sdk: Any) -> None:
    rollout_id = "route-retired"
    training.lineage.retire([rollout_id])
    try:
        client, recorder = open_sdk(training.with_eval, rollout_id)
        _, text = responses_call(client, "Which is larger? (A) 2 (B) 3", stream=False)
        assert text
        assert b"ng_commit_coords" not in recorder.bodies[0]
        assert not training.lineage.ledger_path(rollout_id).exists()
    finally:
        training.lineage.delete([rollout_id])


def test_responses_continuation_resolves_parent(training: Training, open_sdk: Any) -> None:
    rollout_id = "route-responses-continuation"
    client, _ = open_sdk(training.without_eval, rollout_id)
    first = client.responses.create(model="sim-model-1", input="Which is larger? (A) 2 (B) 3")
    history: list[Any] = [{"role": "user", "content": "Which is larger? (A) 2 (B) 3"}]
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"role": "user", "content": "And smaller? (A) 5 (B) 4"})
    events = list(client.responses.create(model="sim-model-1", input=history, stream=True))
    assert events[-1].type == "response.completed"
    manifest = training.lineage.manifest(rollout_id)
    assert manifest.failures == []
    parent, child = manifest.records
    assert parent.response_id == first.id
    assert child.parent_call_id == parent.model_call_id


NAMESPACED_TOOLS: list[Any] = [
    {
        "type": "namespace",
        "name": "github",
        "description": "GitHub tools",
        "tools": [
            {
                "type": "function",
                "name": "search",
                "description": "Search issues",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
            }
        ],
    }
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_namespaced_tool_continuation_resolves_parent_and_linearizes(
    training: Training, open_sdk: Any, stream: bool
) -> None:
    rollout_id = f"route-namespaced-{int(stream)}"
    client, recorder = open_sdk(training.with_eval, rollout_id)
    question = {"role": "user", "content": "Find the open issue about capture"}
    if stream:
        events = list(
            client.responses.create(
                model="sim-model-1", input=[question], tools=NAMESPACED_TOOLS, stream=True
            )
        )
        assert events[-1].type == "response.completed"
        first = events[-1].response  # type: ignore[union-attr]
        done = [e.item for e in events if e.type == "response.output_item.done"]  # type: ignore[union-attr]
        assert [item.model_dump(exclude_none=True) for item in done] == [
            item.model_dump(exclude_none=True) for item in first.output
        ]
    else:
        first = client.responses.create(
            model="sim-model-1",
            input=[question],  # type: ignore[list-item]
            tools=NAMESPACED_TOOLS,
        )
    output = [item.model_dump(exclude_none=True) for item in first.output]
    (call,) = [item for item in output if item["type"] == "function_call"]
    assert call["name"] == "search" and call["namespace"] == "github"
    assert b"github__search" not in recorder.bodies[0]
    history: list[Any] = [question, *output]
    history.append(
        {"type": "function_call_output", "call_id": call["call_id"], "output": "issue #6 is open"}
    )
    second = client.responses.create(model="sim-model-1", input=history, tools=NAMESPACED_TOOLS)
    assert second.output_text
    manifest = training.lineage.manifest(rollout_id)
    assert manifest.failures == []
    parent, child = manifest.records
    assert [parent.response_id, child.response_id] == [first.id, second.id]
    assert child.parent_call_id == parent.model_call_id
    assert child.prev_len == parent.cum_len and child.mode == "token_in"
    outcome = build_receipt(manifest, terminal_response_id=second.id)
    assert not outcome.masked, outcome.problems
    assert outcome.receipt is not None
    keys = [row.staging_key for row in outcome.receipt.manifest]
    rows = FilesystemStagingSink(training.staging_dir).fetch_raw(keys)
    linear = verify_and_linearize(outcome.receipt, rows)
    assert list(linear.model_call_ids) == [parent.model_call_id, child.model_call_id]
