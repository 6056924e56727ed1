"""What the worker stages and what it answers: the staged row, the sink's result, the coordinates.

* :class:`StagedCallRecord` — the heavy row a worker stages for one call: identity, lengths,
  weight version, the three token columns of the call's delta, its extras and four hashes.
  Validation enforces every rule of the staging format and **recomputes the staged-call
  digest** (and the extras digest from ``extras``); a mismatch is a ``ValidationError`` naming
  the field.
* :class:`StagedCallBaseSnapshot` — the same row without ``extras``; its digest is checked
  against the recorded ``extras_digest``.
* :class:`StagedCallSnapshot` — what a staging source returns; identical to the record.
* :class:`StageResult` — what ``StagingSink.stage`` returns.
* :class:`CommitCoords` — the token-free acknowledgement a worker returns (``ng_commit_coords``).
"""

from __future__ import annotations

from typing import Any, Final, Self

from pydantic import StrictBool, StrictFloat, StrictStr, model_validator

from capture_core.staging import _rules as rules
from capture_core.staging._base import (
    CaptureMode,
    DigestedStagingModel,
    DigestHex,
    Disposition,
    Identifier,
    NonNegativeInt,
    StagingModel,
    rule_violation,
    staging_rules,
)
from capture_core.staging.digests import (
    EMPTY_EXTRAS_DIGEST,
    compute_extras_digest,
    compute_staged_call_digest,
)
from capture_core.staging.errors import (
    DIGEST_MISMATCH_ERROR_TYPE,
    EXTRAS_DIGEST_MISMATCH_ERROR_TYPE,
    InvalidStagedCallError,
)

__all__ = [
    "COMMIT_COORDS_KEY",
    "CommitCoords",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedCallRecord",
    "StagedCallSnapshot",
]

COMMIT_COORDS_KEY: Final = "ng_commit_coords"
"""Top-level key of the worker's response that carries :class:`CommitCoords`."""

_PAYLOAD_FIELDS: Final = ("digest", "extras_digest", "staging_key", "chain_hash", "cumulative_hash")


class StagedCallBaseSnapshot(DigestedStagingModel):
    """One call's staged row without its extras (the digest covers extras only by digest).

    Example:
        >>> from capture_core.staging import build_staged_call_record
        >>> record = build_staged_call_record(
        ...     rollout_id="r1", model_call_id="c1", prompt_token_ids=[1, 2, 3],
        ...     generated_token_ids=[4, 5], generated_logprobs=[-0.5, -0.25], weight_version=7,
        ... )
        >>> base = StagedCallBaseSnapshot.model_validate(record.model_dump(exclude={"extras"}))
        >>> base.digest == record.digest
        True
    """

    rollout_id: Identifier
    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    mode: CaptureMode
    prev_len: NonNegativeInt
    delta_len: NonNegativeInt
    cum_len: NonNegativeInt
    weight_version: NonNegativeInt
    digest: DigestHex
    token_ids_delta: list[NonNegativeInt]
    token_mask_delta: list[StrictFloat]
    generation_log_probs_delta: list[StrictFloat]
    extras_digest: DigestHex = EMPTY_EXTRAS_DIGEST
    chain_hash: DigestHex
    cumulative_hash: DigestHex

    @model_validator(mode="after")
    def _check_digest(self) -> Self:
        with staging_rules():
            computed = self._computed_digest()
        if computed != self.digest:
            reason = f"does not match the row's content (stored {self.digest}, computed {computed})"
            raise rule_violation(
                InvalidStagedCallError("digest", reason), DIGEST_MISMATCH_ERROR_TYPE
            )
        return self

    def _computed_digest(self) -> str:
        return compute_staged_call_digest(
            schema_version=self.schema_version,
            digest_version=self.digest_version,
            extras_digest_version=self.extras_digest_version,
            rollout_id=self.rollout_id,
            model_call_id=self.model_call_id,
            parent_call_id=self.parent_call_id,
            mode=self.mode,
            prev_len=self.prev_len,
            delta_len=self.delta_len,
            cum_len=self.cum_len,
            weight_version=self.weight_version,
            token_ids_delta=self.token_ids_delta,
            token_mask_delta=self.token_mask_delta,
            generation_log_probs_delta=self.generation_log_probs_delta,
            extras_digest=self.extras_digest,
            chain_hash=self.chain_hash,
            cumulative_hash=self.cumulative_hash,
        )


