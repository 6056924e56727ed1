"""The training-capture control plane: read a rollout's manifest, retire or delete its ledger.

Three bearer-protected routes under :data:`CONTROL_PREFIX`::

    GET  /training-token-capture/control/rollouts/{rollout_id}/manifest
    POST /training-token-capture/control/rollouts/retire   {"rollout_ids": [...]}
    POST /training-token-capture/control/rollouts/delete   {"rollout_ids": [...]}

Every request is authenticated before anything else is looked at (path, method or body): the
whole ``Authorization`` value is hashed and compared with the hash of ``"Bearer <token>"`` by
:func:`hmac.compare_digest`, so the comparison neither stops at the first differing byte nor
reveals the token's length. Statuses: 401 (bad or missing token), 404/405 (no such route),
422 (a body that is not ``{"rollout_ids": [1..4096 strings]}``), 400 (an invalid rollout id;
nothing changed), 410 (manifest of a retired rollout), 413 (body too large). Error bodies are
``{"detail": ...}``. Ledger calls block on the disk, so they run in a worker thread.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Annotated, Any, Final, Protocol

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from capture_core.exceptions import CaptureError, InvalidRolloutIdError, RolloutRetiredError
from capture_core.ids import validate_rollout_id
from capture_core.server.settings import CaptureSettings
from capture_core.staging import RolloutManifest, RolloutRemoval

__all__ = [
    "CONTROL_PREFIX",
    "MAX_ROLLOUT_IDS",
    "ControlApp",
    "ControlTokenError",
    "LedgerControl",
    "RolloutIdsBody",
    "control_app",
    "load_control_token",
]

logger = logging.getLogger(__name__)

CONTROL_PREFIX: Final = "/training-token-capture/control"
MAX_ROLLOUT_IDS: Final = 4096
MAX_BODY_BYTES: Final = 2 * 1024 * 1024  # 4096 ids of 200 characters fit in well under 1 MiB
UNAUTHORIZED_DETAIL: Final = "missing or invalid control-plane bearer token"
_MANIFEST: Final = re.compile(rf"^{CONTROL_PREFIX}/rollouts/(?P<rollout_id>.+)/manifest$")
_REMOVALS: Final = {
    f"{CONTROL_PREFIX}/rollouts/retire": "retire",
    f"{CONTROL_PREFIX}/rollouts/delete": "delete",
}
_TOKEN_CHARS: Final = re.compile(r"[\x21-\x7e]+")


class LedgerControl(Protocol):
    """What the control routes need from a lineage ledger (``capture_core.lineage``)."""

    def manifest(self, rollout_id: str) -> RolloutManifest:
        """The rollout's manifest; raises :class:`RolloutRetiredError` once it is retired."""
        ...

    def retire(self, rollout_ids: Sequence[str]) -> RolloutRemoval:
        """Fence and remove the ledgers; validates the whole batch before changing anything."""
        ...

    def delete(self, rollout_ids: Sequence[str]) -> RolloutRemoval:
        """Remove ledgers and fences; validates the whole batch before changing anything."""
        ...


