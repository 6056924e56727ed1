"""Admissions, sink results and commit coordinates: each cross-field rule."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from capture_core.staging import (
    CAPTURE_ADMISSION_KEY,
    COMMIT_COORDS_KEY,
    STAGING_RULE_ERROR_TYPE,
    CaptureAdmission,
    CaptureMode,
    CommitCoords,
    Disposition,
    GenerationCutContinuation,
    StageResult,
)
from tests.capture_core.staging.examples import chain_records, valid_bodies

PAYLOAD = ("digest", "extras_digest", "staging_key", "chain_hash", "cumulative_hash")


def _rule_error(model: type[BaseModel], body: dict[str, Any]) -> str:
    """The message of the one staging-rule error ``body`` raises."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    errors = caught.value.errors()
    assert [e["type"] for e in errors] == [STAGING_RULE_ERROR_TYPE], errors
    return str(errors[0]["msg"])


def test_wire_keys() -> None:
    assert (CAPTURE_ADMISSION_KEY, COMMIT_COORDS_KEY) == ("ng_capture", "ng_commit_coords")


# --- StageResult ---------------------------------------------------------------------------------


def test_stage_result_outcomes() -> None:
    assert StageResult(ok=True, staging_key="r/c").staging_key == "r/c"
    failed = StageResult(ok=False, error="disk full")
    assert (failed.ok, failed.staging_key, failed.error) == (False, None, "disk full")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"ok": True}, "staging_key: is required when ok is true"),
        ({"ok": True, "error": "x"}, "staging_key: is required when ok is true"),
        ({"ok": False}, "error: must be a non-empty message when ok is false"),
        ({"ok": False, "error": ""}, "error: must be a non-empty message when ok is false"),
    ],
)
def test_stage_result_rules(body: dict[str, Any], message: str) -> None:
    assert _rule_error(StageResult, body) == message


def test_stage_result_ok_is_a_strict_bool() -> None:
    with pytest.raises(ValidationError, match="valid boolean"):
        StageResult.model_validate({"ok": 1, "staging_key": "r/c"})


# --- CommitCoords --------------------------------------------------------------------------------


def test_coords_for_a_staged_record() -> None:
    _, c2 = chain_records()
    coords = CommitCoords.for_staged(c2, staging_key="bucket/r1/c2")
    assert coords.disposition is Disposition.STAGED
    assert coords.staging_key == "bucket/r1/c2"
    same = [*PAYLOAD, "rollout_id", "model_call_id", "parent_call_id", "prev_len", "delta_len"]
    same = [*same, "cum_len", "weight_version"]
    same.remove("staging_key")
    assert {f: getattr(coords, f) for f in same} == {f: getattr(c2, f) for f in same}


def test_coords_for_a_failure() -> None:
    coords = CommitCoords.for_failure(
        rollout_id="r1", model_call_id="c2", parent_call_id="c1", prev_len=5, weight_version=7
    )
    dumped = coords.model_dump(mode="json")
    assert dumped["disposition"] == "capture_failed"
    assert (dumped["delta_len"], dumped["cum_len"]) == (0, 5)
    assert [dumped[f] for f in PAYLOAD] == [None] * 5
    root = CommitCoords.for_failure(
        rollout_id="r1", model_call_id="c1", parent_call_id=None, prev_len=0, weight_version=0
    )
    assert (root.prev_len, root.cum_len) == (0, 0)


@pytest.mark.parametrize("field", PAYLOAD)
def test_staged_coords_need_every_payload_field(field: str) -> None:
    body = {**valid_bodies()["CommitCoords"], field: None}
    assert _rule_error(CommitCoords, body) == f"disposition: 'staged' requires {field}"


def test_staged_coords_name_every_missing_field() -> None:
    body = {**valid_bodies()["CommitCoords"], **dict.fromkeys(PAYLOAD)}
    assert _rule_error(CommitCoords, body) == (
        "disposition: 'staged' requires digest, extras_digest, staging_key, chain_hash, "
        "cumulative_hash"
    )


def test_staged_coords_need_a_delta() -> None:
    body = {**valid_bodies()["CommitCoords"], "delta_len": 0, "cum_len": 5}
    assert _rule_error(CommitCoords, body) == "delta_len: must be > 0 for a staged call, got 0"


def _failed_body(**changes: object) -> dict[str, Any]:
    body = {**valid_bodies()["CommitCoords"], "disposition": "capture_failed"}
    body.update(dict.fromkeys(PAYLOAD))
    body.update(delta_len=0, cum_len=body["prev_len"])
    body.update(changes)
    return body


def test_failed_coords_validate() -> None:
    assert CommitCoords.model_validate(_failed_body()).disposition is Disposition.CAPTURE_FAILED


@pytest.mark.parametrize("field", PAYLOAD)
def test_failed_coords_carry_no_payload(field: str) -> None:
    value = valid_bodies()["CommitCoords"][field]
    message = _rule_error(CommitCoords, _failed_body(**{field: value}))
    assert message == f"disposition: 'capture_failed' carries no {field}"


