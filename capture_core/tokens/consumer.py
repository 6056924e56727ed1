"""The consumer: freeze a rollout, build its main chain, and rebuild ``response.output``.

:func:`trajectories_from_source` (through any :class:`TokenSource`) and
:func:`trajectories_for_rollout` (the file store, synchronously) return a :class:`TokenBuild`:
the rebuilt response when the capture gives exactly one safe chain, or a masked build saying
why not. A build carries the snapshot id and version it came from, so the collector can drop
exactly that snapshot once the result is durable.

A build is masked (``mask_sample``) when the snapshot is incomplete (a call was lost), a retry
could not be resolved, the calls form more than one root or chain, or nothing trainable came
out (with ``error``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from capture_core.exceptions import TokenBuildError
from capture_core.tokens._threads import in_thread
from capture_core.tokens.builders import DEFAULT_BUILDER, run_builder
from capture_core.tokens.entry import TokenEntry
from capture_core.tokens.projection import check_prefix_contiguity, project_main_chain_response
from capture_core.tokens.protocols import TokenCaptureSnapshot, TokenSource
from capture_core.tokens.store import TokenCaptureStore

__all__ = [
    "NO_RECORDS_ERROR",
    "PER_REQUEST_ERROR",
    "SnapshotRef",
    "TokenBuild",
    "TokenCaptureMetrics",
    "assemble",
    "trajectories_for_rollout",
    "trajectories_from_source",
]

NO_RECORDS_ERROR: Final = "capture contains no token records"
PER_REQUEST_ERROR: Final = (
    "per_request returns multiple trajectories and is not supported by single-response delivery"
)
_BUILD_ERRORS: Final = (TokenBuildError, ValueError, KeyError, IndexError, TypeError)


class TokenCaptureMetrics(BaseModel):
    """A rollout's token-capture health, stored on its record as ``_ng_token_capture``.

    Only ``n_calls`` is always present; a failed build has ``error`` and no chain figures.
    Unknown keys are ignored when reading, so a newer writer's records stay readable.

    Attributes:
        n_calls: token entries in the snapshot.
        chains: chains built.
        roots: calls with no parent.
        quarantined_calls: calls left out as ambiguous or superseded retries.
        quarantined_fraction: quarantined / calls, 4 decimals.
        delivered_fraction: generated tokens on the main chain / all generated, 4 decimals.
        generated_tokens_captured: generated tokens over all calls.
        generated_tokens_delivered: generated tokens on the main chain.
        empty_generation_calls: calls that generated nothing.
        capture_incomplete: a call of the rollout was lost.
        error: why nothing trainable was built.
    """

    model_config = ConfigDict(extra="ignore")

    n_calls: int
    chains: int | None = None
    roots: int | None = None
    quarantined_calls: int | None = None
    quarantined_fraction: float | None = None
    delivered_fraction: float | None = None
    generated_tokens_captured: int | None = None
    generated_tokens_delivered: int | None = None
    empty_generation_calls: int | None = None
    capture_incomplete: bool | None = None
    error: str | None = None

    def to_record(self) -> dict[str, Any]:
        """The JSON form written on the rollout record (unknown figures left out)."""
        return self.model_dump(exclude_none=True)


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    """The snapshot a build came from: what ``TokenSource.drop`` must name."""

    snapshot_id: str
    version: int


@dataclass(frozen=True, slots=True)
class TokenBuild:
    """The outcome of building one rollout's response from its token capture.

    Attributes:
        rollout_id: the rollout.
        builder: the builder used.
        rebuilt_response: the Responses object with token-carrying ``output``; ``None`` when
            masked for an error, or for a rollout that already carried its own token ids.
        mask_sample: train on this rollout with loss mask 0 (or not at all).
        metrics: the health figures stored on the record.
        unresolved_retries: calls of retry groups that could not be resolved.
        error: why nothing trainable came out.
        snapshot: the snapshot built from (``None`` when the freeze failed).
        redundant: the rollout already carried token ids of its own; the capture is only
            retired.
    """

    rollout_id: str
    builder: str
    rebuilt_response: dict[str, Any] | None
    mask_sample: bool
    metrics: TokenCaptureMetrics
    unresolved_retries: list[str] = field(default_factory=list)
    error: str | None = None
    snapshot: SnapshotRef | None = None
    redundant: bool = False

    @property
    def can_retire(self) -> bool:
        """Unmasked and delivered (rebuilt, or redundant): its snapshot may be dropped."""
        return not self.mask_sample and (self.rebuilt_response is not None or self.redundant)

    @property
    def mask_reasons(self) -> list[str]:
        """Why it is masked: ``capture_incomplete``, ``unresolved_parent_calls``,
        ``multiple_roots``, ``multiple_chains`` and/or the error; empty when unmasked."""
        if not self.mask_sample:
            return []
        reasons = []
        if self.metrics.capture_incomplete:
            reasons.append("capture_incomplete")
        if self.unresolved_retries:
            reasons.append("unresolved_parent_calls")
        if self.error is not None:
            reasons.append(self.error)
        elif self.metrics.roots is not None and self.metrics.roots != 1:
            reasons.append("multiple_roots")
        elif self.metrics.chains is not None and self.metrics.chains != 1:
            reasons.append("multiple_chains")
        return reasons


def failed_build(
    rollout_id: str,
    error: str,
    *,
    builder: str = DEFAULT_BUILDER,
    n_calls: int = 0,
    snapshot: SnapshotRef | None = None,
) -> TokenBuild:
    """A masked build that delivers nothing, for ``error``."""
    metrics = TokenCaptureMetrics(n_calls=n_calls, error=error)
    return TokenBuild(rollout_id, builder, None, True, metrics, error=error, snapshot=snapshot)


def assemble(
    rollout_id: str,
    entries: Sequence[TokenEntry],
    *,
    builder: str = DEFAULT_BUILDER,
    model: str = "",
) -> TokenBuild:
    """Build, validate and project the main chain of ``entries``; never raises on bad entries.

    Example:
        >>> assemble("r", [], builder="per_request").error
        'per_request returns multiple trajectories and is not supported by single-response delivery'
    """
    n_calls = len(entries)
    if builder == "per_request":
        return failed_build(rollout_id, PER_REQUEST_ERROR, builder=builder, n_calls=n_calls)
    try:
        out = run_builder(entries, builder)
        for chain in out.chains:
            chain.validate()
        response = project_main_chain_response(rollout_id, out, model)
        check_prefix_contiguity(response)
    except _BUILD_ERRORS as exc:
        error = f"{type(exc).__name__}: {exc}"
        return failed_build(rollout_id, error, builder=builder, n_calls=n_calls)
    notes = out.notes
    metrics = TokenCaptureMetrics(
        n_calls=n_calls,
        chains=notes.chains,
        roots=notes.roots,
        quarantined_calls=len(out.quarantined),
        quarantined_fraction=round(len(out.quarantined) / n_calls, 4) if n_calls else 0.0,
        delivered_fraction=notes.delivered_fraction,
        generated_tokens_captured=notes.generated_tokens_captured,
        generated_tokens_delivered=notes.generated_tokens_delivered,
        empty_generation_calls=len(notes.empty_generation_calls),
    )
    masked = bool(notes.unresolved_retries) or notes.roots != 1 or notes.chains != 1
    return TokenBuild(rollout_id, notes.builder, response, masked, metrics,
                      unresolved_retries=list(notes.unresolved_retries))  # fmt: skip


def _from_snapshot(snapshot: TokenCaptureSnapshot, builder: str, model: str) -> TokenBuild:
    ref = SnapshotRef(snapshot.snapshot_id, snapshot.version)
    rid = snapshot.rollout_id
    if not snapshot.entries:
        build = failed_build(rid, NO_RECORDS_ERROR, builder=builder, snapshot=ref)
    else:
        build = assemble(rid, snapshot.entries, builder=builder, model=model)
    metrics = build.metrics
    if snapshot.incomplete:
        metrics = metrics.model_copy(update={"capture_incomplete": True})
    return TokenBuild(
        rid,
        build.builder,
        build.rebuilt_response,
        build.mask_sample or snapshot.incomplete,
        metrics,
        unresolved_retries=build.unresolved_retries,
        error=build.error,
        snapshot=ref,
    )


def trajectories_for_rollout(
    rollout_id: str,
    dirs: Sequence[str | os.PathLike[str]],
    *,
    builder: str = DEFAULT_BUILDER,
    model: str = "",
) -> TokenBuild | None:
    """Freeze the rollout in the file store on ``dirs[0]`` and build it (synchronously).

    Returns ``None`` when ``dirs`` is empty. A failed freeze gives a masked build with the
    error and no snapshot (nothing to drop).

    Example:
        >>> trajectories_for_rollout("3-2", []) is None
        True
    """
    if not dirs:
        return None
    try:
        snapshot = TokenCaptureStore(dirs[0], create=False).freeze_now(rollout_id)
    except Exception as exc:  # any store failure masks this rollout only
        return failed_build(rollout_id, f"{type(exc).__name__}: {exc}", builder=builder)
    return _from_snapshot(snapshot, builder, model)


async def trajectories_from_source(
    rollout_id: str,
    source: TokenSource,
    *,
    builder: str = DEFAULT_BUILDER,
    model: str = "",
) -> TokenBuild:
    """Freeze the rollout through ``source`` and build it; building runs in a worker thread.

    Raises:
        Exception: whatever ``source.freeze`` raised (the delivery step masks the rollout).
    """
    snapshot = await source.freeze(rollout_id)
    return await in_thread(_from_snapshot, snapshot, builder, model)
