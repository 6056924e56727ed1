"""Manifest rows, manifests, receipts and removals: each cross-field rule."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from capture_core.staging import (
    STAGING_RULE_ERROR_TYPE,
    CallRecord,
    CaptureMode,
    ManifestFailure,
    RolloutManifest,
    RolloutReceipt,
    RolloutRemoval,
    TerminalSelection,
)
from tests.capture_core.staging.examples import valid_bodies


def _rule_error(model: type[BaseModel], body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    errors = caught.value.errors()
    assert [e["type"] for e in errors] == [STAGING_RULE_ERROR_TYPE], errors
    return str(errors[0]["msg"])


def _row(**changes: object) -> dict[str, Any]:
    return {**valid_bodies()["CallRecord"], **changes}


def _root_row(**changes: object) -> dict[str, Any]:
    return {**valid_bodies()["RolloutManifest"]["records"][0], **changes}


# --- CallRecord ------------------------------------------------------------------------------------


def test_call_record_defaults() -> None:
    body = _row()
    for optional in ("mode", "admitted_at", "output_fingerprint", "fingerprint_version"):
        del body[optional]
    row = CallRecord.model_validate(body)
    assert row.mode is CaptureMode.TOKEN_IN
    assert (row.admitted_at, row.output_fingerprint, row.fingerprint_version) == (None, None, 0)
    assert row.capture_key is None


def test_call_record_carries_a_capture_key() -> None:
    assert CallRecord.model_validate(_row(capture_key="r1")).capture_key == "r1"


def test_call_record_admitted_at_accepts_a_json_integer() -> None:
    row = CallRecord.model_validate_json(
        CallRecord.model_validate(_row())
        .model_dump_json()
        .replace('"admitted_at":1700000000.25', '"admitted_at":1700000000')
    )
    assert row.admitted_at == 1_700_000_000.0
    assert type(row.admitted_at) is float


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_row(delta_len=0, cum_len=5), "delta_len: must be > 0 for a staged call, got 0"),
        (_row(cum_len=9), "cum_len: must equal prev_len + delta_len (5 + 3 = 8), got 9"),
        (_row(parent_call_id=None), "prev_len: must be 0 when there is no parent_call_id, got 5"),
        (_row(prev_len=0, cum_len=3), "prev_len: must be > 0 when parent_call_id is set"),
        (_row(mode="text"), "mode: must be 'token_in' for a call with parent_call_id"),
        (_root_row(mode="token_in"), "mode: must be 'text' for a call without parent_call_id"),
    ],
)
def test_call_record_rules(body: dict[str, Any], message: str) -> None:
    assert _rule_error(CallRecord, body) == message


def test_call_record_needs_a_response_id_and_hashes() -> None:
    for field in ("response_id", "chain_hash", "cumulative_hash", "staging_key", "digest"):
        body = _row()
        del body[field]
        with pytest.raises(ValidationError) as caught:
            CallRecord.model_validate(body)
        assert [(e["type"], e["loc"]) for e in caught.value.errors()] == [("missing", (field,))]


def test_a_row_from_a_newer_writer_fails_validation() -> None:
    # Receipt assembly validates rows one by one and masks the rollout (invalid_manifest_row).
    with pytest.raises(ValidationError) as caught:
        CallRecord.model_validate(_row(finish_reason="stop"))
    assert caught.value.errors()[0]["type"] == "extra_forbidden"


# --- RolloutManifest -------------------------------------------------------------------------------


def test_empty_manifest_shape() -> None:
    manifest = RolloutManifest(rollout_id="r9")
    assert manifest.model_dump(mode="json") == {
        "schema_version": 3,
        "rollout_id": "r9",
        "records": [],
        "failures": [],
    }


def test_manifest_rows_carry_their_own_versions() -> None:
    dumped = RolloutManifest.model_validate(valid_bodies()["RolloutManifest"]).model_dump(
        mode="json"
    )
    for row in dumped["records"]:
        assert (row["schema_version"], row["digest_version"], row["extras_digest_version"]) == (
            3,
            2,
            1,
        )
    assert dumped["failures"][0]["schema_version"] == 3


def test_manifest_refuses_a_bad_row_by_index() -> None:
    body = copy.deepcopy(valid_bodies()["RolloutManifest"])
    body["records"][1]["cum_len"] = 99
    with pytest.raises(ValidationError) as caught:
        RolloutManifest.model_validate(body)
    error = caught.value.errors()[0]
    assert error["loc"] == ("records", 1)
    assert error["msg"].startswith("cum_len: must equal prev_len + delta_len")


def test_manifest_failure_reason_is_an_identifier() -> None:
    with pytest.raises(ValidationError):
        ManifestFailure(model_call_id="c1", reason="")
    assert ManifestFailure(model_call_id="c1", reason="future_reason").reason == "future_reason"


# --- RolloutReceipt --------------------------------------------------------------------------------


def _receipt(**changes: object) -> dict[str, Any]:
    return {**valid_bodies()["RolloutReceipt"], **changes}


def test_poisoned_receipt_without_selection() -> None:
    receipt = RolloutReceipt.model_validate(
        _receipt(
            capture_poisoned=True,
            terminal_model_call_id=None,
            terminal_selection=None,
            failure_reason="invalid_manifest_row",
            manifest=[],
        )
    )
    assert (receipt.failure_reason, receipt.terminal_selection) == ("invalid_manifest_row", None)


def test_receipt_selection_defaults_to_heuristic() -> None:
    body = _receipt()
    del body["terminal_selection"]
    assert RolloutReceipt.model_validate(body).terminal_selection is TerminalSelection.HEURISTIC


def test_poisoned_receipt_may_keep_a_terminal() -> None:
    receipt = RolloutReceipt.model_validate(
        _receipt(capture_poisoned=True, failure_reason="worker_capture_failed")
    )
    assert receipt.terminal_model_call_id == "c2"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            _receipt(manifest=[valid_bodies()["CallRecord"]] * 2),
            "manifest: model_call_id values must be unique, repeated: ['c2']",
        ),
        (
            _receipt(terminal_model_call_id="c9"),
            "terminal_model_call_id: 'c9' is not a row of the manifest",
        ),
        (
            _receipt(failure_reason="missing_terminal_row"),
            "failure_reason: must be null unless capture_poisoned is true",
        ),
        (
            _receipt(terminal_model_call_id=None),
            "terminal_model_call_id: is required unless capture_poisoned is true",
        ),
        (
            _receipt(terminal_selection=None),
            "terminal_selection: is required unless capture_poisoned is true",
        ),
        (
            _receipt(capture_poisoned=True, terminal_selection=None, failure_reason="x"),
            "terminal_model_call_id: must be null when terminal_selection is null",
        ),
        (
            _receipt(capture_poisoned=True, terminal_selection=None, terminal_model_call_id=None),
            "failure_reason: is required when terminal_selection is null",
        ),
    ],
)
def test_receipt_rules(body: dict[str, Any], message: str) -> None:
    assert _rule_error(RolloutReceipt, body) == message


@pytest.mark.parametrize("selection", ["declared", "response_id", "content", "heuristic"])
def test_receipt_selections(selection: str) -> None:
    receipt = RolloutReceipt.model_validate(_receipt(terminal_selection=selection))
    assert receipt.terminal_selection == selection


def test_receipt_refuses_an_unknown_selection() -> None:
    with pytest.raises(ValidationError) as caught:
        RolloutReceipt.model_validate(_receipt(terminal_selection="guess"))
    assert caught.value.errors()[0]["loc"] == ("terminal_selection",)


def test_receipt_capture_poisoned_is_a_strict_bool() -> None:
    with pytest.raises(ValidationError) as caught:
        RolloutReceipt.model_validate(_receipt(capture_poisoned=0))
    assert caught.value.errors()[0]["type"] == "bool_type"


# --- RolloutRemoval --------------------------------------------------------------------------------


def test_removal_route_body_without_schema_version() -> None:
    removal = RolloutRemoval.model_validate({"removed": ["r1"], "absent": []})
    assert (removal.removed, removal.absent, removal.schema_version) == (["r1"], [], 3)
    assert RolloutRemoval().model_dump() == {"schema_version": 3, "removed": [], "absent": []}


def test_removal_ids_are_identifiers() -> None:
    with pytest.raises(ValidationError) as caught:
        RolloutRemoval.model_validate({"removed": ["r1", ""], "absent": []})
    assert caught.value.errors()[0]["loc"] == ("removed", 1)
