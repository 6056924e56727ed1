"""One model call's token capture on the model server: :class:`TokenCallCapture`.

The server makes one per call that token-id capture applies to, with the call's rollout id and
``model_call_id`` (the same id its model-call capture line carries), and the process's sink
(``None`` when an external framework owns the tokens)::

    capture = TokenCallCapture(rollout_id, model_call_id, sink, model=model_name)
    await capture.begin()                 # before generation; raising fails the call
    ...                                   # the engine answers
    await capture.capture_response(body)  # the complete response object, before any SSE
                                          # synthesis or dialect conversion; never raises

A call whose tokens cannot be recorded (no token ids in the answer, partial or malformed ones,
a sink that refuses the entry) marks the rollout incomplete instead of failing the call: a
skipped call's generated tokens would otherwise enter the next prompt with loss mask 0.
Nothing here raises after :meth:`~TokenCallCapture.begin`; every failure is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from capture_core.tokens.entry import TokenEntry, build_token_entry
from capture_core.tokens.protocols import CallIntentSink, TokenSink

__all__ = ["TokenCallCapture"]

logger = logging.getLogger("capture_core.tokens")


class TokenCallCapture:
    """Records one call's :class:`TokenEntry` through a sink, isolating every failure.

    Args:
        rollout_id: the call's rollout.
        model_call_id: the call's id.
        sink: where the entry goes; ``None``: an external process owns staging (nothing is
            written and a missing entry is not marked).
        model: the model name (default: the response's ``model``).

    Attributes:
        committed: an entry for this call was stored (or handed to external staging).

    Example:
        >>> capture = TokenCallCapture("3-2", "c1", TokenCaptureStore("/tmp/t", create=True))
        >>> asyncio.run(capture.capture_response({"output": [{"type": "message",
        ...     "prompt_token_ids": [1], "generation_token_ids": [2],
        ...     "generation_log_probs": [-0.5]}]}))
        True
    """

    def __init__(
        self, rollout_id: str, model_call_id: str, sink: TokenSink | None, *, model: str = ""
    ) -> None:
        self.rollout_id = rollout_id
        self.model_call_id = model_call_id
        self.sink = sink
        self.model = model
        self.committed = False

    async def begin(self) -> None:
        """Announce the call before generation, when the sink takes intents.

        Raises:
            Exception: whatever the sink's ``begin_call`` raised (a retired or frozen
                rollout, a disk error): the call must fail before it generates tokens that
                could not be accounted for.
        """
        if isinstance(self.sink, CallIntentSink):
            await self.sink.begin_call(self.rollout_id, self.model_call_id)

    async def capture_response(self, response: object) -> bool:
        """Build the entry from the complete response and commit it; never raises.

        ``response`` is a JSON object (a ``dict``) or a model with ``model_dump()``. Returns
        whether an entry was committed; otherwise the rollout was marked incomplete (unless
        the call was already committed, or staging is external).
        """
        try:
            payload = _payload(response)
            if payload is None:
                await self.missing(f"the response is a {type(response).__name__}")
                return False
            entry = build_token_entry(
                payload,
                rollout_id=self.rollout_id,
                model_call_id=self.model_call_id,
                model=self.model,
            )
        except Exception as exc:  # malformed token fields: this call's tokens are lost
            await self._failed("build", exc)
            return False
        if entry is None:
            await self.missing("the response carries no token ids")
            return False
        return await self.commit(entry)

    async def commit(self, entry: TokenEntry) -> bool:
        """Commit an entry the caller built (an engine that holds the token arrays); never
        raises. An entry for another rollout or call is refused and marks the rollout."""
        if (entry.rollout_id, entry.model_call_id) != (self.rollout_id, self.model_call_id):
            logger.warning(
                "token entry for rollout %s call %s refused: this call is rollout %s call %s",
                entry.rollout_id, entry.model_call_id, self.rollout_id, self.model_call_id,
            )  # fmt: skip
            await self._mark()
            return False
        if self.sink is None:
            self.committed = True
            return True
        try:
            await self.sink.put(entry)
        except Exception as exc:  # the sink refused: the call is served, its tokens lost
            await self._failed("write", exc)
            return False
        self.committed = True
        return True

    async def missing(self, reason: str) -> None:
        """The call produced no entry: mark the rollout incomplete, unless this call was
        already committed or staging is external; never raises."""
        if self.committed or self.sink is None:
            return
        logger.warning(
            "no token entry for call %s of rollout %s (%s); the rollout is marked incomplete",
            self.model_call_id, self.rollout_id, reason,
        )  # fmt: skip
        await self._mark()

    async def _failed(self, stage: str, exc: Exception) -> None:
        logger.warning(
            "token capture %s failed for call %s of rollout %s: %s: %s",
            stage, self.model_call_id, self.rollout_id, type(exc).__name__, exc,
        )  # fmt: skip
        await self._mark()

    async def _mark(self) -> None:
        sink = self.sink
        if sink is None:
            return
        mark: Callable[[str, str], Awaitable[None]] | None = getattr(sink, "mark_incomplete", None)
        if not callable(mark):
            logger.error(
                "token sink %s does not implement mark_incomplete: the loss of call %s of "
                "rollout %s cannot be recorded",
                type(sink).__name__, self.model_call_id, self.rollout_id,
            )  # fmt: skip
            return
        try:
            await mark(self.rollout_id, self.model_call_id)
        except Exception as exc:  # the one guard: marking must not fail the call either
            logger.error(
                "could not mark rollout %s incomplete after call %s lost its tokens: %s: %s",
                self.rollout_id, self.model_call_id, type(exc).__name__, exc,
            )  # fmt: skip


def _payload(response: object) -> Mapping[str, Any] | None:
    if isinstance(response, Mapping):
        return response
    dump = getattr(response, "model_dump", None)
    if callable(dump):
        dumped = dump()
        return dumped if isinstance(dumped, Mapping) else None
    return None
