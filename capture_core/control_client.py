"""Clients of the training-capture control plane: read manifests, retire and delete ledgers.

:class:`AsyncRolloutControlClient` and :class:`RolloutControlClient` speak to the routes of
``capture_core.server.control``. Both run the same request plans (generators that yield the
HTTP calls to make and parse the answers), so they differ only in how a call is sent.

``retire`` and ``delete`` validate and de-duplicate the whole list before the first request,
then send it in batches of at most 4096 ids and merge the replies, each id reported once. A
batch that fails raises :class:`RolloutBatchError`: it names the batch, carries the merged
result of the batches before it (``completed``) and the ids not yet done (``remaining``).
Both operations are idempotent, so sending ``remaining`` again is always safe; sending the
whole list again is safe too, but ids whose ledger the first attempt removed then come back
as ``absent``.

Errors (all :class:`~capture_core.exceptions.CaptureError`)::

    RolloutRetiredError                     manifest of a retired rollout (HTTP 410)
    RolloutControlError                     transport failure, other status, bad reply
    ├── ManifestMismatchError (ValueError)  a manifest for another rollout
    └── RolloutBatchError                   one retire/delete batch failed
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, Self, TypeVar

import httpx
from pydantic import ValidationError

from capture_core.exceptions import CaptureError, RolloutRetiredError, quote_value
from capture_core.ids import validate_rollout_id
from capture_core.staging import RolloutManifest, RolloutRemoval

__all__ = [
    "MAX_BATCH_SIZE",
    "AsyncRolloutControlClient",
    "ManifestMismatchError",
    "RolloutBatchError",
    "RolloutControlClient",
    "RolloutControlError",
]

MAX_BATCH_SIZE: Final = 4096
ROLLOUTS_PATH: Final = "/training-token-capture/control/rollouts"
_MAX_BODY_IN_MESSAGE: Final = 500

Action = Literal["retire", "delete"]
_T = TypeVar("_T")


class RolloutControlError(CaptureError):
    """A control request failed: the transport, an unexpected status, or a malformed reply.

    Attributes:
        status_code: the HTTP status, or ``None`` when no answer arrived.
        body: the answer's body (shortened), or ``""``.
    """

    def __init__(self, message: str, *, status_code: int | None = None, body: str = "") -> None:
        self.status_code = status_code
        self.body = body
        super().__init__(message)


class ManifestMismatchError(RolloutControlError, ValueError):
    """The server answered with the manifest of a different rollout.

    Attributes:
        rollout_id: the rollout asked for.
        received_rollout_id: the rollout the manifest names.
    """

    def __init__(self, rollout_id: str, received_rollout_id: str, *, status_code: int) -> None:
        self.rollout_id = rollout_id
        self.received_rollout_id = received_rollout_id
        super().__init__(
            f"asked for the manifest of rollout {quote_value(rollout_id)} but got the one of "
            f"{quote_value(received_rollout_id)}",
            status_code=status_code,
        )


class RolloutBatchError(RolloutControlError):
    """One batch of a ``retire`` or ``delete`` failed; earlier batches are done.

    Attributes:
        action: ``"retire"`` or ``"delete"``.
        batch_index: the failed batch, counted from 1.
        batch_count: how many batches the list was split into.
        rollout_ids: the ids of the failed batch.
        completed: merged result of the batches before it.
        remaining: the ids of the failed batch and every later one, in order: send them again.
    """

    def __init__(
        self,
        *,
        action: Action,
        batch_index: int,
        batch_count: int,
        rollout_ids: tuple[str, ...],
        completed: RolloutRemoval,
        remaining: tuple[str, ...],
        cause: Exception,
    ) -> None:
        self.action = action
        self.batch_index = batch_index
        self.batch_count = batch_count
        self.rollout_ids = rollout_ids
        self.completed = completed
        self.remaining = remaining
        status = cause.status_code if isinstance(cause, RolloutControlError) else None
        body = cause.body if isinstance(cause, RolloutControlError) else ""
        done = len(completed.removed) + len(completed.absent)
        super().__init__(
            f"{action} batch {batch_index} of {batch_count} ({len(rollout_ids)} rollout ids, "
            f"from {quote_value(rollout_ids[0])}) failed: {cause}; {done} ids of earlier "
            f"batches are done; send .remaining ({len(remaining)} ids) again to finish",
            status_code=status,
            body=body,
        )


@dataclass(frozen=True, slots=True)
class _Call:
    method: str
    path: str
    json: object = None


_Plan = Generator[_Call, httpx.Response, _T]


def _unique_ids(rollout_ids: Iterable[str]) -> list[str]:
    """Validate every id and drop repeats (first occurrence wins), before anything is sent."""
    if isinstance(rollout_ids, str | bytes):
        raise TypeError(f"expected a sequence of rollout ids, got the string {rollout_ids!a}")
    return list(dict.fromkeys(validate_rollout_id(rollout_id) for rollout_id in rollout_ids))


def _failure(what: str, response: httpx.Response) -> RolloutControlError:
    body = response.text[:_MAX_BODY_IN_MESSAGE]
    return RolloutControlError(
        f"{what} failed: HTTP {response.status_code} {body}",
        status_code=response.status_code,
        body=body,
    )


def _read_manifest(rollout_id: str, response: httpx.Response) -> RolloutManifest:
    if response.status_code == 410:
        raise RolloutRetiredError(rollout_id)
    what = f"manifest of rollout {quote_value(rollout_id)}"
    if response.status_code != 200:
        raise _failure(what, response)
    try:
        manifest = RolloutManifest.model_validate_json(response.content)
    except ValidationError as error:
        raise RolloutControlError(
            f"{what}: the reply is not a manifest: {error}", status_code=200
        ) from None
    if manifest.rollout_id != rollout_id:
        raise ManifestMismatchError(rollout_id, manifest.rollout_id, status_code=200)
    return manifest


def _read_removal(batch: list[str], response: httpx.Response) -> RolloutRemoval:
    if response.status_code != 200:
        raise _failure("the request", response)
    try:
        removal = RolloutRemoval.model_validate_json(response.content)
    except ValidationError as error:
        raise RolloutControlError(
            f"the reply is not a removal result: {error}", status_code=200
        ) from None
    reported = [*removal.removed, *removal.absent]
    if len(reported) != len(batch) or set(reported) != set(batch):
        missing = sorted(set(batch) - set(reported))[:5]
        unexpected = sorted(set(reported) - set(batch))[:5]
        raise RolloutControlError(
            f"the reply does not report each id of the batch exactly once ({len(reported)} "
            f"reported for {len(batch)}; missing {missing}, unexpected {unexpected})",
            status_code=200,
        )
    return removal


def _manifest_plan(rollout_id: str) -> _Plan[RolloutManifest]:
    # Validated before it becomes part of the URL: "../x" would address another rollout.
    validate_rollout_id(rollout_id)
    try:
        response = yield _Call("GET", f"{ROLLOUTS_PATH}/{rollout_id}/manifest")
    except httpx.HTTPError as error:
        raise RolloutControlError(
            f"manifest of rollout {quote_value(rollout_id)} failed: {type(error).__name__}: {error}"
        ) from error
    return _read_manifest(rollout_id, response)


def _removal_plan(action: Action, rollout_ids: Iterable[str], size: int) -> _Plan[RolloutRemoval]:
    ids = _unique_ids(rollout_ids)
    batches = [ids[start : start + size] for start in range(0, len(ids), size)]
    removed: list[str] = []
    absent: list[str] = []
    for index, batch in enumerate(batches):
        try:
            response = yield _Call("POST", f"{ROLLOUTS_PATH}/{action}", {"rollout_ids": batch})
            removal = _read_removal(batch, response)
        except (httpx.HTTPError, RolloutControlError) as error:
            cause = error
            if isinstance(error, httpx.HTTPError):
                cause = RolloutControlError(f"{type(error).__name__}: {error}")
            raise RolloutBatchError(
                action=action,
                batch_index=index + 1,
                batch_count=len(batches),
                rollout_ids=tuple(batch),
                completed=RolloutRemoval(removed=removed, absent=absent),
                remaining=tuple(ids[index * size :]),
                cause=cause,
            ) from error
        removed.extend(removal.removed)
        absent.extend(removal.absent)
    return RolloutRemoval(removed=removed, absent=absent)


class _ClientOptions:
    """Argument checks and request plans shared by the sync and async clients."""

    def __init__(self, base_url: str, auth_token: str, timeout_s: float, batch_size: int) -> None:
        if not base_url:
            raise ValueError("base_url must name the model server, e.g. http://127.0.0.1:8000")
        if not auth_token:
            raise ValueError("auth_token must be the control-plane bearer token, not empty")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if isinstance(batch_size, bool) or not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be in 1..{MAX_BATCH_SIZE}, got {batch_size!r}")
        self.base_url = base_url.rstrip("/")
        self.headers = {"authorization": f"Bearer {auth_token}", "accept": "application/json"}
        self.timeout = httpx.Timeout(timeout_s)
        self.batch_size = batch_size


class AsyncRolloutControlClient:
    """Async client of the control routes of one model server (or several sharing a directory).

    Args:
        base_url: the model server, e.g. ``http://10.0.0.5:8000``.
        auth_token: the control-plane bearer token.
        timeout_s: timeout of each connect, read, write and pool wait.
        batch_size: ids per retire/delete request, at most 4096.
        transport: an httpx transport to use instead of the network (tests).

    Example:
        >>> async def finish(ids):  # doctest: +SKIP
        ...     async with AsyncRolloutControlClient("http://gym:8000", token) as client:
        ...         manifests = [await client.manifest(i) for i in ids]
        ...         await client.retire(ids)
    """

    def __init__(
        self,
        base_url: str,
        auth_token: str,
        *,
        timeout_s: float = 30.0,
        batch_size: int = MAX_BATCH_SIZE,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._options = options = _ClientOptions(base_url, auth_token, timeout_s, batch_size)
        self._client = httpx.AsyncClient(
            base_url=options.base_url,
            headers=options.headers,
            timeout=options.timeout,
            transport=transport,
        )

    async def manifest(self, rollout_id: str) -> RolloutManifest:
        """The rollout's manifest.

        Raises:
            InvalidRolloutIdError: before any request.
            RolloutRetiredError: the rollout was retired (HTTP 410).
            ManifestMismatchError: the server answered for another rollout.
            RolloutControlError: any other failure, naming the status and body.
        """
        return await self._run(_manifest_plan(rollout_id))

    async def retire(self, rollout_ids: Iterable[str]) -> RolloutRemoval:
        """Retire the rollouts' ledgers (fence against late writes); see the module docstring."""
        return await self._run(_removal_plan("retire", rollout_ids, self._options.batch_size))

    async def delete(self, rollout_ids: Iterable[str]) -> RolloutRemoval:
        """Delete the rollouts' ledgers and fences; see the module docstring."""
        return await self._run(_removal_plan("delete", rollout_ids, self._options.batch_size))

    async def _run(self, plan: _Plan[_T]) -> _T:
        try:
            call = next(plan)
            while True:
                try:
                    response = await self._client.request(call.method, call.path, json=call.json)
                except httpx.HTTPError as error:
                    call = plan.throw(error)
                else:
                    call = plan.send(response)
        except StopIteration as stop:
            result: _T = stop.value
            return result

    async def aclose(self) -> None:
        """Close the connections; the client cannot be used afterwards."""
        await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class RolloutControlClient:
    """Blocking client of the control routes; same arguments and behaviour as the async one.

    Example:
        >>> with RolloutControlClient("http://gym:8000", token) as client:  # doctest: +SKIP
        ...     manifest = client.manifest("3-2")
        ...     client.retire(["3-2", "3-3"]).removed
        ['3-2']
    """

    def __init__(
        self,
        base_url: str,
        auth_token: str,
        *,
        timeout_s: float = 30.0,
        batch_size: int = MAX_BATCH_SIZE,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._options = options = _ClientOptions(base_url, auth_token, timeout_s, batch_size)
        self._client = httpx.Client(
            base_url=options.base_url,
            headers=options.headers,
            timeout=options.timeout,
            transport=transport,
        )

    def manifest(self, rollout_id: str) -> RolloutManifest:
        """The rollout's manifest (errors as :meth:`AsyncRolloutControlClient.manifest`)."""
        return self._run(_manifest_plan(rollout_id))

    def retire(self, rollout_ids: Iterable[str]) -> RolloutRemoval:
        """Retire the rollouts' ledgers (fence against late writes); see the module docstring."""
        return self._run(_removal_plan("retire", rollout_ids, self._options.batch_size))

    def delete(self, rollout_ids: Iterable[str]) -> RolloutRemoval:
        """Delete the rollouts' ledgers and fences; see the module docstring."""
        return self._run(_removal_plan("delete", rollout_ids, self._options.batch_size))

    def _run(self, plan: _Plan[_T]) -> _T:
        try:
            call = next(plan)
            while True:
                try:
                    response = self._client.request(call.method, call.path, json=call.json)
                except httpx.HTTPError as error:
                    call = plan.throw(error)
                else:
                    call = plan.send(response)
        except StopIteration as stop:
            result: _T = stop.value
            return result

    def close(self) -> None:
        """Close the connections; the client cannot be used afterwards."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
