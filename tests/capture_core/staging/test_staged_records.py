"""Staged rows: rules of the staging format, digests recomputed on validation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from capture_core.staging import (
    DIGEST_MISMATCH_ERROR_TYPE,
    EMPTY_EXTRAS_DIGEST,
    EXTRAS_DIGEST_MISMATCH_ERROR_TYPE,
    STAGING_RULE_ERROR_TYPE,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagedCallSnapshot,
    build_staged_call_record,
)
from tests.capture_core.staging.examples import (
    GOLDEN_DIGEST,
    GOLDEN_DIGEST_NEGATIVE_ZERO,
    golden_record_json,
)


def _only_error(
    body: dict[str, Any], model: type[StagedCallBaseSnapshot] = StagedCallRecord
) -> Any:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    errors = caught.value.errors()
    assert len(errors) == 1, errors
    return errors[0]


def test_golden_record_validates() -> None:
    record = StagedCallRecord.model_validate(golden_record_json())
    assert record.digest == GOLDEN_DIGEST
    assert record.extras == {"routed_experts": [[[1, 2]], [[3, 4]]]}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rollout_id", "rollout-2"),
        ("model_call_id", "call-2"),
        ("parent_call_id", "parent-2"),
        ("weight_version", 8),
        ("token_ids_delta", [10, 12]),
        ("token_mask_delta", [1.0, 1.0]),
        ("generation_log_probs_delta", [0.0, -0.5]),
        ("chain_hash", "3" * 64),
        ("cumulative_hash", "4" * 64),
    ],
)
def test_tampered_content_is_a_digest_mismatch(field: str, value: object) -> None:
    error = _only_error({**golden_record_json(), field: value})
    assert error["type"] == DIGEST_MISMATCH_ERROR_TYPE
    assert error["ctx"]["field"] == "digest"
    assert error["msg"].startswith("digest: does not match the row's content")
    assert GOLDEN_DIGEST in error["msg"]


def test_tampered_digest_is_a_digest_mismatch() -> None:
    error = _only_error({**golden_record_json(), "digest": "0" * 64})
    assert error["type"] == DIGEST_MISMATCH_ERROR_TYPE
    assert f"computed {GOLDEN_DIGEST}" in error["msg"]


@pytest.mark.parametrize(
    "extras",
    [
        None,
        {},
        {"routed_experts": [[[1, 2]], [[3, 5]]]},
        {"routed_experts": [[[1, 2]], [[3, 4.0]]]},
    ],
)
def test_extras_that_disagree_with_extras_digest_are_refused(extras: object) -> None:
    error = _only_error({**golden_record_json(), "extras": extras})
    assert error["type"] == EXTRAS_DIGEST_MISMATCH_ERROR_TYPE
    assert error["ctx"]["field"] == "extras_digest"
    assert error["msg"].startswith("extras_digest: does not match extras")


def test_changed_extras_digest_is_caught_by_the_staged_digest() -> None:
    # Changing extras and extras_digest together still breaks the staged-call digest.
    body = {**golden_record_json(), "extras": None, "extras_digest": EMPTY_EXTRAS_DIGEST}
    assert _only_error(body)["type"] == DIGEST_MISMATCH_ERROR_TYPE


@pytest.mark.parametrize(
    ("extras", "reason"),
    [({"a": float("nan")}, "finite"), ({"a": (1,)}, "tuple"), ({"a": 2**64}, "outside")],
)
def test_extras_without_an_encoding_are_refused(extras: dict[str, object], reason: str) -> None:
    error = _only_error({**golden_record_json(), "extras": extras})
    assert error["type"] == STAGING_RULE_ERROR_TYPE
    assert error["ctx"]["field"] == "extras.a"
    assert reason in error["msg"]


# Each row rule of the staging format, broken once (the digest is left as is: the rule is
# checked first, so the error names the rule rather than the digest).
ROW_RULES: list[tuple[dict[str, object], str, str]] = [
    ({"cum_len": 6}, "cum_len", "must equal prev_len + delta_len (3 + 2 = 5), got 6"),
    ({"parent_call_id": None}, "mode", "must be 'text' for a call without parent_call_id"),
    ({"mode": "text"}, "mode", "must be 'token_in' for a call with parent_call_id"),
    (
        {"parent_call_id": None, "mode": "text"},
        "prev_len",
        "must be 0 when there is no parent_call_id, got 3",
    ),
    ({"prev_len": 0, "cum_len": 2}, "prev_len", "must be > 0 when parent_call_id is set"),
    (
        {
            "delta_len": 0,
            "cum_len": 3,
            "token_ids_delta": [],
            "token_mask_delta": [],
            "generation_log_probs_delta": [],
        },
        "delta_len",
        "must be > 0 for a staged call, got 0",
    ),
    ({"delta_len": 3, "cum_len": 6}, "delta_len", "must equal len(token_ids_delta) (2), got 3"),
    (
        {"token_mask_delta": [0.0]},
        "token_mask_delta",
        "must have as many values as token_ids_delta (2), got 1",
    ),
    (
        {"generation_log_probs_delta": [0.0, -0.25, -1.0]},
        "generation_log_probs_delta",
        "must have as many values as token_ids_delta (2), got 3",
    ),
    ({"token_mask_delta": [0.0, 0.5]}, "token_mask_delta", "every value must be 0.0 or 1.0"),
    (
        {"generation_log_probs_delta": [-0.125, -0.25]},
        "generation_log_probs_delta",
        "must be 0.0 wherever token_mask_delta is 0.0 (position 0 is -0.125)",
    ),
]


@pytest.mark.parametrize(("change", "field", "message"), ROW_RULES)
@pytest.mark.parametrize("model", [StagedCallRecord, StagedCallBaseSnapshot])
def test_row_rules_name_the_rule(
    change: dict[str, object], field: str, message: str, model: type[StagedCallBaseSnapshot]
) -> None:
    body = {**golden_record_json(), **change}
    if model is StagedCallBaseSnapshot:
        del body["extras"]
    error = _only_error(body, model)
    assert error["type"] == STAGING_RULE_ERROR_TYPE
    assert error["ctx"]["field"] == field
    assert error["msg"] == f"{field}: {message}"


@pytest.mark.parametrize(
    ("change", "loc", "error_type"),
    [
        ({"token_ids_delta": [10, -1]}, ("token_ids_delta", 1), "greater_than_equal"),
        ({"token_ids_delta": [10, 2**64]}, ("token_ids_delta", 1), "less_than"),
        ({"token_mask_delta": [0.0, True]}, ("token_mask_delta", 1), "float_type"),
        ({"mode": "tokens"}, ("mode",), "enum"),
        ({"prev_len": -1}, ("prev_len",), "greater_than_equal"),
        ({"extras": [1]}, ("extras",), "dict_type"),
        ({"token_ids_delta": "10,11"}, ("token_ids_delta",), "list_type"),
    ],
)
def test_field_types(change: dict[str, object], loc: tuple[object, ...], error_type: str) -> None:
    error = _only_error({**golden_record_json(), **change})
    assert (error["type"], error["loc"]) == (error_type, loc)


def test_json_integer_masks_validate_as_floats_with_the_same_digest() -> None:
    body = golden_record_json()
    text = json.dumps(body).replace('"token_mask_delta": [0.0, 1.0]', '"token_mask_delta": [0, 1]')
    assert '"token_mask_delta": [0, 1]' in text
    record = StagedCallRecord.model_validate_json(text)
    assert record.token_mask_delta == [0.0, 1.0]
    assert all(type(value) is float for value in record.token_mask_delta)
    assert record.digest == GOLDEN_DIGEST


def test_negative_zero_survives_json_and_keeps_its_digest() -> None:
    body = {
        **golden_record_json(),
        "generation_log_probs_delta": [-0.0, -0.25],
        "digest": GOLDEN_DIGEST_NEGATIVE_ZERO,
    }
    record = StagedCallRecord.model_validate(body)
    again = StagedCallRecord.model_validate_json(record.model_dump_json())
    assert str(again.generation_log_probs_delta[0]) == "-0.0"
    assert again.digest == GOLDEN_DIGEST_NEGATIVE_ZERO
    # The golden digest is for +0.0: presenting -0.0 under it is a mismatch.
    assert _only_error({**body, "digest": GOLDEN_DIGEST})["type"] == DIGEST_MISMATCH_ERROR_TYPE


def test_base_snapshot_has_no_extras_and_checks_only_the_digest() -> None:
    body = golden_record_json()
    extras = body.pop("extras")
    base = StagedCallBaseSnapshot.model_validate(body)
    assert base.digest == GOLDEN_DIGEST
    assert "extras" not in base.model_dump()
    assert _only_error({**body, "extras": extras}, StagedCallBaseSnapshot)["type"] == (
        "extra_forbidden"
    )


def test_snapshot_is_the_record_shape() -> None:
    body = golden_record_json()
    record = StagedCallRecord.model_validate(body)
    snapshot = StagedCallSnapshot.model_validate(record.model_dump())
    assert snapshot.model_dump() == record.model_dump()
    assert isinstance(snapshot, StagedCallRecord)
    assert list(StagedCallSnapshot.model_fields) == list(StagedCallRecord.model_fields)


def test_extras_digest_defaults_to_empty() -> None:
    record = build_staged_call_record(
        rollout_id="r",
        model_call_id="c",
        prompt_token_ids=[1],
        generated_token_ids=[2],
        generated_logprobs=[-0.5],
        weight_version=0,
    )
    body = record.model_dump()
    del body["extras_digest"], body["extras"]
    assert StagedCallRecord.model_validate(body) == record
    assert record.extras_digest == EMPTY_EXTRAS_DIGEST


def test_python_ints_in_float_columns_are_coerced_like_json() -> None:
    body = {**golden_record_json(), "token_mask_delta": [0, 1]}
    assert StagedCallRecord.model_validate(body).token_mask_delta == [0.0, 1.0]


def test_tuples_of_token_ids_become_lists() -> None:
    body = {**golden_record_json(), "token_ids_delta": (10, 11)}
    record = StagedCallRecord.model_validate(body)
    assert record.token_ids_delta == [10, 11]
    assert record.digest == GOLDEN_DIGEST
