"""Delivery: what the collector does with token capture around each rollout.

Per run, with :class:`TokenDelivery` (synchronous, safe to share between collector threads)::

    with TokenDelivery(config) as delivery:
        delivery.prepare(participating_ids)       # before dispatch: refuse a missing source,
                                                  # delete earlier captures of these ids
        ...                                       # per finished rollout, on any thread:
        build = delivery.finalize(result, rollout_id)  # freeze, rebuild response.output or mask
        write_line_and_fsync(result)              # the result is durable ...
        delivery.retire(rollout_id, build)        # ... so drop exactly the frozen snapshot
        delivery.check_mask_fraction()            # abort when too many rollouts are masked

The async functions underneath (:func:`finalize_rollout_token_capture`,
:func:`retire_rollout_token_capture`) work on any :class:`TokenSource`; ``TokenDelivery`` runs
them on one event loop of its own.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar

from capture_core.exceptions import MaskFractionExceededError, TokenCaptureConfigError
from capture_core.ids import is_valid_rollout_id, validate_rollout_id
from capture_core.tokens.builders import DEFAULT_BUILDER
from capture_core.tokens.consumer import (
    SnapshotRef,
    TokenBuild,
    TokenCaptureMetrics,
    failed_build,
    trajectories_from_source,
)
from capture_core.tokens.protocols import TokenSource
from capture_core.tokens.settings import (
    TokenIdCaptureConfig,
    installed_token_source,
    resolve_token_source,
    token_id_capture_dirs,
)
from capture_core.tokens.store import TokenCaptureStore

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

__all__ = [
    "MASK_SAMPLE_KEY",
    "TOKEN_CAPTURE_KEY",
    "TokenDelivery",
    "TokenDeliverySummary",
    "capture_build_can_retire",
    "clear_token_captures_for_rollouts",
    "finalize_rollout_token_capture",
    "retire_rollout_token_capture",
    "rollout_carries_token_ids",
]

logger = logging.getLogger("capture_core.tokens")

T = TypeVar("T")

TOKEN_CAPTURE_KEY: Final = "_ng_token_capture"
"""Record key of the rollout's :class:`TokenCaptureMetrics` (as a JSON object)."""
MASK_SAMPLE_KEY: Final = "mask_sample"
"""Top-level record flag, present (``true``) only on a masked rollout."""


def rollout_carries_token_ids(result: Mapping[str, Any]) -> bool:
    """Whether ``result["response"]`` has an output item with non-empty
    ``generation_token_ids`` (an agent that returns its own token ids).

    Example:
        >>> rollout_carries_token_ids({"response": {"output": [{"generation_token_ids": [1]}]}})
        True
    """
    response = result.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    if not isinstance(output, list):
        return False
    return any(isinstance(item, Mapping) and item.get("generation_token_ids") for item in output)


def _unusable(result: MutableMapping[str, Any], build: TokenBuild) -> TokenBuild:
    result[MASK_SAMPLE_KEY] = True
    result[TOKEN_CAPTURE_KEY] = build.metrics.to_record()
    logger.warning(
        "rollout %s is marked for masking: %s", build.rollout_id, build.error or "unusable"
    )
    return build


async def finalize_rollout_token_capture(
    result: MutableMapping[str, Any],
    source: TokenSource | None,
    *,
    rollout_id: str | None,
    builder: str = DEFAULT_BUILDER,
) -> TokenBuild | None:
    """Freeze the rollout's capture and rebuild ``result["response"]["output"]`` from it.

    Never raises; changes ``result`` in place: only ``response.output`` is replaced (the reward
    and every other field stay), ``_ng_token_capture`` gets the build's metrics, and a masked
    rollout gets ``mask_sample: true`` (with a WARNING log naming why).

    * no source: ``None``, nothing changed;
    * a malformed ``rollout_id``: masked, ``"malformed rollout id: ..."``;
    * a result that already carries token ids: left as it is; the capture is frozen only so
      it can be retired (a *redundant* build), or ``None`` when there is no id or the freeze
      fails;
    * no id (``None``): masked, ``"no capture key"``;
    * a source that raises: masked with ``"<Type>: <message>"``, this rollout only.

    Returns:
        The build, or ``None`` as above.
    """
    if source is None:
        return None
    if rollout_id is not None and not is_valid_rollout_id(rollout_id):
        bad = failed_build(str(rollout_id)[:200], f"malformed rollout id: {rollout_id!r}")
        return _unusable(result, bad)
    if rollout_carries_token_ids(result):
        return await _redundant(source, rollout_id, builder)
    if rollout_id is None:
        return _unusable(result, failed_build("", "no capture key", builder=builder))
    response = result.get("response")
    model = response.get("model") if isinstance(response, Mapping) else None
    try:
        build = await trajectories_from_source(
            rollout_id, source, builder=builder, model=model if isinstance(model, str) else ""
        )
    except Exception as exc:  # one rollout's source failure masks that rollout only
        error = f"{type(exc).__name__}: {exc}"
        return _unusable(result, failed_build(rollout_id, error, builder=builder))
    if build.rebuilt_response is not None:
        if isinstance(response, MutableMapping):
            response["output"] = build.rebuilt_response["output"]
        else:
            result["response"] = build.rebuilt_response
    result[TOKEN_CAPTURE_KEY] = build.metrics.to_record()
    if build.mask_sample:
        result[MASK_SAMPLE_KEY] = True
        logger.warning(
            "rollout %s is marked for masking: %s", rollout_id, ", ".join(build.mask_reasons)
        )
    return build