def test_failed_coords_carry_no_delta() -> None:
    message = _rule_error(CommitCoords, _failed_body(delta_len=3, cum_len=8))
    assert message == "delta_len: must be 0 for 'capture_failed', got 3"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cum_len": 9}, "cum_len: must equal prev_len + delta_len (5 + 3 = 8), got 9"),
        (
            {"parent_call_id": None},
            "prev_len: must be 0 when there is no parent_call_id, got 5",
        ),
        (
            {"prev_len": 0, "cum_len": 3},
            "prev_len: must be > 0 when parent_call_id is set",
        ),
    ],
)
def test_coords_lineage_rules(changes: dict[str, object], message: str) -> None:
    body = {**valid_bodies()["CommitCoords"], **changes}
    assert _rule_error(CommitCoords, body) == message


def test_coords_refuse_an_unknown_disposition() -> None:
    with pytest.raises(ValidationError, match="disposition"):
        CommitCoords.model_validate({**valid_bodies()["CommitCoords"], "disposition": "partial"})


# --- CaptureAdmission ----------------------------------------------------------------------------


def _admission(**changes: object) -> dict[str, Any]:
    return {**valid_bodies()["CaptureAdmission"], **changes}


def _root(**changes: object) -> dict[str, Any]:
    return {"rollout_id": "r1", "model_call_id": "c1", "mode": "text", **changes}


def test_root_admission_defaults() -> None:
    admission = CaptureAdmission.model_validate(_root())
    assert admission.mode is CaptureMode.TEXT
    assert (admission.parent_call_id, admission.prev_len, admission.parent_chain_hash) == (
        None,
        0,
        None,
    )
    assert (admission.required_prefix_token_ids, admission.staging_chain) == ([], [])


def test_inline_prefix_admission() -> None:
    body = _admission(staging_chain=[], required_prefix_token_ids=[1, 2, 3, 4, 5])
    assert CaptureAdmission.model_validate(body).required_prefix_token_ids == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_admission(parent_call_id=None), "mode: 'token_in' requires parent_call_id"),
        (_admission(parent_chain_hash=None), "mode: 'token_in' requires parent_chain_hash"),
        (
            _admission(parent_call_id=None, parent_chain_hash=None),
            "mode: 'token_in' requires parent_call_id, parent_chain_hash",
        ),
        (_admission(prev_len=0), "prev_len: must be > 0 for mode 'token_in'"),
        (
            _admission(staging_chain=[], required_prefix_token_ids=[1, 2]),
            "required_prefix_token_ids: must hold prev_len (5) ids when staging_chain is empty, "
            "got 2",
        ),
        (_root(parent_call_id="c0"), "mode: 'text' carries no parent_call_id"),
        (_root(required_prefix_token_ids=[1]), "mode: 'text' carries no required_prefix_token_ids"),
        (_root(staging_chain=["r1/c0"]), "mode: 'text' carries no staging_chain"),
        (_root(parent_chain_hash="a" * 64), "mode: 'text' carries no parent_chain_hash"),
        (_root(prev_len=3), "prev_len: must be 0 for mode 'text', got 3"),
    ],
)
def test_admission_rules(body: dict[str, Any], message: str) -> None:
    assert _rule_error(CaptureAdmission, body) == message


def test_admission_prefix_ids_are_non_negative_ints() -> None:
    body = _admission(staging_chain=[], required_prefix_token_ids=[1, 2, 3, 4, -5])
    with pytest.raises(ValidationError) as caught:
        CaptureAdmission.model_validate(body)
    error = caught.value.errors()[0]
    assert (error["type"], error["loc"]) == ("greater_than_equal", ("required_prefix_token_ids", 4))


def test_admission_needs_a_mode() -> None:
    with pytest.raises(ValidationError) as caught:
        CaptureAdmission.model_validate({"rollout_id": "r1", "model_call_id": "c1"})
    assert [(e["type"], e["loc"]) for e in caught.value.errors()] == [("missing", ("mode",))]


# --- GenerationCutContinuation -------------------------------------------------------------------


def _cut(**changes: object) -> dict[str, Any]:
    return {**valid_bodies()["GenerationCutContinuation"], **changes}


def test_cut_keeps_its_stop_reason_types() -> None:
    assert (
        GenerationCutContinuation.model_validate(_cut(terminal_stop_reason=7)).terminal_stop_reason
        == 7
    )
    text = GenerationCutContinuation.model_validate(_cut(terminal_stop_reason="</s>"))
    assert text.terminal_stop_reason == "</s>"
    assert GenerationCutContinuation.model_validate(_cut()).staging_keys == ("r1/c1",)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_cut(staging_keys=["r1/c1", "r1/c1"]), "staging_keys: must not repeat a key"),
        (
            _cut(terminal_finish_reason=None, terminal_stop_reason="eos"),
            "terminal_stop_reason: requires terminal_finish_reason",
        ),
    ],
)
def test_cut_rules(body: dict[str, Any], message: str) -> None:
    assert _rule_error(GenerationCutContinuation, body) == message


@pytest.mark.parametrize(
    ("changes", "error_type"),
    [
        ({"staging_keys": []}, "too_short"),
        ({"effective_output_limit": 0}, "greater_than_equal"),
        ({"terminal_finish_reason": "tool_calls"}, "literal_error"),
        ({"terminal_stop_reason": 1.5}, "int_type"),
    ],
)
def test_cut_field_types(changes: dict[str, object], error_type: str) -> None:
    with pytest.raises(ValidationError) as caught:
        GenerationCutContinuation.model_validate(_cut(**changes))
    assert error_type in {e["type"] for e in caught.value.errors()}