class StagedCallRecord(StagedCallBaseSnapshot):
    """The row a worker stages for one call: the base snapshot plus its JSON ``extras``.

    ``extras`` (``None`` for a text-only call) is covered by ``extras_digest``, which is
    recomputed on validation. Attachments are never part of the record. Build one with
    :func:`~capture_core.staging.build_staged_call_record`.
    """

    extras: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_extras_digest(self) -> Self:
        with staging_rules():
            computed = compute_extras_digest(self.extras)
        if computed != self.extras_digest:
            reason = f"does not match extras (stored {self.extras_digest}, computed {computed})"
            raise rule_violation(
                InvalidStagedCallError("extras_digest", reason), EXTRAS_DIGEST_MISMATCH_ERROR_TYPE
            )
        return self


class StagedCallSnapshot(StagedCallRecord):
    """A staged row as a :class:`StagingSource` returns it; identical to the record."""


class StageResult(StagingModel):
    """What a staging sink returns: ``ok`` with the authoritative key, or an error.

    Example:
        >>> StageResult(ok=True, staging_key="r1/c1").staging_key
        'r1/c1'
    """

    ok: StrictBool
    staging_key: Identifier | None = None
    error: StrictStr | None = None

    @model_validator(mode="after")
    def _check_outcome(self) -> Self:
        with staging_rules():
            self._check_ok()
        return self

    def _check_ok(self) -> None:
        if self.ok and self.staging_key is None:
            raise InvalidStagedCallError("staging_key", "is required when ok is true")
        if not self.ok and not self.error:
            raise InvalidStagedCallError("error", "must be a non-empty message when ok is false")


class CommitCoords(DigestedStagingModel):
    """The token-free acknowledgement of one call, returned under ``ng_commit_coords``.

    ``staged`` coordinates carry the five payload fields (``digest``, ``extras_digest``,
    ``staging_key``, ``chain_hash``, ``cumulative_hash``) and ``delta_len > 0``;
    ``capture_failed`` coordinates carry none of them and ``delta_len == 0``.

    Example:
        >>> coords = CommitCoords.for_failure(
        ...     rollout_id="r1", model_call_id="c2", parent_call_id="c1", prev_len=5,
        ...     weight_version=7,
        ... )
        >>> coords.disposition, coords.cum_len
        (<Disposition.CAPTURE_FAILED: 'capture_failed'>, 5)
    """

    rollout_id: Identifier
    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    prev_len: NonNegativeInt
    delta_len: NonNegativeInt
    cum_len: NonNegativeInt
    weight_version: NonNegativeInt
    disposition: Disposition = Disposition.STAGED
    digest: DigestHex | None = None
    extras_digest: DigestHex | None = None
    staging_key: Identifier | None = None
    chain_hash: DigestHex | None = None
    cumulative_hash: DigestHex | None = None

    @model_validator(mode="after")
    def _check_coords(self) -> Self:
        with staging_rules():
            self._check_payload()
        return self

    def _check_payload(self) -> None:
        rules.check_parent(self.parent_call_id, self.prev_len)
        rules.check_lengths(self.prev_len, self.delta_len, self.cum_len)
        present = [name for name in _PAYLOAD_FIELDS if getattr(self, name) is not None]
        if self.disposition is Disposition.STAGED:
            missing = [name for name in _PAYLOAD_FIELDS if name not in present]
            if missing:
                raise InvalidStagedCallError(
                    "disposition", f"'staged' requires {', '.join(missing)}"
                )
            rules.check_staged_delta_len(self.delta_len)
        else:
            if present:
                raise InvalidStagedCallError(
                    "disposition", f"'capture_failed' carries no {', '.join(present)}"
                )
            if self.delta_len != 0:
                raise InvalidStagedCallError(
                    "delta_len", f"must be 0 for 'capture_failed', got {self.delta_len}"
                )

    @classmethod
    def for_staged(cls, record: StagedCallBaseSnapshot, *, staging_key: str) -> CommitCoords:
        """``staged`` coordinates for a record the sink stored under ``staging_key``."""
        return cls(
            rollout_id=record.rollout_id,
            model_call_id=record.model_call_id,
            parent_call_id=record.parent_call_id,
            prev_len=record.prev_len,
            delta_len=record.delta_len,
            cum_len=record.cum_len,
            weight_version=record.weight_version,
            digest=record.digest,
            extras_digest=record.extras_digest,
            staging_key=staging_key,
            chain_hash=record.chain_hash,
            cumulative_hash=record.cumulative_hash,
        )

    @classmethod
    def for_failure(
        cls,
        *,
        rollout_id: str,
        model_call_id: str,
        parent_call_id: str | None,
        prev_len: int,
        weight_version: int,
    ) -> CommitCoords:
        """``capture_failed`` coordinates: no delta (``cum_len == prev_len``), no payload."""
        return cls(
            rollout_id=rollout_id,
            model_call_id=model_call_id,
            parent_call_id=parent_call_id,
            prev_len=prev_len,
            delta_len=0,
            cum_len=prev_len,
            weight_version=weight_version,
            disposition=Disposition.CAPTURE_FAILED,
        )