async def _redundant(
    source: TokenSource, rollout_id: str | None, builder: str
) -> TokenBuild | None:
    if rollout_id is None:
        return None
    try:
        snapshot = await source.freeze(rollout_id)
    except Exception as exc:
        logger.warning("could not freeze the token capture of rollout %s: %s", rollout_id, exc)
        return None
    return TokenBuild(
        rollout_id,
        builder,
        None,
        False,
        TokenCaptureMetrics(n_calls=len(snapshot.entries)),
        snapshot=SnapshotRef(snapshot.snapshot_id, snapshot.version),
        redundant=True,
    )


def capture_build_can_retire(build: TokenBuild | None) -> bool:
    """Whether ``build`` may have its snapshot dropped: unmasked, rebuilt or redundant."""
    return build is not None and build.can_retire


async def retire_rollout_token_capture(
    rollout_id: str, source: TokenSource | None, build: TokenBuild | None
) -> bool:
    """Drop exactly the snapshot ``build`` came from; call it once the result is durable.

    Failed and masked builds keep their evidence (``False``); so does a rollout that changed
    after its freeze (the source refuses). Never raises: a failure is logged and gives
    ``False``.
    """
    if source is None or build is None or not build.can_retire:
        return False
    if build.snapshot is None:
        logger.warning("rollout %s has no token snapshot to retire", rollout_id)
        return False
    try:
        return await source.drop(
            rollout_id, snapshot_id=build.snapshot.snapshot_id, version=build.snapshot.version
        )
    except Exception as exc:
        logger.warning("could not retire the token capture of rollout %s: %s", rollout_id, exc)
        return False


def clear_token_captures_for_rollouts(
    rollout_ids: Sequence[str], dirs: Sequence[str | os.PathLike[str]]
) -> int:
    """Delete the token captures (and fences) of ``rollout_ids`` in every directory of
    ``dirs``, before they are dispatched again; a no-op without directories.

    Returns:
        How many rollouts had files removed.

    Raises:
        InvalidRolloutIdError: an id is malformed (checked before anything is deleted).
        CaptureDirNotFoundError: a directory does not exist (the collector never creates one:
            a path that differs from the model servers' fails here, before dispatch).
    """
    if isinstance(rollout_ids, str):
        raise TypeError("expected a sequence of rollout ids, got a single string")
    ids = [validate_rollout_id(rid) for rid in rollout_ids]
    removed = 0
    for directory in dirs:
        store = TokenCaptureStore(directory, create=False)
        removed += sum(store.delete(rid) for rid in ids)
    return removed


@dataclass
class TokenDeliverySummary:
    """What a run's delivery did.

    Attributes:
        finalized: rollouts that got a build.
        masked: builds marked for masking.
        retired: snapshots dropped after their result was durable.
        kept: retirable builds whose drop was refused or failed (evidence kept).
        reasons: masked builds per reason.
    """

    finalized: int = 0
    masked: int = 0
    retired: int = 0
    kept: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    @property
    def masked_fraction(self) -> float | None:
        """masked / finalized; ``None`` before the first build."""
        return self.masked / self.finalized if self.finalized else None


