"""The complete-record token store: whole token records per call, for training frameworks.

A model server with token-id capture on records one :class:`TokenEntry` per call (prompt ids,
generated ids and log-probs, content items) through a :class:`TokenSink`; the collector
freezes each finished rollout through a :class:`TokenSource`, rebuilds ``response.output``
with token ids from the snapshot (:func:`trajectories_from_source`, builder
``prefix_merging``), and once the result is durable drops exactly that snapshot, leaving a
fence that refuses late writers until the id is deleted::

    store = TokenCaptureStore("/shared/token-capture", create=True)
    store.append(entry)                      # model server, per call (async: await put)
    snapshot = store.freeze_now("3-2")       # collector, after the rollout
    store.drop_now("3-2", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    store.delete("3-2")                      # before the id is used again

On the model server, :class:`TokenCallCapture` records one call through the sink with every
failure isolated; :class:`TokenDelivery` is the collector's side in one object. See
docs/token-store.md.
"""

from capture_core.tokens.builders import (
    BUILDERS,
    DEFAULT_BUILDER,
    BuildNotes,
    BuildOutput,
    Chain,
    ChainLink,
    per_request,
    prefix_merging,
    run_builder,
)
from capture_core.tokens.capture import TokenCallCapture
from capture_core.tokens.consumer import (
    NO_RECORDS_ERROR,
    PER_REQUEST_ERROR,
    SnapshotRef,
    TokenBuild,
    TokenCaptureMetrics,
    assemble,
    trajectories_for_rollout,
    trajectories_from_source,
)
from capture_core.tokens.delivery import TokenDelivery, TokenDeliverySummary
from capture_core.tokens.entry import (
    REQUIRED_TOKEN_FIELDS,
    TOKEN_ENTRY_SCHEMA_VERSION,
    TOKEN_FIELDS,
    TokenEntry,
    build_token_entry,
    canonical_line,
    entry_digest,
    extract_token_fields,
    response_to_output_items,
    split_token_fields,
)
from capture_core.tokens.layout import (
    ENTRIES_SUFFIX,
    INCOMPLETE_SUFFIX,
    INTENTS_SUFFIX,
    LOCK_SUFFIX,
    STATE_SUFFIX,
    validate_model_call_id,
)
from capture_core.tokens.projection import (
    check_prefix_contiguity,
    project_chain_to_output_items,
    project_main_chain_response,
)
from capture_core.tokens.protocols import (
    CallIntentSink,
    TokenCaptureSnapshot,
    TokenSink,
    TokenSource,
)
from capture_core.tokens.rollout_delivery import (
    MASK_SAMPLE_KEY,
    TOKEN_CAPTURE_KEY,
    capture_build_can_retire,
    clear_token_captures_for_rollouts,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
    rollout_carries_token_ids,
)
from capture_core.tokens.settings import (
    TOKEN_ID_CAPTURE_KEY,
    TokenIdCaptureConfig,
    TokenIdCaptureSettings,
    build_token_sink,
    install_token_sink,
    install_token_source,
    installed_token_sink,
    installed_token_source,
    load_token_capture_config,
    make_token_store,
    resolve_token_sink,
    resolve_token_source,
    token_id_capture_dirs,
    token_id_capture_enabled_for_agent,
)
from capture_core.tokens.state import TokenCaptureState
from capture_core.tokens.store import TokenCaptureStore

__all__ = [
    "BUILDERS",
    "DEFAULT_BUILDER",
    "ENTRIES_SUFFIX",
    "INCOMPLETE_SUFFIX",
    "INTENTS_SUFFIX",
    "LOCK_SUFFIX",
    "MASK_SAMPLE_KEY",
    "NO_RECORDS_ERROR",
    "PER_REQUEST_ERROR",
    "REQUIRED_TOKEN_FIELDS",
    "STATE_SUFFIX",
    "TOKEN_CAPTURE_KEY",
    "TOKEN_ENTRY_SCHEMA_VERSION",
    "TOKEN_FIELDS",
    "TOKEN_ID_CAPTURE_KEY",
    "BuildNotes",
    "BuildOutput",
    "CallIntentSink",
    "Chain",
    "ChainLink",
    "SnapshotRef",
    "TokenBuild",
    "TokenCallCapture",
    "TokenCaptureMetrics",
    "TokenCaptureSnapshot",
    "TokenCaptureState",
    "TokenCaptureStore",
    "TokenDelivery",
    "TokenDeliverySummary",
    "TokenEntry",
    "TokenIdCaptureConfig",
    "TokenIdCaptureSettings",
    "TokenSink",
    "TokenSource",
    "assemble",
    "build_token_entry",
    "build_token_sink",
    "canonical_line",
    "capture_build_can_retire",
    "check_prefix_contiguity",
    "clear_token_captures_for_rollouts",
    "entry_digest",
    "extract_token_fields",
    "finalize_rollout_token_capture",
    "install_token_sink",
    "install_token_source",
    "installed_token_sink",
    "installed_token_source",
    "load_token_capture_config",
    "make_token_store",
    "per_request",
    "prefix_merging",
    "project_chain_to_output_items",
    "project_main_chain_response",
    "resolve_token_sink",
    "resolve_token_source",
    "response_to_output_items",
    "retire_rollout_token_capture",
    "rollout_carries_token_ids",
    "run_builder",
    "split_token_fields",
    "token_id_capture_dirs",
    "token_id_capture_enabled_for_agent",
    "trajectories_for_rollout",
    "trajectories_from_source",
    "validate_model_call_id",
]
