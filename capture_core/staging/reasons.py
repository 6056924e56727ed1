"""Reason and error codes of token staging, spelled exactly as they travel on the wire.

Grouped by who writes them:

* :class:`LedgerFailureReason` — ``ManifestFailure.reason``, written by the gate's ledger.
* :class:`ReceiptFailureReason` — ``RolloutReceipt.failure_reason``, set by receipt assembly.
* :class:`TerminalSelectionResult` and :class:`AttributionReason` — how the terminal call was
  (or was not) found; attribution reasons are joined with ``","`` in
  ``RolloutReceipt.terminal_attribution_reason``.
* :class:`LineageResolutionReason` — why a continuation's parent was or was not resolved.
* :class:`VerificationCode` — why ``verify_and_linearize`` refused a receipt; a field that
  differs between a manifest row and its snapshot is reported as :func:`wrong_field_code`.

All are ``StrEnum`` members, so they compare equal to (and serialize as) their strings.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = [
    "NON_POISONING_FAILURE_REASONS",
    "AttributionReason",
    "CaptureFailureReason",
    "LedgerFailureReason",
    "LineageResolutionReason",
    "ReceiptFailureReason",
    "TerminalSelectionResult",
    "VerificationCode",
    "wrong_field_code",
]


class LedgerFailureReason(StrEnum):
    """Why an admitted (or refused) call has a failure row instead of a committed row."""

    UNRESOLVED_PARENT = "unresolved_parent"
    REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES = "request_finished_without_staged_coordinates"
    WORKER_RESPONSE_MISSING_COMMIT_COORDINATES = "worker_response_missing_commit_coordinates"
    WORKER_CAPTURE_FAILED = "worker_capture_failed"
    INVALID_WORKER_COMMIT_COORDINATES = "invalid_worker_commit_coordinates"
    LEDGER_ROW_MISSING_RESPONSE_ID = "ledger_row_missing_response_id"
    # The upstream spelling of this one is not confirmed; this is the likely one.
    LEDGER_ROW_MISSING_CHAIN_HASH = "ledger_row_missing_chain_hash"


NON_POISONING_FAILURE_REASONS: Final = frozenset(
    {LedgerFailureReason.REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES}
)
"""Failure rows that do not mask a rollout on their own (every other failure row does)."""


class ReceiptFailureReason(StrEnum):
    """Why receipt assembly masked a rollout (``RolloutReceipt.failure_reason``)."""

    INVALID_MANIFEST_ROW = "invalid_manifest_row"
    MISSING_DECLARED_TERMINAL_ROW = "missing_declared_terminal_row"
    MISSING_TERMINAL_ROW = "missing_terminal_row"
    CAPTURE_FAILED = "capture_failed"


class TerminalSelectionResult(StrEnum):
    """Outcome of picking the terminal call by walking the manifest's call tree."""

    SELECTED = "selected"
    NO_RECORDS = "no_records"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    ORPHANED_ROW = "orphaned_row"
    NO_ROOT = "no_root"
    AMBIGUOUS_TERMINAL = "ambiguous_terminal"


class AttributionReason(StrEnum):
    """Why a terminal witness (declared id, response id, content) did not decide."""

    DECLARED_TERMINAL_NOT_CAPTURED = "declared_terminal_not_captured"
    DECLARED_AMBIGUOUS = "declared_ambiguous"
    RESPONSE_ID_AMBIGUOUS = "response_id_ambiguous"
    RESPONSE_ID_NO_MATCH = "response_id_no_match"
    RESPONSE_HAS_NO_ID = "response_has_no_id"
    NO_RESPONSE_OBJECT = "no_response_object"
    RESPONSE_HAS_NO_OUTPUT = "response_has_no_output"
    RESPONSE_OUTPUT_UNFINGERPRINTABLE = "response_output_unfingerprintable"
    NO_MODEL_AUTHORED_OUTPUT = "no_model_authored_output"
    CONTENT_AMBIGUOUS = "content_ambiguous"
    NO_CONTENT_MATCH = "no_content_match"
    AGENT_BOUNDARY_MODEL_CALL_ID = "agent_boundary_model_call_id"