class TokenDelivery(AbstractContextManager["TokenDelivery"]):
    """One collection run's token delivery, shared by the collector's threads.

    Args:
        config: the run's token-capture config.
        source: where rollouts are frozen (default: an installed source, else the file store
            on the configured directory). A store this object opens is closed by
            :meth:`close`; a source given or installed never is.
        builder: the builder (``prefix_merging``).

    Raises:
        CaptureDirNotFoundError: the configured directory does not exist (the collector never
            creates it: a path that differs from the model servers' fails here).

    Example:
        >>> with TokenDelivery(config) as delivery:  # doctest: +SKIP
        ...     delivery.prepare(["0-0"])
        ...     build = delivery.finalize(result, "0-0")
        ...     # write the result line, flush and fsync it, then:
        ...     delivery.retire("0-0", build)
        ...     delivery.check_mask_fraction()
    """

    def __init__(
        self,
        config: TokenIdCaptureConfig,
        *,
        source: TokenSource | None = None,
        builder: str = DEFAULT_BUILDER,
    ) -> None:
        self.config = config
        self.builder = builder
        installed = installed_token_source()
        if source is None and installed is None:
            source = resolve_token_source(config)  # the file store, or None
            self._owned = source is not None
        else:
            source = source if source is not None else installed
            self._owned = False
        self.source: TokenSource | None = source
        self._summary = TokenDeliverySummary()
        self._lock = threading.Lock()
        self._portal: BlockingPortal | None = None
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None

    @property
    def active(self) -> bool:
        """Whether the collector freezes and rebuilds (the block is on with rebuilding)."""
        block = self.config.token_id_capture
        return block.enabled and block.rebuild_response

    def summary(self) -> TokenDeliverySummary:
        """A copy of the counts so far."""
        with self._lock:
            s = self._summary
            return TokenDeliverySummary(
                s.finalized, s.masked, s.retired, s.kept, Counter(s.reasons)
            )

    def prepare(self, rollout_ids: Sequence[str]) -> int:
        """Before dispatch, with the ids of the participating rollouts about to run.

        Raises:
            TokenCaptureConfigError: rebuilding is on, there are rollouts, and there is no
                source (nothing has been dispatched).
            InvalidRolloutIdError: an id is malformed.

        Returns:
            How many rollouts had earlier token captures deleted.
        """
        if not self.config.token_id_capture.enabled or not rollout_ids:
            return 0
        if self.active and self.source is None:
            raise TokenCaptureConfigError(
                "token_id_capture.rebuild_response",
                "Token capture response rebuilding requires a TokenSource in the "
                "rollout-collector process: configure a token_id_capture directory, install "
                "a source with install_token_source(), or set rebuild_response: false",
            )
        return clear_token_captures_for_rollouts(rollout_ids, token_id_capture_dirs(self.config))

    def finalize(
        self, result: MutableMapping[str, Any], rollout_id: str | None
    ) -> TokenBuild | None:
        """After the rollout: freeze, rebuild ``result``'s output or mask it (never raises).

        ``None`` when delivery is off or the rollout needs nothing (see
        :func:`finalize_rollout_token_capture`).
        """
        if not self.active or self.source is None:
            return None
        build = self._call(
            finalize_rollout_token_capture,
            result,
            self.source,
            rollout_id=rollout_id,
            builder=self.builder,
        )
        if build is not None:
            with self._lock:
                self._summary.finalized += 1
                if build.mask_sample:
                    self._summary.masked += 1
                    self._summary.reasons.update(build.mask_reasons)
        return build

    def retire(self, rollout_id: str, build: TokenBuild | None) -> bool:
        """Once the result line is durable: drop exactly the build's snapshot (never raises)."""
        if not capture_build_can_retire(build):
            return False
        dropped = self._call(retire_rollout_token_capture, rollout_id, self.source, build)
        with self._lock:
            if dropped:
                self._summary.retired += 1
            else:
                self._summary.kept += 1
        return dropped

    def check_mask_fraction(self) -> None:
        """Abort the run when, after ``mask_fraction_min_samples`` finalized rollouts, more
        than ``max_mask_fraction`` of them are masked.

        Raises:
            MaskFractionExceededError: the limit is passed; it names the counts and reasons.
        """
        block = self.config.token_id_capture
        limit = block.max_mask_fraction
        if limit is None:
            return
        s = self.summary()
        if s.finalized >= block.mask_fraction_min_samples and s.masked / s.finalized > limit:
            raise MaskFractionExceededError(
                masked=s.masked, finalized=s.finalized, limit=limit, reasons=s.reasons
            )

    def close(self) -> None:
        """Close a source this object created, and stop its event loop; idempotent."""
        try:
            if self._owned and self.source is not None:
                self._owned = False
                self._call(self.source.close)
        finally:
            cm, self._portal, self._portal_cm = self._portal_cm, None, None
            if cm is not None:
                cm.__exit__(None, None, None)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, function: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        with self._lock:
            if self._portal is None:
                from anyio.from_thread import start_blocking_portal

                self._portal_cm = start_blocking_portal()
                self._portal = self._portal_cm.__enter__()
            portal = self._portal
        if kwargs:
            return portal.call(lambda: function(*args, **kwargs))
        return portal.call(function, *args)
