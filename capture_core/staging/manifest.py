"""Token-free ledger views the framework reads: manifest rows, manifests, receipts, removals.

* :class:`CallRecord` — one committed call in a rollout's manifest: identity, lengths, weight
  version, where it was staged, its hashes, and the served response id. No tokens.
* :class:`ManifestFailure` — a call that did not commit, with its reason code.
* :class:`RolloutManifest` — the body of the manifest route.
* :class:`RolloutReceipt` — what the framework assembles from a manifest: the rows it trusts,
  the terminal call and how it was chosen, or why the rollout is masked.
* :class:`RolloutRemoval` — the result of retiring or deleting ledgers.

A manifest row with a key this version does not know fails validation; a receipt builder must
validate rows one at a time and mask the rollout (``invalid_manifest_row``) rather than let the
error escape.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, StrictBool, StrictFloat, StrictStr, model_validator

from capture_core.staging import _rules as rules
from capture_core.staging._base import (
    CaptureMode,
    DigestedStagingModel,
    DigestHex,
    Identifier,
    NonNegativeInt,
    StagingModel,
    TerminalSelection,
    staging_rules,
)
from capture_core.staging.errors import InvalidStagedCallError

__all__ = [
    "CallRecord",
    "ManifestFailure",
    "RolloutManifest",
    "RolloutReceipt",
    "RolloutRemoval",
]


class CallRecord(DigestedStagingModel):
    """One committed call of a rollout, as its manifest lists it (token-free).

    ``digest`` is the staged-call digest of the row under ``staging_key``. ``capture_key`` is
    set only on rows carried into a later attempt by a checkpoint restore: the rollout id the
    row was staged under.
    """

    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    prev_len: NonNegativeInt
    delta_len: NonNegativeInt
    cum_len: NonNegativeInt
    weight_version: NonNegativeInt
    digest: DigestHex
    extras_digest: DigestHex
    staging_key: Identifier
    mode: CaptureMode = CaptureMode.TOKEN_IN
    chain_hash: DigestHex
    cumulative_hash: DigestHex
    response_id: Identifier
    admitted_at: StrictFloat | None = None
    output_fingerprint: DigestHex | None = None
    continuation_fingerprint: DigestHex | None = None
    fingerprint_version: NonNegativeInt = 0
    capture_key: Identifier | None = None

    @model_validator(mode="after")
    def _check_row(self) -> Self:
        with staging_rules():
            rules.check_staged_delta_len(self.delta_len)
            rules.check_lengths(self.prev_len, self.delta_len, self.cum_len)
            rules.check_parent(self.parent_call_id, self.prev_len)
            rules.check_mode(self.parent_call_id, self.mode)
        return self


class ManifestFailure(StagingModel):
    """A call that did not commit: its id and the reason code (see ``reasons.py``)."""

    model_call_id: Identifier
    reason: Identifier


class RolloutManifest(StagingModel):
    """Everything a rollout's ledger holds: committed rows and failures, in ledger order.

    Example:
        >>> RolloutManifest(rollout_id="r1").model_dump(mode="json")
        {'schema_version': 3, 'rollout_id': 'r1', 'records': [], 'failures': []}
    """

    rollout_id: Identifier
    records: list[CallRecord] = Field(default_factory=list)
    failures: list[ManifestFailure] = Field(default_factory=list)


class RolloutReceipt(DigestedStagingModel):
    """The framework's verdict on a rollout's manifest, ready for verification.

    Rules: call ids are unique in ``manifest``; a terminal, if named, is in it; an unpoisoned
    receipt names a terminal and a selection and has no ``failure_reason``; a receipt without a
    selection has no terminal and does have a ``failure_reason``.
    """

    rollout_id: Identifier
    reward: StrictFloat | None = None
    terminal_model_call_id: Identifier | None = None
    manifest: list[CallRecord]
    capture_poisoned: StrictBool = False
    failure_reason: StrictStr | None = None
    terminal_selection: TerminalSelection | None = TerminalSelection.HEURISTIC
    terminal_attribution_reason: StrictStr | None = None

    @model_validator(mode="after")
    def _check_receipt(self) -> Self:
        with staging_rules():
            self._check_terminal()
        return self

    def _check_terminal(self) -> None:
        call_ids = [row.model_call_id for row in self.manifest]
        if len(set(call_ids)) != len(call_ids):
            repeated = sorted({c for c in call_ids if call_ids.count(c) > 1})
            raise InvalidStagedCallError(
                "manifest", f"model_call_id values must be unique, repeated: {repeated}"
            )
        terminal = self.terminal_model_call_id
        if terminal is not None and terminal not in call_ids:
            raise InvalidStagedCallError(
                "terminal_model_call_id", f"{terminal!r} is not a row of the manifest"
            )
        if not self.capture_poisoned:
            self._check_unpoisoned()
        if self.terminal_selection is None:
            if terminal is not None:
                raise InvalidStagedCallError(
                    "terminal_model_call_id", "must be null when terminal_selection is null"
                )
            if self.failure_reason is None:
                raise InvalidStagedCallError(
                    "failure_reason", "is required when terminal_selection is null"
                )

    def _check_unpoisoned(self) -> None:
        if self.failure_reason is not None:
            raise InvalidStagedCallError(
                "failure_reason", "must be null unless capture_poisoned is true"
            )
        if self.terminal_model_call_id is None:
            raise InvalidStagedCallError(
                "terminal_model_call_id", "is required unless capture_poisoned is true"
            )
        if self.terminal_selection is None:
            raise InvalidStagedCallError(
                "terminal_selection", "is required unless capture_poisoned is true"
            )


class RolloutRemoval(StagingModel):
    """Result of retiring or deleting ledgers: which ids had one, and which did not.

    The control route sends only ``removed`` and ``absent``; ``schema_version`` takes its
    default when the client validates the body.
    """

    removed: list[Identifier] = Field(default_factory=list)
    absent: list[Identifier] = Field(default_factory=list)
