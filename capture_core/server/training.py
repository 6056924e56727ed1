"""Training capture routing: admit a call, let the worker stage it, commit its ledger row.

A request on
``/ng-rollout/<id>/training-token-capture/v1/{chat/completions | responses | messages}`` is
handled here (other paths are forwarded untouched):

1. A call id and admission time are minted. A retired rollout's call is served as plain traffic.
   Otherwise the parent is resolved by lineage fingerprint: no model-authored history (or an
   unresolvable one on a rollout with no ledger rows yet) is a ``text`` root, a resolved parent
   gives a ``token_in`` admission carrying the parent's chain, and anything else is served
   without admission after an ``unresolved_parent`` failure row.
2. The worker gets the body with ``ng_capture``, ``stream: false`` (no ``stream_options``) and,
   for Chat, the log-prob flags that make it return token ids.
3. From the worker's JSON the commit coordinates are popped and every token field stripped;
   the client's answer (JSON, or buffered SSE when it asked ``stream: true``) is serialized in
   full, and only then is the ledger row (or the failure row) appended. The first byte goes out
   after that, so a client that has seen an answer can rely on the ledger.

A serialization failure commits nothing: the ledger gets
``request_finished_without_staged_coordinates``; a Responses stream ends in
``response.created`` + ``response.failed``, any other answer is a 500 (an Anthropic ``error``
object for Messages).

With token-id capture on (:mod:`capture_core.server.token_capture`), the gate also records the
call's complete :class:`~capture_core.tokens.TokenEntry` through the token sink: the call is
announced before admission (a refusal, e.g. a retired rollout, fails the call with 409), the
entry is built from the worker's token fields before they are stripped, and it is committed
next to the ledger row, before the first byte. A call that yields no entry (no or bad token
ids, a refused entry, a call served without admission, a POST on another endpoint under the
training prefix answered 2xx) marks the rollout's token capture incomplete; none of this fails
the call. The call's id is the one its model-call capture line carries, when eval capture is
on (:data:`MODEL_CALL_ID_KEY`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import anyio
import orjson
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capture_core._fingerprint import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    lineage_request_items,
)
from capture_core.dialects import dialect_for_path
from capture_core.exceptions import RolloutRetiredError, TokenCaptureFrozenError
from capture_core.lineage import LineageStore, ResolutionStatus
from capture_core.server._asgi import read_body, send_whole
from capture_core.server.buffered_sse import (
    chat_events,
    messages_events,
    responses_events,
    responses_failure_events,
)
from capture_core.server.errors import send_error
from capture_core.server.namespaced_tools import NamespaceMap, flatten_request, restore_output
from capture_core.server.token_capture import ServerTokenCapture, WorkerTokens, read_worker_tokens
from capture_core.server.token_fields import dict_items, strip_token_fields
from capture_core.staging import (
    CAPTURE_ADMISSION_KEY,
    COMMIT_COORDS_KEY,
    CallRecord,
    CaptureAdmission,
    CaptureMode,
    CommitCoords,
    Disposition,
    LedgerFailureReason,
    ManifestFailure,
)
from capture_core.tokens import TokenCallCapture

__all__ = [
    "MODEL_CALL_ID_HEADER",
    "MODEL_CALL_ID_KEY",
    "TRAINING_ROUTE_KEY",
    "TrainingGate",
    "strip_token_fields",
]

logger = logging.getLogger(__name__)

TRAINING_ROUTE_KEY: Final = "ngcapture.training_rollout"
"""Scope key the middleware sets to the rollout id of a valid training-capture request."""
MODEL_CALL_ID_KEY: Final = "ngcapture.model_call_id"
"""Scope key the middleware sets to the id of the call it captures (its capture line's id)."""
MODEL_CALL_ID_HEADER: Final = b"x-ng-model-call-id"
_DIALECTS: Final = frozenset({"chat", "responses", "messages"})
_DROPPED_REQUEST_HEADERS: Final = frozenset({b"content-length", b"accept-encoding"})
_REFUSED_BY_FENCE: Final = (RolloutRetiredError, TokenCaptureFrozenError)

Reason = LedgerFailureReason


@dataclass
class _Call:
    """One training call's state between admission and the first byte."""

    rollout_id: str
    dialect: str
    body: dict[str, Any]
    model_call_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    admitted_at: float = field(default_factory=time.time)
    admission: CaptureAdmission | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    namespaces: NamespaceMap = field(default_factory=dict)
    """Joined ``<ns>__<name>`` tool names the worker saw -> (namespace, short name)."""
    tokens: TokenCallCapture | None = None
    """The call's token-id capture (``None``: token-id capture is off)."""

    @property
    def client_stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def include_usage(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True


@dataclass
class _Upstream:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class TrainingGate:
    """ASGI app for training-capture requests; forwards through ``upstream`` (the proxy).

    Args:
        ledger: the lineage store rows are committed to.
        upstream: the app that forwards a request to the worker (the :class:`UpstreamProxy`).
        tokens: token-id capture (``None``: off).
    """

    def __init__(
        self, ledger: LineageStore, upstream: ASGIApp, *, tokens: ServerTokenCapture | None = None
    ) -> None:
        self.ledger = ledger
        self.upstream = upstream
        self.tokens = tokens

    @staticmethod
    def handles(scope: Scope) -> bool:
        """Whether ``scope`` is a training-capture POST (a dialect call this gate admits, or
        another endpoint it forwards and, with token-id capture on, accounts for)."""
        if scope.get("type") != "http" or not scope.get(TRAINING_ROUTE_KEY):
            return False
        return bool(scope["method"] == "POST")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await read_body(receive)
        if raw is None:
            return
        rollout_id: str = scope[TRAINING_ROUTE_KEY]
        model_call_id = scope.get(MODEL_CALL_ID_KEY) or uuid.uuid4().hex
        dialect = dialect_for_path(scope["path"])
        if dialect is None or dialect.name not in _DIALECTS:
            tokens = self._token_call(rollout_id, model_call_id, None)
            uncaptured = _marking(send, tokens, f"{scope['path']} is not a captured endpoint")
            await self.upstream(scope, _replay(raw, receive), uncaptured)
            return
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            tokens = self._token_call(rollout_id, model_call_id, None)
            judged = _marking(send, tokens, "the request body is not a JSON object")
            await self.upstream(scope, _replay(raw, receive), judged)  # the worker judges it
            return
        call = _Call(rollout_id=rollout_id, dialect=dialect.name, body=body,
                     model_call_id=model_call_id)  # fmt: skip
        send = _with_call_id(send, call.model_call_id)
        call.tokens = self._token_call(rollout_id, model_call_id, body.get("model"))
        if call.tokens is not None and not await self._begin_tokens(call, scope, send):
            return
        if not await self._admit(call):
            unadmitted = _marking(send, call.tokens, "the call was served without admission")
            await self.upstream(scope, _replay(raw, receive), unadmitted)
            return
        answer = await self._ask_worker(scope, receive, call)
        await self._answer(call, answer, send)

    # -- token-id capture --------------------------------------------------------------------

    def _token_call(
        self, rollout_id: str, model_call_id: str, model: object
    ) -> TokenCallCapture | None:
        if self.tokens is None:
            return None
        return self.tokens.call(rollout_id, model_call_id,
                                model=model if isinstance(model, str) else "")  # fmt: skip

    async def _begin_tokens(self, call: _Call, scope: Scope, send: Send) -> bool:
        """Announce the call to the token sink; on a refusal answer with an error, False."""
        assert call.tokens is not None
        try:
            await call.tokens.begin()
        except Exception as exc:
            fenced = isinstance(exc, _REFUSED_BY_FENCE)
            logger.warning("token capture refused call %s of rollout %s: %s", call.model_call_id,
                           call.rollout_id, exc)  # fmt: skip
            message = f"token capture refused the call: {exc}"
            if fenced:
                message += " (delete the rollout's token capture before reusing its id)"
            await send_error(send, scope["path"], 409 if fenced else 503, message)
            return False
        return True

    async def _commit_tokens(
        self, call: _Call, found: WorkerTokens | Exception | None, served: dict[str, Any]
    ) -> None:
        """Build the call's entry from the worker's token fields and the served answer, and
        commit it; anything missing or refused marks the rollout (never raises)."""
        capture, tokens = call.tokens, self.tokens
        assert capture is not None
        assert tokens is not None
        if found is None:
            await capture.missing("the worker's answer carries no token ids")
            return
        if isinstance(found, Exception):
            await capture.missing(f"its token fields are unusable: {found}")
            return
        try:
            entry = tokens.entry(capture, call.dialect, found, served)
        except Exception as exc:
            await capture.missing(f"its token entry is invalid: {exc}")
            return
        await capture.commit(entry)

    # -- admission -------------------------------------------------------------------------

    async def _admit(self, call: _Call) -> bool:
        """Build the call's admission; False when it is served without one."""
        try:
            return await anyio.to_thread.run_sync(self._admit_sync, call)
        except RolloutRetiredError:
            return False
        except Exception as exc:  # fail closed: never stage against an unknown lineage
            raise RuntimeError(
                f"ledger lineage resolution failed for rollout {call.rollout_id}"
            ) from exc

    def _admit_sync(self, call: _Call) -> bool:
        ledger, rid = self.ledger, call.rollout_id
        if ledger.is_retired(rid):
            logger.info("rollout %s is retired: call %s served, not admitted", rid,
                        call.model_call_id)  # fmt: skip
            return False
        call.items = lineage_request_items(call.body)
        resolution = ledger.resolve_parent(
            rid, fingerprint=assistant_fingerprint(call.items), request_items=call.items
        )
        ids = {"rollout_id": rid, "model_call_id": call.model_call_id}
        if resolution.status is ResolutionStatus.RESOLVED and resolution.parent is not None:
            parent = resolution.parent
            call.admission = CaptureAdmission(
                **ids, mode=CaptureMode.TOKEN_IN, parent_call_id=parent.model_call_id,
                prev_len=parent.cum_len, staging_chain=list(resolution.staging_chain),
                parent_chain_hash=parent.chain_hash,
            )  # fmt: skip
        elif resolution.status is ResolutionStatus.ROOT or not ledger.has_rows(rid):
            call.admission = CaptureAdmission(**ids, mode=CaptureMode.TEXT)
        else:
            self._fail(call, Reason.UNRESOLVED_PARENT)
            return False
        return True

    def _fail(self, call: _Call, reason: LedgerFailureReason) -> None:
        failure = ManifestFailure(model_call_id=call.model_call_id, reason=reason.value)
        try:
            self.ledger.record_failure(call.rollout_id, failure)
        except Exception as exc:  # the answer is served either way
            logger.warning("could not record %s for call %s of rollout %s: %s", reason.value,
                           call.model_call_id, call.rollout_id, exc)  # fmt: skip

    # -- the worker ------------------------------------------------------------------------

    async def _ask_worker(self, scope: Scope, receive: Receive, call: _Call) -> _Upstream:
        assert call.admission is not None
        body = dict(call.body)
        if call.dialect == "responses":
            body, call.namespaces = flatten_request(body)
            body = dict(body)
        body[CAPTURE_ADMISSION_KEY] = call.admission.model_dump(mode="json")
        body["stream"] = False
        body.pop("stream_options", None)
        if call.dialect == "chat":
            body.update(logprobs=True, top_logprobs=0, return_tokens_as_token_ids=True)
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _DROPPED_REQUEST_HEADERS]
        upstream = _Upstream()

        async def collect(message: Message) -> None:
            if message["type"] == "http.response.start":
                upstream.status = message["status"]
                upstream.headers = list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                upstream.chunks.append(message.get("body", b""))

        worker_scope = {**scope, "headers": headers}
        await self.upstream(worker_scope, _replay(orjson.dumps(body), receive), collect)
        return upstream

    # -- the answer ------------------------------------------------------------------------

    async def _answer(self, call: _Call, upstream: _Upstream, send: Send) -> None:
        payload = _json_object(upstream)
        if payload is None:  # an error or a broken answer: no completion to commit
            if call.tokens is not None:
                await call.tokens.missing(f"the worker answered with status {upstream.status}")
            await anyio.to_thread.run_sync(
                self._fail, call, Reason.REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES
            )
            await _send(send, upstream.status or 502, _passed_headers(upstream), upstream.body)
            return
        coords = payload.pop(COMMIT_COORDS_KEY, None)
        found = _worker_tokens(call, payload)  # before the fields are stripped
        strip_token_fields(payload, keep_logprobs=call.body.get("logprobs") is True)
        restore_output(payload, call.namespaces)  # before finalize: the row hashes the served form
        try:
            content_type, chunks = _serialize(call, payload)
        except Exception as exc:
            logger.warning("serializing call %s of rollout %s failed: %s", call.model_call_id,
                           call.rollout_id, exc)  # fmt: skip
            if call.tokens is not None:
                await call.tokens.missing(f"its answer could not be serialized: {exc}")
            await anyio.to_thread.run_sync(
                self._fail, call, Reason.REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES
            )
            await _send_failure(call, str(exc), send)
            return
        async with anyio.create_task_group() as group:  # the ledger row and the entry at once
            group.start_soon(partial(anyio.to_thread.run_sync, self._finalize, call, payload,
                                     coords))  # fmt: skip
            if call.tokens is not None:
                group.start_soon(self._commit_tokens, call, found, payload)
        await _send(send, 200, [(b"content-type", content_type)], b"".join(chunks))

    def _finalize(self, call: _Call, served: dict[str, Any], raw_coords: object) -> None:
        """Validate the coordinates and append the ledger row (or the failure row)."""
        if raw_coords is None:
            # A real worker completion without a commit: both rows, as the reference says
            # (the second is the end-of-request "admitted but never committed" check).
            self._fail(call, Reason.WORKER_RESPONSE_MISSING_COMMIT_COORDINATES)
            self._fail(call, Reason.REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)
            return
        row = self._row(call, served, raw_coords)
        if isinstance(row, LedgerFailureReason):
            self._fail(call, row)
            return
        try:
            self.ledger.record(call.rollout_id, row, request_items=call.items)
        except Exception as exc:
            logger.warning("ledger row of call %s in rollout %s refused: %s",
                           call.model_call_id, call.rollout_id, exc)  # fmt: skip
            self._fail(call, Reason.INVALID_WORKER_COMMIT_COORDINATES)

    def _row(
        self, call: _Call, served: dict[str, Any], raw_coords: object
    ) -> CallRecord | LedgerFailureReason:
        admission = call.admission
        assert admission is not None
        try:
            coords = CommitCoords.model_validate(raw_coords)
        except ValidationError:
            return Reason.INVALID_WORKER_COMMIT_COORDINATES
        if (coords.rollout_id, coords.model_call_id) != (call.rollout_id, call.model_call_id):
            return Reason.INVALID_WORKER_COMMIT_COORDINATES
        if coords.disposition is Disposition.CAPTURE_FAILED:
            return Reason.WORKER_CAPTURE_FAILED
        if (coords.parent_call_id, coords.prev_len) != (
            admission.parent_call_id,
            admission.prev_len,
        ):
            return Reason.INVALID_WORKER_COMMIT_COORDINATES
        response_id = served.get("id")
        if not isinstance(response_id, str) or not response_id:
            return Reason.INVALID_WORKER_COMMIT_COORDINATES
        response_items = _response_items(call.dialect, served)
        try:
            return CallRecord(
                **coords.model_dump(
                    include={
                        "model_call_id", "parent_call_id", "prev_len", "delta_len", "cum_len",
                        "weight_version", "digest", "extras_digest", "staging_key",
                        "chain_hash", "cumulative_hash",
                    }
                ),
                mode=admission.mode,
                response_id=response_id,
                admitted_at=call.admitted_at,
                output_fingerprint=assistant_fingerprint(response_items) or None,
                continuation_fingerprint=(
                    assistant_fingerprint([*call.items, *response_items]) or None
                ),
                fingerprint_version=FINGERPRINT_VERSION,
            )  # fmt: skip
        except (ValidationError, TypeError, ValueError):
            return Reason.INVALID_WORKER_COMMIT_COORDINATES


def _worker_tokens(call: _Call, payload: dict[str, Any]) -> WorkerTokens | Exception | None:
    """The worker answer's token fields (``None``: none; an exception: unusable ones)."""
    if call.tokens is None:
        return None
    try:
        return read_worker_tokens(call.dialect, payload)
    except Exception as exc:
        return exc


def _marking(send: Send, tokens: TokenCallCapture | None, reason: str) -> Send:
    """``send`` for a call whose tokens are not captured: a 2xx answer (tokens were likely
    generated) marks the rollout incomplete before the client gets its headers."""
    if tokens is None:
        return send

    async def marked(message: Message) -> None:
        if message["type"] == "http.response.start" and 200 <= message["status"] < 300:
            await tokens.missing(reason)
        await send(message)

    return marked


def _response_items(dialect: str, served: dict[str, Any]) -> list[dict[str, Any]]:
    """The served answer as lineage items (Chat's first choice; the output items; the message)."""
    if dialect == "chat":
        choices = dict_items(served.get("choices"))
        message = choices[0].get("message") if choices else None
        return [message] if isinstance(message, dict) else []
    if dialect == "messages":
        return [{"role": "assistant", "content": served.get("content")}]
    return dict_items(served.get("output"))


def _serialize(call: _Call, payload: dict[str, Any]) -> tuple[bytes, list[bytes]]:
    if not call.client_stream:
        return b"application/json", [orjson.dumps(payload)]
    if call.dialect == "chat":
        return b"text/event-stream", chat_events(payload, include_usage=call.include_usage)
    if call.dialect == "messages":
        return b"text/event-stream", messages_events(payload)
    return b"text/event-stream", responses_events(payload)


async def _send_failure(call: _Call, message: str, send: Send) -> None:
    if call.client_stream and call.dialect == "responses":
        model = call.body.get("model")
        events = responses_failure_events(message, model=model if isinstance(model, str) else None)
        await _send(send, 200, [(b"content-type", b"text/event-stream")], b"".join(events))
        return
    error: dict[str, Any] = {"error": {"message": message, "type": "server_error",
                                       "param": None, "code": "server_error"}}  # fmt: skip
    if call.dialect == "messages":
        error = {"type": "error", "error": {"type": "api_error", "message": message}}
    await _send(send, 500, [(b"content-type", b"application/json")], orjson.dumps(error))


def _json_object(upstream: _Upstream) -> dict[str, Any] | None:
    if upstream.status != 200:
        return None
    try:
        payload = orjson.loads(upstream.body)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None


def _passed_headers(upstream: _Upstream) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in upstream.headers if k.lower() != b"content-length"]


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    if any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers):
        headers = [*headers, (b"cache-control", b"no-cache")]
    await send_whole(send, status, headers, body)


def _with_call_id(send: Send, model_call_id: str) -> Send:
    async def tagged(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", []), (MODEL_CALL_ID_HEADER, model_call_id.encode())]
            message = {**message, "headers": headers}
        await send(message)

    return tagged


def _replay(body: bytes, receive: Receive) -> Callable[[], Awaitable[Message]]:
    """A ``receive`` that gives ``body`` once, then defers to the client's (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
