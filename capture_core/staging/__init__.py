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
    InvalidStagedCallError,
    StagingError,
    StreamingUnsupportedError,
)
from capture_core.staging.manifest import (
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    RolloutReceipt,
    RolloutRemoval,
)
from capture_core.staging.reasons import (
    NON_POISONING_FAILURE_REASONS,
    AttributionReason,
    LedgerFailureReason,
    LineageResolutionReason,
    ReceiptFailureReason,
    TerminalSelectionResult,
    VerificationCode,
    wrong_field_code,
)
from capture_core.staging.records import (
    COMMIT_COORDS_KEY,
    CommitCoords,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagedCallSnapshot,
    StageResult,
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
    "AttributionReason",
    "CallRecord",
    "CaptureAdmission",
    "CaptureMode",
    "CommitCoords",
    "Disposition",
    "GenerationCutContinuation",
    "InvalidStagedCallError",
    "LedgerFailureReason",
    "LineageResolutionReason",
    "ManifestFailure",
    "ReceiptFailureReason",
    "RolloutManifest",
    "RolloutReceipt",
    "RolloutRemoval",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedCallRecord",
    "StagedCallSnapshot",
    "StagingDelta",
    "StagingError",
    "StreamingUnsupportedError",
    "TerminalSelection",
    "TerminalSelectionResult",
    "VerificationCode",
    "build_staged_call_record",
    "build_staging_delta",
    "compute_chain_hash",
    "compute_cumulative_hash",
    "compute_extras_digest",
    "compute_staged_call_digest",
    "default_staging_key",
    "wrong_field_code",
]
