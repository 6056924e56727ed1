"""The training gate: admit a call, let the worker stage it, commit its ledger row.

The flow is described in :mod:`capture_core.server.training`.
"""

from __future__ import annotations

import logging
import uuid
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
from capture_core.server._asgi import read_body
from capture_core.server.errors import send_error
from capture_core.server.namespaced_tools import flatten_request, restore_output
from capture_core.server.token_capture import ServerTokenCapture, WorkerTokens, read_worker_tokens
from capture_core.server.token_fields import dict_items, strip_token_fields
from capture_core.server.training.answer import (
    _json_object,
    _passed_headers,
    _send,
    _send_failure,
    _serialize,
)
from capture_core.server.training.call import _Call, _Upstream
from capture_core.server.training.channels import _marking, _replay, _with_call_id
from capture_core.server.training.keys import MODEL_CALL_ID_KEY, TRAINING_ROUTE_KEY
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

__all__ = ["TrainingGate"]

logger = logging.getLogger(__name__)

_DIALECTS: Final = frozenset({"chat", "responses", "messages"})
_DROPPED_REQUEST_HEADERS: Final = frozenset({b"content-length", b"accept-encoding"})
_REFUSED_BY_FENCE: Final = (RolloutRetiredError, TokenCaptureFrozenError)

Reason = LedgerFailureReason


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


def _response_items(dialect: str, served: dict[str, Any]) -> list[dict[str, Any]]:
    """The served answer as lineage items (Chat's first choice; the output items; the message)."""
    if dialect == "chat":
        choices = dict_items(served.get("choices"))
        message = choices[0].get("message") if choices else None
        return [message] if isinstance(message, dict) else []
    if dialect == "messages":
        return [{"role": "assistant", "content": served.get("content")}]
    return dict_items(served.get("output"))
