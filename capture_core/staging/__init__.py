"""Token staging: the wire models, digests and reason codes of worker-owned token capture.

For RL training the worker that sampled a call *stages* the call's token delta (ids, mask,
log-probs) in a durable sink and answers with token-free :class:`CommitCoords`; the framework
later reads the rollout's :class:`RolloutManifest`, fetches the staged rows and verifies them
against their digests. This package holds the shapes and hashes both sides agree on::

    from capture_core.staging import CommitCoords, build_staged_call_record

    record = build_staged_call_record(
        rollout_id="r1", model_call_id="c1", prompt_token_ids=[1, 2, 3],
        generated_token_ids=[4, 5], generated_logprobs=[-0.5, -0.25], weight_version=7,
    )
    coords = CommitCoords.for_staged(record, staging_key="r1/c1")

Every model forbids unknown keys and NaN/infinity, takes ints strictly, and refuses a schema or
digest version other than the current one (staging schema 3, digest 2, extras digest 1).
"""

from capture_core.staging._base import CaptureMode, Disposition, TerminalSelection
from capture_core.staging.admission import (
    CAPTURE_ADMISSION_KEY,
    CaptureAdmission,
    GenerationCutContinuation,
)
from capture_core.staging.build import (
    StagingDelta,
    build_staged_call_record,
    build_staging_delta,
    default_staging_key,
)
from capture_core.staging.capture import RolloutTokenCapture
from capture_core.staging.digests import (
    DIGEST_VERSION,
    EMPTY_EXTRAS_DIGEST,
    EXTRAS_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    compute_chain_hash,
    compute_cumulative_hash,
    compute_extras_digest,
    compute_staged_call_digest,
)
from capture_core.staging.errors import (
    DIGEST_MISMATCH_ERROR_TYPE,
    EXTRAS_DIGEST_MISMATCH_ERROR_TYPE,
    STAGING_RULE_ERROR_TYPE,
    UNSUPPORTED_VERSION_ERROR_TYPE,
    CallAlreadyCompletedError,
    InvalidPrefixError,
    InvalidStagedCallError,
    StagingError,
    StreamingUnsupportedError,
    UnsupportedAdmissionError,
    VerificationError,
)
from capture_core.staging.fs_sink import FilesystemStagingSink
from capture_core.staging.manifest import (
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    RolloutReceipt,
    RolloutRemoval,
)
from capture_core.staging.pending_call import PendingCall
from capture_core.staging.reasons import (
    NON_POISONING_FAILURE_REASONS,
    AttributionReason,
    CaptureFailureReason,
    LedgerFailureReason,
    LineageResolutionReason,
    ReceiptFailureReason,
    TerminalSelectionResult,
    VerificationCode,
    wrong_field_code,
)
from capture_core.staging.rebuild import LinearizedRollout, verify_and_linearize
from capture_core.staging.receipts import ReceiptOutcome, build_receipt
from capture_core.staging.records import (
    COMMIT_COORDS_KEY,
    CommitCoords,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagedCallSnapshot,
    StageResult,
)
from capture_core.staging.sinks import (
    Attachments,
    AttachmentValue,
    CaptureAdapter,
    InvalidAttachmentError,
    RawStagingSource,
    StagedRowDamagedError,
    StagedRowNotFoundError,
    StagingConflictError,
    StagingSink,
    StagingSinkError,
    StagingSource,
    StagingWriteError,
    TextOnlyStagingSink,
    check_attachments,
)

__all__ = [
    "CAPTURE_ADMISSION_KEY",
    "COMMIT_COORDS_KEY",
    "DIGEST_MISMATCH_ERROR_TYPE",
    "DIGEST_VERSION",
    "EMPTY_EXTRAS_DIGEST",
    "EXTRAS_DIGEST_MISMATCH_ERROR_TYPE",
    "EXTRAS_DIGEST_VERSION",
    "NON_POISONING_FAILURE_REASONS",
    "STAGING_RULE_ERROR_TYPE",
    "STAGING_SCHEMA_VERSION",
    "UNSUPPORTED_VERSION_ERROR_TYPE",
    "AttachmentValue",
    "Attachments",
    "AttributionReason",
    "CallAlreadyCompletedError",
    "CallRecord",
    "CaptureAdapter",
    "CaptureAdmission",
    "CaptureFailureReason",
    "CaptureMode",
    "CommitCoords",
    "Disposition",
    "FilesystemStagingSink",
    "GenerationCutContinuation",
    "InvalidAttachmentError",
    "InvalidPrefixError",
    "InvalidStagedCallError",
    "LedgerFailureReason",
    "LineageResolutionReason",
    "LinearizedRollout",
    "ManifestFailure",
    "PendingCall",
    "RawStagingSource",
    "ReceiptFailureReason",
    "ReceiptOutcome",
    "RolloutManifest",
    "RolloutReceipt",
    "RolloutRemoval",
    "RolloutTokenCapture",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedCallRecord",
    "StagedCallSnapshot",
    "StagedRowDamagedError",
    "StagedRowNotFoundError",
    "StagingConflictError",
    "StagingDelta",
    "StagingError",
    "StagingSink",
    "StagingSinkError",
    "StagingSource",
    "StagingWriteError",
    "StreamingUnsupportedError",
    "TerminalSelection",
    "TerminalSelectionResult",
    "TextOnlyStagingSink",
    "UnsupportedAdmissionError",
    "VerificationCode",
    "VerificationError",
    "build_receipt",
    "build_staged_call_record",
    "build_staging_delta",
    "check_attachments",
    "compute_chain_hash",
    "compute_cumulative_hash",
    "compute_extras_digest",
    "compute_staged_call_digest",
    "default_staging_key",
    "verify_and_linearize",
    "wrong_field_code",
]
