"""capture_core: record every model call of a rollout at the model-server boundary.

The public API lives here; modules are implementation detail. Reading a capture::

    from capture_core import CaptureStore, aggregate_model_call_metrics, read_model_call_records

    store = CaptureStore("results/demo/ckpt-200/model-calls")  # must exist: reading never creates
    calls = read_model_call_records(store, "0-0")
    totals = aggregate_model_call_metrics(store, "0-0")

``import capture_core`` stays light: it never imports polars, plotly, ipywidgets or wandb, and
it imports the modules behind these names only when a name is first used (``ngcapture --help``
and the server's start-up do not pay for what they do not use).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the public names and where they live; read by _lazy_names() at run time
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
        AppenderError,
        CaptureDirNotFoundError,
        CaptureError,
        CaptureStoreError,
        DamagedLineError,
        InvalidRecordError,
        InvalidRolloutIdError,
        LineEncodingError,
        MaskFractionExceededError,
        RolloutRetiredError,
        TokenBuildError,
        TokenCaptureConfigError,
        TokenCaptureFrozenError,
        TokenCaptureRetiredError,
        TokenEntryConflictError,
        TokenStoreDamagedError,
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
    from capture_core.observations import (
        OBSERVATIONS_KEY,
        PERF_KEY,
        TRAJECTORY_KEY,
        AgentInvocation,
        AgentObservationBundle,
        ContextCompaction,
        ModelCallRef,
        ModelServerRef,
        ObservationGap,
        ObservationRecorder,
        RolloutPerf,
        SandboxObservation,
        ToolCallObservation,
        TrajectoryRecord,
        build_trajectory,
        derive_perf,
        join_model_call_observations,
    )
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
    from capture_core.tokens import (
        TokenCaptureSnapshot,
        TokenCaptureStore,
        TokenDelivery,
        TokenEntry,
        TokenIdCaptureConfig,
        TokenIdCaptureSettings,
        TokenSink,
        TokenSource,
    )

__version__ = "0.1.0"

__all__ = [
    "ATTACHMENT_KEY",
    "DATA_SUFFIX",
    "DIALECTS",
    "FINGERPRINT_VERSION",
    "MARKER_SUFFIX",
    "MAX_ROLLOUT_ID_LENGTH",
    "OBSERVATIONS_KEY",
    "PAYLOAD_FIELDS",
    "PERF_KEY",
    "TRAJECTORY_KEY",
    "AgentInvocation",
    "AgentObservationBundle",
    "AppenderError",
    "CaptureDirNotFoundError",
    "CaptureError",
    "CaptureRead",
    "CaptureRecords",
    "CaptureStore",
    "CaptureStoreError",
    "ContextCompaction",
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
    "MaskFractionExceededError",
    "ModelCallCaptureAttachment",
    "ModelCallMetrics",
    "ModelCallRecord",
    "ModelCallRef",
    "ModelRef",
    "ModelServerRef",
    "ObservationGap",
    "ObservationRecorder",
    "ParentResolution",
    "RawCaptureLine",
    "RawEntry",
    "RecordOutcome",
    "ResolutionStatus",
    "ResponseFacts",
    "RolloutIdParts",
    "RolloutPerf",
    "RolloutRetiredError",
    "SSEEvent",
    "SSEParser",
    "SandboxObservation",
    "StreamReassembly",
    "TerminalDetector",
    "TokenBuildError",
    "TokenCaptureConfigError",
    "TokenCaptureFrozenError",
    "TokenCaptureRetiredError",
    "TokenCaptureSnapshot",
    "TokenCaptureStore",
    "TokenDelivery",
    "TokenEntry",
    "TokenEntryConflictError",
    "TokenIdCaptureConfig",
    "TokenIdCaptureSettings",
    "TokenSink",
    "TokenSource",
    "TokenStats",
    "TokenStoreDamagedError",
    "ToolCall",
    "ToolCallObservation",
    "TrajectoryRecord",
    "aggregate_model_call_metrics",
    "aggregate_model_call_records",
    "assistant_fingerprint",
    "build_trajectory",
    "classify_exception",
    "classify_outcome",
    "classify_response",
    "classify_status",
    "conversation_digest",
    "derive_perf",
    "dialect_for_path",
    "extract_response",
    "format_event",
    "format_events",
    "get_dialect",
    "is_valid_rollout_id",
    "join_model_call_observations",
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


def _lazy_names() -> dict[str, str]:
    """Name -> module of every public name, from the ``TYPE_CHECKING`` imports above: the one
    list of where things live, for type checkers and for :func:`__getattr__` alike."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and ast.unparse(node.test) == "TYPE_CHECKING")  # fmt: skip
    return {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


_LAZY: dict[str, str] = _lazy_names()


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'capture_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