class RolloutIdsBody(BaseModel):
    """The body of the retire and delete routes: 1 to 4096 rollout ids, nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_ids: Annotated[list[StrictStr], Field(min_length=1, max_length=MAX_ROLLOUT_IDS)]


class ControlTokenError(CaptureError):
    """The control-plane bearer token is missing or unusable, so training capture cannot start.

    Attributes:
        env_var: the environment variable that should hold the token (``None`` when the token
            was passed directly).
    """

    def __init__(self, problem: str, *, env_var: str | None = None) -> None:
        self.env_var = env_var
        where = f"${env_var}" if env_var else "the token argument"
        super().__init__(
            f"training capture needs a control-plane bearer token in {where}, but {problem}; "
            "refusing to start"
        )


def _check_token(token: str, env_var: str | None = None) -> str:
    if not token:
        raise ControlTokenError("it is unset or empty", env_var=env_var)
    if _TOKEN_CHARS.fullmatch(token) is None:
        # HTTP trims spaces around header values and cannot carry control characters, so such
        # a token could never be presented.
        raise ControlTokenError("it holds spaces, control or non-ASCII characters", env_var=env_var)
    return token


def load_control_token(
    settings: CaptureSettings, *, environ: Mapping[str, str] | None = None
) -> str:
    """Read the control-plane bearer token from the variable ``settings.control_token_env`` names.

    Call it when training capture is on; an unset, empty or unsendable token raises, so the
    server refuses to start rather than serve an unprotected control plane.

    Raises:
        ControlTokenError: names the variable and what is wrong with it.

    Example:
        >>> load_control_token(CaptureSettings(), environ={"NGCAPTURE_CONTROL_TOKEN": "s3cret"})
        's3cret'
    """
    env = os.environ if environ is None else environ
    name = settings.control_token_env
    return _check_token(env.get(name, ""), name)


class ControlApp:
    """The control routes as one ASGI app (HTTP only); see the module docstring.

    Args:
        ledger: the lineage ledger the routes read and change.
        token: the bearer token every request must present; must be non-empty printable ASCII.
    """

    def __init__(self, ledger: LedgerControl, *, token: str) -> None:
        self._ledger = ledger
        expected = b"Bearer " + _check_token(token).encode("ascii")
        self._expected_digest = hashlib.sha256(expected).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if not self._authorized(scope):
            await _reply(send, 401, UNAUTHORIZED_DETAIL, headers=[(b"www-authenticate", b"Bearer")])
            return
        path: str = scope["path"]
        method: str = scope["method"]
        action = _REMOVALS.get(path)
        manifest = _MANIFEST.match(path)
        if action is not None:
            if method != "POST":
                await _reply(send, 405, "method not allowed", headers=[(b"allow", b"POST")])
                return
            await self._remove(action, receive, send)
        elif manifest is not None:
            if method != "GET":
                await _reply(send, 405, "method not allowed", headers=[(b"allow", b"GET")])
                return
            await self._manifest(manifest.group("rollout_id"), send)
        else:
            await _reply(send, 404, f"no control route at {path!a}")

    def _authorized(self, scope: Scope) -> bool:
        # Hash first so that compare_digest sees equal lengths: neither the token's length nor
        # the position of the first differing byte shows in the timing. Always compare, even
        # when the header is missing or repeated.
        presented = _single_header(scope, b"authorization")
        digest = hashlib.sha256(presented or b"").digest()
        matches = hmac.compare_digest(digest, self._expected_digest)
        return matches and presented is not None

    async def _manifest(self, rollout_id: str, send: Send) -> None:
        try:
            validate_rollout_id(rollout_id)
            manifest = await anyio.to_thread.run_sync(self._ledger.manifest, rollout_id)
        except InvalidRolloutIdError as error:
            await _reply(send, 400, str(error))
        except RolloutRetiredError as error:
            await _reply(send, 410, f"{error}; its manifest is gone")
        except (CaptureError, OSError) as error:
            await _ledger_failed(send, "manifest", error)
        else:
            await _reply(send, 200, manifest.model_dump(mode="json"), wrap=False)

    async def _remove(self, action: str, receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        if body is None:
            await _reply(send, 413, f"request body larger than {MAX_BODY_BYTES} bytes")
            return
        try:
            ids = RolloutIdsBody.model_validate_json(body).rollout_ids
        except ValidationError as error:
            detail = json.loads(error.json(include_url=False, include_input=False))
            await _reply(send, 422, detail)
            return
        operation = self._ledger.retire if action == "retire" else self._ledger.delete
        try:
            for rollout_id in ids:
                validate_rollout_id(rollout_id)
            removal = await anyio.to_thread.run_sync(partial(operation, ids))
        except InvalidRolloutIdError as error:
            await _reply(send, 400, f"{error}; no ledger was changed")
        except (CaptureError, OSError) as error:
            await _ledger_failed(send, action, error)
        else:
            reply = {"removed": list(removal.removed), "absent": list(removal.absent)}
            await _reply(send, 200, reply, wrap=False)


def control_app(ledger: LedgerControl, *, token: str) -> ASGIApp:
    """The control routes over ``ledger``, protected by ``token`` (see :class:`ControlApp`).

    Raises:
        ControlTokenError: the token is empty or could not be sent in a header.

    Example:
        >>> from capture_core.lineage import LineageStore  # doctest: +SKIP
        >>> app = control_app(LineageStore("/var/lineage"), token="s3cret")  # doctest: +SKIP
    """
    return ControlApp(ledger, token=token)


def _single_header(scope: Scope, name: bytes) -> bytes | None:
    values = [value for key, value in scope.get("headers", ()) if key.lower() == name]
    return values[0] if len(values) == 1 else None


async def _lifespan(receive: Receive, send: Send) -> None:
    """Nothing to start or stop: acknowledge, so the app can also be served on its own."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Receive) -> bytes | None:
    """The request body, or ``None`` once it passes :data:`MAX_BODY_BYTES`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _ledger_failed(send: Send, action: str, error: Exception) -> None:
    logger.error("ledger %s failed: %s", action, error, exc_info=error)
    await _reply(send, 500, f"ledger {action} failed: {type(error).__name__}: {error}")


async def _reply(
    send: Send,
    status: int,
    body: Any,
    *,
    wrap: bool = True,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Send ``body`` as JSON; with ``wrap`` (error replies) as ``{"detail": body}``."""
    data = json.dumps({"detail": body} if wrap else body, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                (b"cache-control", b"no-store"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
