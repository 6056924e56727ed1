"""A simulated OpenAI/Anthropic-compatible inference worker: an ASGI app, deterministic for a seed.

It serves ``POST /v1/responses``, ``/v1/chat/completions`` and ``/v1/messages`` (streaming and
not), ``GET /v1/models``, ``GET /health`` and ``GET /stats`` (calls served, and calls whose
client went away mid-generation: the worker stops generating those), answering with the
bodies and SSE event sequences of :mod:`capture_core.testing.bodies` and
:mod:`capture_core.testing.streams`, which the official ``openai`` and ``anthropic`` SDKs
parse. The answer depends only on the seed, the dialect and the request body without
``stream``/``stream_options``, so a streamed and a non-streamed call of one request get the
same text, tool calls and usage.

What a request gets:

* text: ``"The answer is (B)."``-style for multiple-choice prompts, a short sentence otherwise;
* reasoning when asked for (Responses ``reasoning``; Chat ``reasoning_effort`` or a model name
  containing ``reason``; Messages ``thinking: {"type": "enabled"}``);
* a call of the first tool, with arguments named after its schema's properties, when the request
  has tools and its last message is not a tool result;
* usage counted from the request and the answer; cached tokens with probability ``cache_rate``;
* a ``length`` stop when the request's output-token limit is below the answer's size.

Faults are chosen per request with the ``x-ngcapture-fault`` header (or ``?fault=``):

* ``429``, ``500``, ``503``, ``401``: that status with the dialect's error body
  (``retry-after: 0`` on 429), before the body is read;
* ``timeout``: wait ``x-ngcapture-fault-delay`` seconds (default 30, at most 120), then answer
  normally; the wait ends early if the client goes away;
* ``slow``: a stream whose events each wait ``x-ngcapture-fault-delay`` seconds (default 0.25);
  not streamed: two thirds of the body, that wait, then the rest;
* ``drop``: send part of the body, then abort the connection (raises ``SimulatedDrop`` inside
  the app, so the server closes the socket mid-body);
* ``truncate``: a stream that ends cleanly without its terminal event (a non-streaming body is
  cut in half, with a matching ``content-length``);
* ``inband_error``: a 200 stream with two content events, then the dialect's in-band error
  (``response.failed``; a data-only ``{"error": ...}`` and no ``[DONE]``; ``event: error`` of
  type ``overloaded_error``); a non-streaming call gets that error object with status 200;
* ``malformed``: 200 ``application/json`` whose body is not valid JSON (streaming or not);
* ``none``: no fault. Any other value gets a 400 naming the allowed ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from capture_core.testing import _worker_faults as faults
from capture_core.testing._worker_answers import compose_answer
from capture_core.testing._worker_streaming import _generation_s, _stream, _ttft_s
from capture_core.testing._worker_training import TRAINING_KEY, TrainingStager
from capture_core.testing.answers import Answer, error_body
from capture_core.testing.bodies import chat_body, messages_body, responses_body

__all__ = ["SimulatedWorker", "WorkerConfig"]

_PATHS: Final = {
    "responses": "/v1/responses",
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
}
_REQUIRED: Final = {"responses": "input", "chat": "messages", "messages": "messages"}
_CREATED: Final = 1786032154


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How the simulated worker answers.

    Attributes:
        seed: answers are a pure function of the seed, the dialect and the request body.
        ttft_ms: delay before the first byte of a response.
        ms_per_token: delay per generated token (between streamed content events; before the
            body of a non-streaming answer); at most ``MAX_GENERATION_S`` per response.
        models: ids listed by ``GET /v1/models`` (any model name is accepted in requests).
        cache_rate: probability that a prompt reports cached tokens.
        staging_dir: where requests carrying ``ng_capture`` stage their tokens (training
            mode); ``None`` refuses such requests.
        weight_version: the policy weight version stamped on staged calls.
        routed_experts: training mode also returns (and stages) per-token routed experts.
    """

    seed: int = 0
    ttft_ms: float = 15.0
    ms_per_token: float = 0.2
    models: tuple[str, ...] = ("sim-model-1", "sim-model-2")
    cache_rate: float = 0.3
    staging_dir: str | None = None
    weight_version: int = 1
    routed_experts: bool = False


