"""Results and errors of the lineage store."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from capture_core.exceptions import CaptureError, quote_value
from capture_core.staging.manifest import CallRecord
from capture_core.staging.reasons import LineageResolutionReason

__all__ = ["LedgerConflictError", "ParentResolution", "RecordOutcome", "ResolutionStatus"]


class RecordOutcome(StrEnum):
    """What a ledger write did."""

    APPENDED = "appended"
    DUPLICATE = "duplicate"
    DISCARDED_RETIRED = "discarded_retired"


class ResolutionStatus(StrEnum):
    """Whether a request continues a recorded call."""

    ROOT = "root"
    """No model-authored history: the call starts a new lineage."""
    RESOLVED = "resolved"
    """Exactly one recorded call (or several equivalent ones) is the parent."""
    UNRESOLVED = "unresolved"
    """Model-authored history that no single recorded call accounts for; see ``reason``."""


@dataclass(frozen=True, slots=True)
class ParentResolution:
    """The outcome of :meth:`LineageStore.resolve_parent`.

    Attributes:
        status: root, resolved or unresolved.
        parent: the parent's manifest row when resolved.
        staging_chain: the staging keys from the root to the parent, inclusive: the chain a
            continuation's admission carries.
        reason: why it is unresolved (``no_match`` or ``ambiguous``).
    """

    status: ResolutionStatus
    parent: CallRecord | None = None
    staging_chain: tuple[str, ...] = ()
    reason: LineageResolutionReason | None = None


class LedgerConflictError(CaptureError, ValueError):
    """A second, different row for a model call the ledger already holds; nothing was written.

    Attributes:
        rollout_id: the rollout.
        model_call_id: the call.
    """

    def __init__(self, rollout_id: str, model_call_id: str) -> None:
        self.rollout_id = rollout_id
        self.model_call_id = model_call_id
        super().__init__(
            f"conflicting lineage row for model call {quote_value(model_call_id)} "
            f"of rollout {quote_value(rollout_id)}"
        )
