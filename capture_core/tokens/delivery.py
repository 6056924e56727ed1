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
:func:`retire_rollout_token_capture`, in :mod:`.rollout_delivery`) work on any
:class:`TokenSource`; ``TokenDelivery`` runs them on one event loop of its own.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from capture_core.exceptions import MaskFractionExceededError, TokenCaptureConfigError
from capture_core.tokens.builders import DEFAULT_BUILDER
from capture_core.tokens.consumer import TokenBuild
from capture_core.tokens.protocols import TokenSource
from capture_core.tokens.rollout_delivery import (
    capture_build_can_retire,
    clear_token_captures_for_rollouts,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
)
from capture_core.tokens.settings import (
    TokenIdCaptureConfig,
    installed_token_source,
    resolve_token_source,
    token_id_capture_dirs,
)

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

__all__ = ["TokenDelivery", "TokenDeliverySummary"]

T = TypeVar("T")


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
