"""Reason codes are spelled as on the wire; the package's public surface is sorted and light."""

from __future__ import annotations

import doctest
import importlib
import json
import subprocess
import sys

import pytest

from capture_core import staging
from capture_core.exceptions import CaptureError
from capture_core.staging import (
    NON_POISONING_FAILURE_REASONS,
    AttributionReason,
    InvalidStagedCallError,
    LedgerFailureReason,
    LineageResolutionReason,
    ReceiptFailureReason,
    StagingError,
    StreamingUnsupportedError,
    TerminalSelectionResult,
    VerificationCode,
    wrong_field_code,
)

EXPECTED: dict[type, set[str]] = {
    LedgerFailureReason: {
        "unresolved_parent",
        "request_finished_without_staged_coordinates",
        "worker_response_missing_commit_coordinates",
        "worker_capture_failed",
        "invalid_worker_commit_coordinates",
        "ledger_row_missing_response_id",
        "ledger_row_missing_chain_hash",
    },
    ReceiptFailureReason: {
        "invalid_manifest_row",
        "missing_declared_terminal_row",
        "missing_terminal_row",
        "capture_failed",
    },
    TerminalSelectionResult: {
        "selected",
        "no_records",
        "duplicate_call_id",
        "orphaned_row",
        "no_root",
        "ambiguous_terminal",
    },
    AttributionReason: {
        "declared_terminal_not_captured",
        "declared_ambiguous",
        "response_id_ambiguous",
        "response_id_no_match",
        "response_has_no_id",
        "no_response_object",
        "response_has_no_output",
        "response_output_unfingerprintable",
        "no_model_authored_output",
        "content_ambiguous",
        "no_content_match",
        "agent_boundary_model_call_id",
    },
    LineageResolutionReason: {
        "no_match",
        "ambiguous",
        "resolver_unavailable",
        "lookup_error",
        "explicit_parent_missing",
        "explicit_parent_fingerprint_mismatch",
        "explicit_parent_tokens_missing",
        "not_attempted",
    },
    VerificationCode: {
        "unsupported_schema",
        "unsupported_digest",
        "unsupported_extras_digest",
        "rollout_failed",
        "capture_poisoned",
        "empty_manifest",
        "duplicate_manifest_row",
        "duplicate_staging_key",
        "row_count_mismatch",
        "duplicate_snapshot",
        "snapshot_identity_mismatch",
        "snapshot_order_mismatch",
        "wrong_rollout",
        "invalid_snapshot",
        "corrupt_digest",
        "missing_parent",
        "parent_length_mismatch",
        "lineage_cycle",
        "missing_terminal",
        "chain_hash_mismatch",
        "invalid_mask_order",
        "empty_generation",
        "empty_training_row",
        "cumulative_hash_mismatch",
    },
}


@pytest.mark.parametrize("enum", EXPECTED)
def test_codes_are_spelled_as_on_the_wire(enum: type) -> None:
    members = list(enum)  # type: ignore[call-overload]
    assert {m.value for m in members} == EXPECTED[enum]
    # Member names are the upper-cased codes, so code reads like the wire.
    assert all(m.name == m.value.upper() for m in members)
    assert all(json.dumps(m) == f'"{m.value}"' for m in members)


def test_only_one_failure_reason_does_not_poison() -> None:
    assert {"request_finished_without_staged_coordinates"} == NON_POISONING_FAILURE_REASONS


def test_wrong_field_code() -> None:
    assert wrong_field_code("cum_len") == "wrong_cum_len"


def test_error_hierarchy() -> None:
    assert issubclass(StagingError, CaptureError)
    assert issubclass(StreamingUnsupportedError, StagingError)
    error = InvalidStagedCallError("cum_len", "must add up")
    assert isinstance(error, StagingError)
    assert isinstance(error, ValueError)
    assert (error.field, error.reason, str(error)) == (
        "cum_len",
        "must add up",
        "cum_len: must add up",
    )


def _isort_key(name: str) -> tuple[int, str]:
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_public_names_are_sorted_and_exist() -> None:
    names = list(staging.__all__)
    assert names == sorted(names, key=_isort_key)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(staging, name), name


def test_import_stays_light() -> None:
    code = (
        "import sys, json, capture_core.staging; "
        "print(json.dumps([m for m in ('polars', 'plotly', 'ipywidgets', 'wandb', 'numpy') "
        "if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


MODULES = ["admission", "build", "digests", "manifest", "reasons", "records"]


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str) -> None:
    loaded = importlib.import_module(f"capture_core.staging.{module}")
    result = doctest.testmod(loaded, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