class SimulatedWorker:
    """An OpenAI/Anthropic-compatible inference worker for tests and demos (ASGI 3 app).

    Serve it with uvicorn (``ngcapture worker``) or call it in-process; each request may ask for
    a fault with the ``x-ngcapture-fault`` header (see the module docstring).

    Example:
        >>> import asyncio, httpx
        >>> worker = SimulatedWorker(WorkerConfig(seed=1, ttft_ms=0, ms_per_token=0))
        >>> async def ask(body: dict) -> dict:
        ...     transport = httpx.ASGITransport(app=worker)
        ...     async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
        ...         return (await client.post("/v1/chat/completions", json=body)).json()
        >>> question = [{"role": "user", "content": "Which is larger? (A) 2 (B) 3"}]
        >>> asyncio.run(ask({"model": "m", "messages": question}))["choices"][0]["message"]
        {'role': 'assistant', 'content': 'The answer is (B).'}
        >>> worker.requests_served
        1
    """

    def __init__(self, config: WorkerConfig | None = None) -> None:
        self._config = config or WorkerConfig()
        self._served = 0
        self._cancelled = _Count()
        directory = self._config.staging_dir
        self._stager = (
            TrainingStager(directory, seed=self._config.seed,
                           weight_version=self._config.weight_version,
                           routed_experts=self._config.routed_experts)
            if directory is not None
            else None
        )  # fmt: skip
        routes = [
            Route(path, self._endpoint(dialect), methods=["POST"])
            for dialect, path in _PATHS.items()
        ]
        routes += [
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", _health, methods=["GET"]),
            Route("/stats", self._stats, methods=["GET"]),
        ]
        self._app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})

    @property
    def config(self) -> WorkerConfig:
        """The configuration the worker was made with."""
        return self._config

    @property
    def requests_served(self) -> int:
        """Model calls received on the three dialect routes, faulty ones included."""
        return self._served

    @property
    def requests_cancelled(self) -> int:
        """Model calls whose client went away while the answer was being generated (the
        worker stopped generating it)."""
        return self._cancelled.value

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    async def _stats(self, request: Request) -> Response:
        return faults.json_response(
            {"requests_served": self._served, "requests_cancelled": self._cancelled.value}
        )

    async def _models(self, request: Request) -> Response:
        data = [
            {"id": m, "object": "model", "created": _CREATED, "owned_by": "ngcapture"}
            for m in self._config.models
        ]
        return faults.json_response({"object": "list", "data": data})

    def _endpoint(self, dialect: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            self._served += 1
            return await _answer(dialect, request, self._config, self._stager, self._cancelled)

        return endpoint


async def _health(request: Request) -> Response:
    return faults.json_response({"status": "ok"})


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    headers = exc.headers if isinstance(exc, HTTPException) else None
    dialect = "messages" if request.url.path.endswith("/messages") else "chat"
    message = f"{request.method} {request.url.path}: {exc}"
    body = error_body(dialect, status, message)
    return faults.json_response(body, status=status, headers=headers)


@dataclass
class _Count:
    value: int = 0


async def _answer(
    dialect: str,
    request: Request,
    config: WorkerConfig,
    stager: TrainingStager | None,
    cancelled: _Count,
) -> Response:
    def bad(message: str) -> Response:
        return faults.json_response(error_body(dialect, 400, message), status=400)

    try:
        fault = faults.read_fault(request.headers, request.query_params)
    except ValueError as exc:
        return bad(str(exc))
    if fault.status is not None:
        return faults.status_response(dialect, fault.status)
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        return bad(f"request body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        return bad("request body must be a JSON object")
    for name in ("model", _REQUIRED[dialect]):
        if name not in body:
            return bad(f"{name}: field required")
    if not isinstance(body["model"], str):
        return bad("model: must be a string")
    if fault.kind == "timeout" and await _disconnected_within(request, fault.delay_s):
        cancelled.value += 1
        return Response(status_code=499)  # nobody is listening any more
    answer = compose_answer(dialect, body, seed=config.seed, cache_rate=config.cache_rate)
    request_id = "req_" + answer.response_id[-24:]
    headers = {"x-request-id": request_id, "request-id": request_id}
    stream = body.get("stream") is True
    if TRAINING_KEY in body:
        return await _training_answer(dialect, body, answer, stager, stream=stream)
    if stream and fault.kind != "malformed":
        return _stream(
            dialect,
            body=body,
            answer=answer,
            config=config,
            fault=fault,
            headers=headers,
            cancelled=cancelled,
        )
    generation_s = _ttft_s(config) + _generation_s(config, answer.output_tokens)
    if generation_s > 0 and await _disconnected_within(request, generation_s):
        cancelled.value += 1  # the client left: stop generating, like a real engine
        return Response(status_code=499)
    payload = orjson.dumps(_body(dialect, answer))
    if fault.kind in ("malformed", "truncate"):
        return Response(faults.cut_json(payload), 200, headers, media_type="application/json")
    if fault.kind == "drop":
        return faults.dropped_json(payload, headers)
    if fault.kind == "inband_error":
        return faults.json_response(faults.inband_body(dialect, answer), headers=headers)
    if fault.kind == "slow":

        def stopped() -> None:
            cancelled.value += 1

        return faults.slow_json(payload, headers, fault.delay_s, stopped)
    return Response(payload, 200, headers, media_type="application/json")


async def _training_answer(
    dialect: str, body: dict[str, Any], answer: Answer, stager: TrainingStager | None,
    *, stream: bool,
) -> Response:  # fmt: skip
    """Training mode: stage the tokens, answer with token fields and commit coordinates."""
    if stream:
        message = "external staging requires non-streaming backend requests"
        return faults.json_response(error_body(dialect, 422, message), status=422)  # fmt: skip
    if stager is None:
        message = "this worker has no staging directory (ngcapture worker --staging-dir)"
        return faults.json_response(error_body(dialect, 503, message), status=503)
    payload = _body(dialect, answer)
    try:
        await asyncio.to_thread(stager.stage, dialect, body, answer, payload)
    except ValueError as exc:
        return faults.json_response(error_body(dialect, 400, f"ng_capture: {exc}"), status=400)
    return Response(orjson.dumps(payload), 200, media_type="application/json")


async def _disconnected_within(request: Request, seconds: float) -> bool:
    """Sleep ``seconds``; return early (True) if the client goes away first."""

    async def disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    try:
        await asyncio.wait_for(disconnect(), seconds)
    except TimeoutError:
        return False
    return True


def _body(dialect: str, answer: Answer) -> dict[str, Any]:
    if dialect == "responses":
        return responses_body(answer)
    if dialect == "chat":
        return chat_body(answer)
    return messages_body(answer)
