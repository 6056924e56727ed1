"""capture_core: record every model call of a rollout at the model-server boundary.

The public API lives here; modules are implementation detail. Reading a capture::

    from capture_core import CaptureStore, aggregate_model_call_metrics, read_model_call_records

    store = CaptureStore("/absolute/path/to/results/model-calls")
    calls = read_model_call_records(store, "0-0")
    totals = aggregate_model_call_metrics(store, "0-0")

``import capture_core`` stays light: it never imports polars, plotly, ipywidgets or wandb.
"""

from capture_core.dialects import (
    DIALECTS,
    DialectSpec,
    ResponseFacts,
    StreamReassembly,
    TerminalDetector,
    TokenStats,
    dialect_for_path,
    extract_response,
    get_dialect,
    reassemble_stream,
    token_stats,
)
from capture_core.exceptions import (
    CaptureDirNotFoundError,
    CaptureError,
    CaptureStoreError,
    DamagedLineError,
    InvalidRecordError,
    InvalidRolloutIdError,
    LineEncodingError,
    RolloutRetiredError,
)
from capture_core.ids import (
    MAX_ROLLOUT_ID_LENGTH,
    RolloutIdParts,
    is_valid_rollout_id,
    make_rollout_id,
    rollout_id_from_body,
    split_attempt,
    validate_rollout_id,
    with_attempt,
)
from capture_core.lineage import (
    FINGERPRINT_VERSION,
    LedgerConflictError,
    LedgerCorruptError,
    LineageStore,
    ParentResolution,
    RecordOutcome,
    ResolutionStatus,
    assistant_fingerprint,
    conversation_digest,
    lineage_request_items,
)
from capture_core.metrics import (
    aggregate_model_call_metrics,
    aggregate_model_call_records,
    read_model_call_records,
)
from capture_core.normalize import normalize_line, validate_raw_line
from capture_core.outcome import (
    classify_exception,
    classify_outcome,
    classify_response,
    classify_status,
)
from capture_core.records import (
    ATTACHMENT_KEY,
    PAYLOAD_FIELDS,
    CaptureRecords,
    DamagedLine,
    ErrorCategory,
    Gap,
    GapCode,
    ModelCallCaptureAttachment,
    ModelCallMetrics,
    ModelCallRecord,
    ModelRef,
    RawCaptureLine,
    ToolCall,
)
from capture_core.sse import SSEEvent, SSEParser, format_event, format_events, parse_sse
from capture_core.store import (
    DATA_SUFFIX,
    MARKER_SUFFIX,
    CaptureRead,
    CaptureStore,
    RawEntry,
    parse_capture,
    paused_gc,
)

__version__ = "0.1.0"

__all__ = [
    "ATTACHMENT_KEY",
    "DATA_SUFFIX",
    "DIALECTS",
    "FINGERPRINT_VERSION",
    "MARKER_SUFFIX",
    "MAX_ROLLOUT_ID_LENGTH",
    "PAYLOAD_FIELDS",
    "CaptureDirNotFoundError",
    "CaptureError",
    "CaptureRead",
    "CaptureRecords",
    "CaptureStore",
    "CaptureStoreError",
    "DamagedLine",
    "DamagedLineError",
    "DialectSpec",
    "ErrorCategory",
    "Gap",
    "GapCode",
    "InvalidRecordError",
    "InvalidRolloutIdError",
    "LedgerConflictError",
    "LedgerCorruptError",
    "LineEncodingError",
    "LineageStore",
    "ModelCallCaptureAttachment",
    "ModelCallMetrics",
    "ModelCallRecord",
    "ModelRef",
    "ParentResolution",
    "RawCaptureLine",
    "RawEntry",
    "RecordOutcome",
    "ResolutionStatus",
    "ResponseFacts",
    "RolloutIdParts",
    "RolloutRetiredError",
    "SSEEvent",
    "SSEParser",
    "StreamReassembly",
    "TerminalDetector",
    "TokenStats",
    "ToolCall",
    "aggregate_model_call_metrics",
    "aggregate_model_call_records",
    "assistant_fingerprint",
    "classify_exception",
    "classify_outcome",
    "classify_response",
    "classify_status",
    "conversation_digest",
    "dialect_for_path",
    "extract_response",
    "format_event",
    "format_events",
    "get_dialect",
    "is_valid_rollout_id",
    "lineage_request_items",
    "make_rollout_id",
    "normalize_line",
    "parse_capture",
    "parse_sse",
    "paused_gc",
    "read_model_call_records",
    "reassemble_stream",
    "rollout_id_from_body",
    "split_attempt",
    "token_stats",
    "validate_raw_line",
    "validate_rollout_id",
    "with_attempt",
]
