"""SimulatedWorker: bodies and streams per dialect, determinism, faults, and the official SDKs.

In-process tests go through ``httpx.ASGITransport`` (which buffers the body); the SDK tests run
the worker under a real uvicorn server on 127.0.0.1, so streams arrive chunk by chunk.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from capture_core import SSEEvent, extract_response, parse_sse, reassemble_stream
from capture_core.testing._worker_faults import FAULTS, SimulatedDrop
from capture_core.testing.worker import SimulatedWorker, WorkerConfig
from tests._uvicorn import serve_in_thread

FAST = WorkerConfig(ttft_ms=0, ms_per_token=0)
DIALECTS = ("responses", "chat", "messages")
PATHS = {"responses": "/v1/responses", "chat": "/v1/chat/completions", "messages": "/v1/messages"}
MCQA = "Which force keeps the Moon in orbit? (A) magnetism (B) gravity (C) friction (D) tension"
SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
    "required": ["query"],
}
FAULT = "x-ngcapture-fault"


def request(
    dialect: str,
    *,
    prompt: str = MCQA,
    tools: bool = False,
    reasoning: bool = False,
    stream: bool = False,
    usage: bool = True,
) -> dict[str, Any]:
    """A request body of the dialect; chat streams ask for usage unless ``usage=False``."""
    body: dict[str, Any] = {"model": "sim-model-1"}
    if dialect == "responses":
        body["input"] = [{"role": "user", "content": prompt}]
        if tools:
            body["tools"] = [{"type": "function", "name": "lookup", "parameters": SCHEMA}]
        if reasoning:
            body["reasoning"] = {"effort": "low"}
    elif dialect == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        if tools:
            function = {"name": "lookup", "parameters": SCHEMA}
            body["tools"] = [{"type": "function", "function": function}]
        if reasoning:
            body["reasoning_effort"] = "low"
        if stream and usage:
            body["stream_options"] = {"include_usage": True}
    else:
        body["max_tokens"] = 2048
        body["messages"] = [{"role": "user", "content": prompt}]
        if tools:
            body["tools"] = [{"name": "lookup", "input_schema": SCHEMA}]
        if reasoning:
            body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    if stream:
        body["stream"] = True
    return body


def call(
    worker: SimulatedWorker,
    dialect: str,
    body: Any,
    *,
    headers: dict[str, str] | None = None,
    query: str = "",
    raise_app_exceptions: bool = True,
) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=worker, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            content = body if isinstance(body, bytes) else orjson.dumps(body)
            return await client.post(PATHS[dialect] + query, content=content, headers=headers)

    return asyncio.run(go())


def events_of(response: httpx.Response) -> list[SSEEvent]:
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(response.content)


# --- bodies and streams ---------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("tools", "reasoning"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_streamed_and_plain_calls_give_the_same_facts(
    dialect: str, tools: bool, reasoning: bool
) -> None:
    worker = SimulatedWorker(FAST)
    plain = call(worker, dialect, request(dialect, tools=tools, reasoning=reasoning))
    streamed = call(
        worker, dialect, request(dialect, tools=tools, reasoning=reasoning, stream=True)
    )
    assert plain.status_code == streamed.status_code == 200
    assert plain.headers["content-type"] == "application/json"
    assert events_of(streamed)
    rebuilt = reassemble_stream(dialect, streamed.content)
    assert rebuilt.terminal == "complete"
    assert rebuilt.response is not None
    facts = extract_response(dialect, plain.json())
    assert facts == extract_response(dialect, rebuilt.response)
    assert _texts(dialect, plain.json()) == _texts(dialect, rebuilt.response)
    assert facts.model == "sim-model-1"
    assert facts.response_id is not None
    assert facts.response_id.startswith(
        {"responses": "resp_", "chat": "chatcmpl-", "messages": "msg_"}[dialect]
    )
    tokens = facts.tokens
    assert tokens.tokens_in is not None and tokens.tokens_in > 10
    assert tokens.tokens_out is not None and tokens.tokens_out > 0
    if reasoning and dialect != "messages":
        assert (tokens.tokens_reasoning or 0) > 0
    else:  # Anthropic's usage, like the real API's, reports no thinking tokens
        assert not tokens.tokens_reasoning
    assert (facts.reasoning is not None) is reasoning
    if tools:
        (tool,) = facts.tool_calls
        assert tool.name == "lookup"
        arguments = (
            tool.arguments if isinstance(tool.arguments, dict) else json.loads(str(tool.arguments))
        )
        assert set(arguments) == {"query", "k"} and isinstance(arguments["k"], int)
    else:
        assert facts.tool_calls == ()


def _texts(dialect: str, body: dict[str, Any]) -> str:
    if dialect == "responses":
        return "".join(
            part["text"]
            for item in body["output"]
            if item["type"] == "message"
            for part in item["content"]
        )
    if dialect == "chat":
        return str(body["choices"][0]["message"]["content"] or "")  # null with tool calls
    return "".join(block["text"] for block in body["content"] if block["type"] == "text")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_multiple_choice_prompts_get_a_letter(dialect: str) -> None:
    body = call(SimulatedWorker(FAST), dialect, request(dialect)).json()
    assert re.fullmatch(r"The answer is \([A-D]\)\.", _texts(dialect, body))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_after_a_tool_result_the_worker_answers_with_text(dialect: str) -> None:
    body = request(dialect, tools=True)
    if dialect == "responses":
        body["input"] += [
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "gravity"},
        ]
    elif dialect == "chat":
        call_1 = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": "{}"},
        }
        body["messages"] += [
            {"role": "assistant", "content": None, "tool_calls": [call_1]},
            {"role": "tool", "tool_call_id": "call_1", "content": "gravity"},
        ]
    else:
        use = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "gravity"}
        body["messages"] += [
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
    answer = call(SimulatedWorker(FAST), dialect, body).json()
    assert extract_response(dialect, answer).tool_calls == ()
    assert "answer is (" in _texts(dialect, answer)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_choice_none_gets_text(dialect: str) -> None:
    body = request(dialect, tools=True)
    body["tool_choice"] = {"type": "none"} if dialect == "messages" else "none"
    answer = call(SimulatedWorker(FAST), dialect, body).json()
    assert extract_response(dialect, answer).tool_calls == ()


def test_chat_reasoning_from_the_model_name() -> None:
    body = {"model": "sim-reasoner", "messages": [{"role": "user", "content": "Why?"}]}
    answer = call(SimulatedWorker(FAST), "chat", body).json()
    assert answer["choices"][0]["message"]["reasoning_content"]
    assert answer["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_chat_stream_sends_usage_only_when_asked() -> None:
    worker = SimulatedWorker(FAST)
    without = events_of(call(worker, "chat", request("chat", stream=True, usage=False)))
    assert all("usage" not in (e.json() or {}) for e in without)
    assert without[-1].data == "[DONE]"
    with_usage = events_of(call(worker, "chat", request("chat", stream=True)))
    assert with_usage[-2].json()["choices"] == [] and with_usage[-2].json()["usage"]
    assert len(with_usage) == len(without) + 1


@pytest.mark.parametrize(("rate", "cached"), [(1.0, True), (0.0, False)])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_cache_rate(dialect: str, rate: float, cached: bool) -> None:
    worker = SimulatedWorker(WorkerConfig(ttft_ms=0, ms_per_token=0, cache_rate=rate))
    tokens = extract_response(dialect, call(worker, dialect, request(dialect)).json()).tokens
    assert bool(tokens.cached_tokens) is cached
    assert tokens.tokens_in is not None and (tokens.cached_tokens or 0) < tokens.tokens_in


@pytest.mark.parametrize(
    ("dialect", "limit", "reason"),
    [("responses", "max_output_tokens", "max_output_tokens"), ("chat", "max_tokens", "length"),
     ("messages", "max_tokens", "max_tokens")],
)  # fmt: skip
def test_an_output_limit_cuts_the_answer(dialect: str, limit: str, reason: str) -> None:
    body = {**request(dialect, reasoning=True), limit: 3}
    facts = extract_response(dialect, call(SimulatedWorker(FAST), dialect, body).json())
    assert facts.tokens.tokens_out == 3
    assert facts.finish_reason == reason or facts.response_status == "incomplete"


def test_models_and_health() -> None:
    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=SimulatedWorker(WorkerConfig(models=("a", "b"))))
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            paths = ("/v1/models", "/health", "/v1/embeddings", "/v1/messages")
            return [await client.get(path) for path in paths]

    models, health, missing, wrong_method = asyncio.run(go())
    assert (missing.status_code, wrong_method.status_code) == (404, 405)
    assert missing.json()["error"]["message"] and wrong_method.json()["type"] == "error"
    assert models.status_code == health.status_code == 200
    listing = models.json()
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == ["a", "b"]
    assert all(set(m) == {"id", "object", "created", "owned_by"} for m in listing["data"])
    assert all(m["object"] == "model" for m in listing["data"])
    assert health.json() == {"status": "ok"}


# --- determinism ----------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
def test_same_seed_same_bytes(dialect: str, stream: bool) -> None:
    body = request(dialect, tools=True, reasoning=True, stream=stream)
    first = call(SimulatedWorker(WorkerConfig(seed=7, ttft_ms=0, ms_per_token=0)), dialect, body)
    second = call(SimulatedWorker(WorkerConfig(seed=7, ttft_ms=0, ms_per_token=0)), dialect, body)
    assert first.content == second.content
    assert first.headers["x-request-id"] == second.headers["x-request-id"]


def test_another_seed_changes_some_answer() -> None:
    prompts = [MCQA, "Say something.", "What is 2 + 2? (A) 3 (B) 4", "Name a colour."]
    bodies = [(d, request(d, prompt=p)) for d in DIALECTS for p in prompts]
    answers = {
        seed: [
            call(SimulatedWorker(WorkerConfig(seed=seed, ttft_ms=0, ms_per_token=0)), d, b).json()
            for d, b in bodies
        ]
        for seed in (1, 2)
    }
    texts = {
        seed: [_texts(d, a) for (d, _), a in zip(bodies, got, strict=True)]
        for seed, got in answers.items()
    }
    assert texts[1] != texts[2]
    assert answers[1][0]["id"] != answers[2][0]["id"]


def test_requests_served_counts_model_calls() -> None:
    worker = SimulatedWorker(FAST)
    call(worker, "chat", request("chat"))
    call(worker, "messages", request("messages"), headers={FAULT: "429"})
    call(worker, "responses", b"not json")
    assert worker.requests_served == 3


# --- bad requests and faults ----------------------------------------------------------------


def _error_message(dialect: str, response: httpx.Response) -> str:
    body = response.json()
    if dialect == "messages":
        assert body["type"] == "error"
    return str(body["error"]["message"])


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("payload", "needle"),
    [(b"{nope", "not valid JSON"), (b"[1, 2]", "JSON object"), (b"", "not valid JSON"),
     (b'{"model": "m"}', "field required"), (b'{"input": [], "messages": []}', "model")],
)  # fmt: skip
def test_bad_requests_get_400_in_the_dialects_shape(
    dialect: str, payload: bytes, needle: str
) -> None:
    response = call(SimulatedWorker(FAST), dialect, payload)
    assert response.status_code == 400
    assert needle in _error_message(dialect, response)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("status", [401, 429, 500, 503])
def test_status_faults(dialect: str, status: int) -> None:
    worker = SimulatedWorker(FAST)
    response = call(worker, dialect, request(dialect), headers={FAULT: str(status)})
    assert response.status_code == status
    assert _error_message(dialect, response)
    assert (response.headers.get("retry-after") == "0") is (status == 429)
    by_query = call(worker, dialect, request(dialect), query=f"?fault={status}")
    assert (by_query.status_code, by_query.content) == (status, response.content)


def test_unknown_fault_names_the_allowed_values() -> None:
    response = call(SimulatedWorker(FAST), "chat", request("chat"), headers={FAULT: "explode"})
    assert response.status_code == 400
    message = _error_message("chat", response)
    assert "explode" in message and all(name in message for name in FAULTS)


def test_bad_fault_delay() -> None:
    headers = {FAULT: "timeout", "x-ngcapture-fault-delay": "soon"}
    response = call(SimulatedWorker(FAST), "chat", request("chat"), headers=headers)
    assert response.status_code == 400


@pytest.mark.parametrize("stream", [False, True])
def test_timeout_delays_then_answers_normally(stream: bool) -> None:
    worker = SimulatedWorker(FAST)
    started = time.monotonic()
    headers = {FAULT: "timeout", "x-ngcapture-fault-delay": "0.3"}
    delayed = call(worker, "messages", request("messages", stream=stream), headers=headers)
    assert time.monotonic() - started >= 0.3
    assert delayed.content == call(worker, "messages", request("messages", stream=stream)).content


def test_slow_paces_every_event_and_none_is_no_fault() -> None:
    worker = SimulatedWorker(FAST)
    body = request("chat", stream=True)
    started = time.monotonic()
    headers = {FAULT: "slow", "x-ngcapture-fault-delay": "0.02"}
    slow = call(worker, "chat", body, headers=headers, query="?fault=none")
    elapsed = time.monotonic() - started
    normal = call(worker, "chat", body, query="?fault=none")
    assert slow.content == normal.content
    assert elapsed >= 0.02 * (len(events_of(normal)) - 1)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
def test_drop_aborts_mid_body(dialect: str, stream: bool) -> None:
    worker = SimulatedWorker(FAST)
    body = request(dialect, stream=stream)
    with pytest.raises(SimulatedDrop):
        call(worker, dialect, body, headers={FAULT: "drop"})
    partial = call(worker, dialect, body, headers={FAULT: "drop"}, raise_app_exceptions=False)
    full = call(worker, dialect, body).content
    assert partial.status_code == 200
    assert 0 < len(partial.content) < len(full) and full.startswith(partial.content)
    if stream:
        assert reassemble_stream(dialect, partial.content).terminal is None
    else:
        assert int(partial.headers["content-length"]) == len(full)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_truncate_ends_the_stream_cleanly_without_its_terminal(dialect: str) -> None:
    worker = SimulatedWorker(FAST)
    cut = call(worker, dialect, request(dialect, stream=True), headers={FAULT: "truncate"})
    assert events_of(cut)
    rebuilt = reassemble_stream(dialect, cut.content)
    assert rebuilt.terminal is None and rebuilt.response is not None
    full = call(worker, dialect, request(dialect, stream=True)).content
    assert full.startswith(cut.content) and len(cut.content) < len(full)
    plain = call(worker, dialect, request(dialect), headers={FAULT: "truncate"})
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(plain.content)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_inband_error(dialect: str) -> None:
    worker = SimulatedWorker(FAST)
    body = request(dialect, prompt="Tell me a long story about the sea, please.", stream=True)
    response = call(worker, dialect, body, headers={FAULT: "inband_error"})
    assert response.status_code == 200
    events = events_of(response)
    assert reassemble_stream(dialect, response.content).terminal == "error"
    last = events[-1].json()
    if dialect == "responses":
        assert events[-1].event == last["type"] == "response.failed"
        assert last["response"]["status"] == "failed"
        assert last["response"]["error"]["code"] == "server_error"
        deltas = [e for e in events if e.event == "response.output_text.delta"]
        assert last["sequence_number"] == events[-2].json()["sequence_number"] + 1
    elif dialect == "chat":
        assert events[-1].event is None and last["error"]["message"]
        assert all(e.data != "[DONE]" for e in events)
        deltas = [e for e in events[:-1] if e.json()["choices"][0]["delta"].get("content")]
    else:
        assert events[-1].event == "error"
        assert last == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": last["error"]["message"]},
        }
        deltas = [e for e in events if e.event == "content_block_delta"]
    assert len(deltas) == 2
    plain = call(worker, dialect, request(dialect), headers={FAULT: "inband_error"})
    facts = extract_response(dialect, plain.json())
    assert plain.status_code == 200 and (facts.error_message or facts.response_status == "failed")


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
def test_malformed_is_200_json_that_does_not_parse(dialect: str, stream: bool) -> None:
    response = call(
        SimulatedWorker(FAST),
        dialect,
        request(dialect, stream=stream),
        headers={FAULT: "malformed"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(response.content)


# --- a real server and the official SDKs ----------------------------------------------------


@dataclass
class Served:
    worker: SimulatedWorker
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def openai(self, **options: Any) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="x", max_retries=0, timeout=10, **options
        )

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key="x", max_retries=0, timeout=10)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    worker = SimulatedWorker(WorkerConfig(seed=5, ttft_ms=5, ms_per_token=0.5))
    with serve_in_thread(worker) as port:
        yield Served(worker, port)


def test_events_arrive_one_by_one(served: Served) -> None:
    arrivals: list[float] = []
    body = request(
        "messages", prompt="Describe the sea in a few words.", reasoning=True, stream=True
    )
    with httpx.Client(base_url=served.url, timeout=10) as client:
        started = time.monotonic()
        with client.stream("POST", "/v1/messages", json=body) as response:
            for _ in response.iter_raw():
                arrivals.append(time.monotonic() - started)
    assert arrivals[0] >= 0.005
    assert len(arrivals) > 5 and arrivals[-1] - arrivals[0] > 0.005


def test_a_client_leaving_a_slow_stream_does_not_hang_the_worker(served: Served) -> None:
    body = request("responses", stream=True)
    headers = {FAULT: "slow", "x-ngcapture-fault-delay": "5"}
    with httpx.Client(base_url=served.url, timeout=10) as client:
        started = time.monotonic()
        with client.stream("POST", "/v1/responses", json=body, headers=headers) as response:
            first = next(response.iter_raw())
        assert first.startswith(b"event: response.created")
        health = client.get("/health")
    assert health.status_code == 200 and time.monotonic() - started < 4


def test_openai_responses(served: Served) -> None:
    with served.openai() as client:
        kwargs: dict[str, Any] = {
            "model": "sim-model-2",
            "input": MCQA,
            "reasoning": {"effort": "low"},
        }
        plain = client.responses.create(**kwargs)
        assert plain.id.startswith("resp_") and plain.model == "sim-model-2"
        assert re.fullmatch(r"The answer is \([A-D]\)\.", plain.output_text)
        assert plain.output[0].type == "reasoning"
        assert plain.usage is not None and plain.usage.output_tokens_details.reasoning_tokens > 0
        with client.responses.create(**kwargs, stream=True) as stream:
            kinds = [event.type for event in stream]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert "response.output_text.delta" in kinds
        with client.responses.stream(**kwargs) as helper:
            final = helper.get_final_response()
        assert final.output_text == plain.output_text and final.usage == plain.usage
        tooled = client.responses.create(
            model="m",
            input="Find the Moon's distance.",
            tools=request("responses", tools=True)["tools"],
        )
        calls = [item for item in tooled.output if item.type == "function_call"]
        assert [c.name for c in calls] == ["lookup"] and "query" in json.loads(calls[0].arguments)


def test_openai_chat_with_tools(served: Served) -> None:
    tools = request("chat", tools=True)["tools"]
    messages: Any = [{"role": "user", "content": "Find the Moon's distance."}]
    with served.openai() as client:
        plain = client.chat.completions.create(model="m", messages=messages, tools=tools)
        choice = plain.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        (tool_call,) = choice.message.tool_calls
        assert tool_call.type == "function" and tool_call.function.name == "lookup"
        arguments = ""
        usage = None
        stream = client.chat.completions.create(
            model="m",
            messages=messages,
            tools=tools,
            stream=True,
            stream_options={"include_usage": True},
        )
        with stream:
            for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for delta_call in (
                    (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []
                ):
                    arguments += delta_call.function.arguments or "" if delta_call.function else ""
        assert arguments == tool_call.function.arguments
        assert usage == plain.usage


def test_anthropic_messages(served: Served) -> None:
    with served.anthropic() as client:
        tools: Any = request("messages", tools=True)["tools"]
        message = client.messages.create(
            model="sim-model-1",
            max_tokens=1024,
            messages=[{"role": "user", "content": "Find the Moon's distance."}],
            tools=tools,
        )
        assert message.stop_reason == "tool_use"
        (use,) = [block for block in message.content if block.type == "tool_use"]
        assert use.name == "lookup" and "query" in use.input
        thinking: Any = {"type": "enabled", "budget_tokens": 1024}
        kwargs: dict[str, Any] = {
            "model": "sim-model-1",
            "max_tokens": 2048,
            "messages": [{"role": "user", "content": MCQA}],
            "thinking": thinking,
        }
        with client.messages.stream(**kwargs) as stream:
            final = stream.get_final_message()
        assert [block.type for block in final.content] == ["thinking", "text"]
        assert final.stop_reason == "end_turn"
        plain = client.messages.create(**kwargs)
        assert [b.model_dump(exclude={"parsed_output"}) for b in final.content] == [
            b.model_dump() for b in plain.content
        ]
        assert plain.usage.output_tokens == final.usage.output_tokens > 0
        assert final.usage.output_tokens_details is None  # no thinking-token count, as Anthropic


def test_sdk_errors_for_faults(served: Served) -> None:
    body: Any = [{"role": "user", "content": "Tell me a long story about the sea, please."}]
    with served.openai() as client:
        with pytest.raises(openai.RateLimitError):
            client.responses.create(model="m", input="x", extra_headers={FAULT: "429"})
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=body, extra_headers={FAULT: "500"})
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="m", messages=body, extra_headers={FAULT: "401"})
        stream = client.chat.completions.create(
            model="m", messages=body, stream=True, extra_headers={FAULT: "inband_error"}
        )
        seen: list[Any] = []
        with stream, pytest.raises(openai.APIError, match="inband_error"):
            seen.extend(stream)
        assert len(seen) >= 2
        with pytest.raises(openai.APIConnectionError):
            list(
                client.responses.create(
                    model="m", input="x", stream=True, extra_headers={FAULT: "drop"}
                )
            )
        with pytest.raises(openai.APITimeoutError):
            client.with_options(timeout=0.3).responses.create(
                model="m", input="x", extra_headers={FAULT: "timeout"}
            )
    with served.anthropic() as client:
        with pytest.raises(anthropic.RateLimitError):
            client.messages.create(
                model="m", max_tokens=64, messages=body, extra_headers={FAULT: "429"}
            )
        with (
            pytest.raises(anthropic.APIError, match="overloaded_error"),
            client.messages.stream(
                model="m", max_tokens=64, messages=body, extra_headers={FAULT: "inband_error"}
            ) as message_stream,
        ):
            message_stream.get_final_message()
