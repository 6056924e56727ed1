"""Lineage ledgers: the token-free record of which calls a rollout committed, and their parents.

The gate appends one row per committed call (or failed call) to ``<rollout_id>.lineage.jsonl``;
the training framework reads the rollout's manifest once, then retires the rollout (a fence
stops late writers from starting a new ledger) and finally deletes it::

    store = LineageStore("/shared/lineage")
    store.record("r1", call_record)
    manifest = store.manifest("r1")
    store.retire(["r1"])   # manifest("r1") now raises RolloutRetiredError
    store.delete(["r1"])   # "r1" can be used again

A continuation finds its parent with ``resolve_parent(rollout_id, fingerprint=...)``, where the
fingerprint is :func:`assistant_fingerprint` of the request's :func:`lineage_request_items`.
"""

from capture_core._fingerprint import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    conversation_digest,
    lineage_request_items,
)
from capture_core.lineage._rows import LedgerCorruptError
from capture_core.lineage._store import LineageStore
from capture_core.lineage._types import (
    LedgerConflictError,
    ParentResolution,
    RecordOutcome,
    ResolutionStatus,
)

__all__ = [
    "FINGERPRINT_VERSION",
    "LedgerConflictError",
    "LedgerCorruptError",
    "LineageStore",
    "ParentResolution",
    "RecordOutcome",
    "ResolutionStatus",
    "assistant_fingerprint",
    "conversation_digest",
    "lineage_request_items",
]