class LineageResolutionReason(StrEnum):
    """Why the gate could not resolve a continuation's parent."""

    NO_MATCH = "no_match"
    AMBIGUOUS = "ambiguous"
    RESOLVER_UNAVAILABLE = "resolver_unavailable"
    LOOKUP_ERROR = "lookup_error"
    EXPLICIT_PARENT_MISSING = "explicit_parent_missing"
    EXPLICIT_PARENT_FINGERPRINT_MISMATCH = "explicit_parent_fingerprint_mismatch"
    EXPLICIT_PARENT_TOKENS_MISSING = "explicit_parent_tokens_missing"
    NOT_ATTEMPTED = "not_attempted"


class VerificationCode(StrEnum):
    """Why a receipt and its fetched snapshots could not be turned into a training row."""

    # Versions and receipt state.
    UNSUPPORTED_SCHEMA = "unsupported_schema"
    UNSUPPORTED_DIGEST = "unsupported_digest"
    UNSUPPORTED_EXTRAS_DIGEST = "unsupported_extras_digest"
    ROLLOUT_FAILED = "rollout_failed"
    CAPTURE_POISONED = "capture_poisoned"
    EMPTY_MANIFEST = "empty_manifest"
    # The manifest and the snapshot set.
    DUPLICATE_MANIFEST_ROW = "duplicate_manifest_row"
    DUPLICATE_STAGING_KEY = "duplicate_staging_key"
    ROW_COUNT_MISMATCH = "row_count_mismatch"
    DUPLICATE_SNAPSHOT = "duplicate_snapshot"
    SNAPSHOT_IDENTITY_MISMATCH = "snapshot_identity_mismatch"
    SNAPSHOT_ORDER_MISMATCH = "snapshot_order_mismatch"
    # One row against its snapshot (other fields: ``wrong_field_code``).
    WRONG_ROLLOUT = "wrong_rollout"
    INVALID_SNAPSHOT = "invalid_snapshot"
    CORRUPT_DIGEST = "corrupt_digest"
    # The call graph.
    MISSING_PARENT = "missing_parent"
    PARENT_LENGTH_MISMATCH = "parent_length_mismatch"
    LINEAGE_CYCLE = "lineage_cycle"
    MISSING_TERMINAL = "missing_terminal"
    # Linearization.
    CHAIN_HASH_MISMATCH = "chain_hash_mismatch"
    INVALID_MASK_ORDER = "invalid_mask_order"
    EMPTY_GENERATION = "empty_generation"
    EMPTY_TRAINING_ROW = "empty_training_row"
    CUMULATIVE_HASH_MISMATCH = "cumulative_hash_mismatch"


def wrong_field_code(field: str) -> str:
    """The verification code for a snapshot field that differs from its manifest row.

    Example:
        >>> wrong_field_code("weight_version")
        'wrong_weight_version'
    """
    return f"wrong_{field}"


class CaptureFailureReason(StrEnum):
    """Why a call ended ``capture_failed`` (``PendingCall.failure_reason``).

    ``fail_call`` records the reason its caller gives instead.
    """

    PREFIX_MISMATCH = "prefix_mismatch"
    """The prompt does not start with the staged prefix the call continues."""
    INVALID_CAPTURE_DATA = "invalid_capture_data"
    """Token ids, log-probs or extras that cannot be staged (wrong type, range, length...)."""
    EXTRACTION_FAILED = "extraction_failed"
    """The adapter could not read the token fields from the engine response."""
    SINK_REFUSED_ATTACHMENTS = "sink_refused_attachments"
    """The sink raised ``TypeError`` for a call with attachments (e.g. a text-only sink)."""
    SINK_ERROR = "sink_error"
    """The sink raised."""
    SINK_REJECTED = "sink_rejected"
    """The sink returned ``StageResult(ok=False)``."""
    SINK_INVALID_RESULT = "sink_invalid_result"
    """The sink returned something other than a usable ``StageResult``."""
