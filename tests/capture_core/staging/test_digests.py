"""The staging digests reproduce the reference vectors byte for byte."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import pytest

from capture_core.staging import (
    EMPTY_EXTRAS_DIGEST,
    InvalidStagedCallError,
    compute_chain_hash,
    compute_cumulative_hash,
    compute_extras_digest,
    compute_staged_call_digest,
)
from capture_core.staging._encoding import MAX_EXTRAS_DEPTH, extras_value
from capture_core.staging.digests import _encode_staged_call
from tests.capture_core.staging.examples import (
    C1,
    C2,
    C2_EXTRAS,
    EMPTY_DIGEST,
    GOLDEN_DIGEST,
    GOLDEN_DIGEST_NEGATIVE_ZERO,
    GOLDEN_DIGEST_SCHEMA_2,
    GOLDEN_DIGEST_WEIGHT_8,
    GOLDEN_EXTRAS,
    GOLDEN_EXTRAS_DIGEST,
    golden_call_inputs,
)


def _unchecked_digest(inputs: dict[str, Any]) -> str:
    """The v2 digest without the row rules, to pin the byte layout of any single field."""
    payload = _encode_staged_call(
        versions=(
            inputs["schema_version"],
            inputs["digest_version"],
            inputs["extras_digest_version"],
        ),
        rollout_id=inputs["rollout_id"],
        model_call_id=inputs["model_call_id"],
        parent_call_id=inputs["parent_call_id"],
        mode=inputs["mode"],
        lengths=(
            inputs["prev_len"],
            inputs["delta_len"],
            inputs["cum_len"],
            inputs["weight_version"],
        ),
        columns=(
            inputs["token_ids_delta"],
            inputs["token_mask_delta"],
            inputs["generation_log_probs_delta"],
        ),
        hashes=(inputs["extras_digest"], inputs["chain_hash"], inputs["cumulative_hash"]),
    )
    return hashlib.sha256(b"nemo-gym-staging-call-v2" + payload).hexdigest()


# --- golden vectors ---------------------------------------------------------------------------


def test_golden_extras_digest() -> None:
    assert compute_extras_digest(GOLDEN_EXTRAS) == GOLDEN_EXTRAS_DIGEST


def test_golden_staged_call_digest() -> None:
    assert compute_staged_call_digest(**golden_call_inputs()) == GOLDEN_DIGEST


def test_empty_extras_digest() -> None:
    assert EMPTY_EXTRAS_DIGEST == EMPTY_DIGEST
    assert compute_extras_digest(None) == EMPTY_DIGEST
    # The empty object is a value, not the absence of extras.
    assert compute_extras_digest({}) != EMPTY_DIGEST


def test_schema_byte_is_three() -> None:
    inputs = golden_call_inputs()
    assert _unchecked_digest(inputs) == GOLDEN_DIGEST
    assert _unchecked_digest({**inputs, "schema_version": 2}) == GOLDEN_DIGEST_SCHEMA_2


def test_sign_of_zero_changes_the_digest() -> None:
    inputs = golden_call_inputs()
    negative = {**inputs, "generation_log_probs_delta": [-0.0, -0.25]}
    assert compute_staged_call_digest(**negative) == GOLDEN_DIGEST_NEGATIVE_ZERO
    assert GOLDEN_DIGEST_NEGATIVE_ZERO != GOLDEN_DIGEST


def test_weight_version_variant() -> None:
    inputs = {**golden_call_inputs(), "weight_version": 8}
    assert compute_staged_call_digest(**inputs) == GOLDEN_DIGEST_WEIGHT_8


def test_chain_vectors_from_raw_functions() -> None:
    assert compute_chain_hash(None, [1, 2, 3, 4, 5]) == C1["chain_hash"]
    assert compute_cumulative_hash([1, 2, 3, 4, 5]) == C1["cumulative_hash"]
    assert compute_chain_hash(C1["chain_hash"], [6, 7, 8]) == C2["chain_hash"]
    assert compute_cumulative_hash([1, 2, 3, 4, 5, 6, 7, 8]) == C2["cumulative_hash"]
    assert compute_extras_digest(C2_EXTRAS) == C2["extras_digest"]
    c1 = compute_staged_call_digest(
        rollout_id="r1",
        model_call_id="c1",
        parent_call_id=None,
        mode="text",
        prev_len=0,
        delta_len=5,
        cum_len=5,
        weight_version=7,
        token_ids_delta=[1, 2, 3, 4, 5],
        token_mask_delta=[0.0, 0.0, 0.0, 1.0, 1.0],
        generation_log_probs_delta=[0.0, 0.0, 0.0, -0.5, -0.25],
        extras_digest=EMPTY_DIGEST,
        chain_hash=C1["chain_hash"],
        cumulative_hash=C1["cumulative_hash"],
    )
    c2 = compute_staged_call_digest(
        rollout_id="r1",
        model_call_id="c2",
        parent_call_id="c1",
        mode="token_in",
        prev_len=5,
        delta_len=3,
        cum_len=8,
        weight_version=7,
        token_ids_delta=[6, 7, 8],
        token_mask_delta=[0.0, 0.0, 1.0],
        generation_log_probs_delta=[0.0, 0.0, -1.0],
        extras_digest=C2["extras_digest"],
        chain_hash=C2["chain_hash"],
        cumulative_hash=C2["cumulative_hash"],
    )
    assert (c1, c2) == (C1["digest"], C2["digest"])


# --- every field is covered ---------------------------------------------------------------------

SINGLE_FIELD_CHANGES: dict[str, object] = {
    "schema_version": 4,
    "digest_version": 3,
    "extras_digest_version": 2,
    "rollout_id": "rollout-2",
    "model_call_id": "call-2",
    "parent_call_id": None,
    "mode": "text",
    "prev_len": 4,
    "delta_len": 3,
    "cum_len": 6,
    "weight_version": 8,
    "token_ids_delta": [10, 12],
    "token_mask_delta": [1.0, 1.0],
    "generation_log_probs_delta": [0.0, -0.5],
    "extras_digest": EMPTY_DIGEST,
    "chain_hash": "3" * 64,
    "cumulative_hash": "4" * 64,
}


def test_the_change_table_covers_every_input() -> None:
    assert set(SINGLE_FIELD_CHANGES) == set(golden_call_inputs())


@pytest.mark.parametrize(("field", "value"), SINGLE_FIELD_CHANGES.items())
def test_changing_any_single_field_changes_the_hashed_bytes(field: str, value: object) -> None:
    changed = {**golden_call_inputs(), field: value}
    assert _unchecked_digest(changed) != GOLDEN_DIGEST


VALID_SINGLE_CHANGES = (
    "rollout_id",
    "model_call_id",
    "weight_version",
    "token_ids_delta",
    "generation_log_probs_delta",
    "extras_digest",
    "chain_hash",
    "cumulative_hash",
)


@pytest.mark.parametrize("field", VALID_SINGLE_CHANGES)
def test_changing_a_field_changes_the_public_digest(field: str) -> None:
    changed = {**golden_call_inputs(), field: SINGLE_FIELD_CHANGES[field]}
    digest = compute_staged_call_digest(**changed)
    assert len(digest) == 64
    assert digest != GOLDEN_DIGEST


def test_parent_call_id_and_mask_change_the_public_digest() -> None:
    other_parent = {**golden_call_inputs(), "parent_call_id": "parent-2"}
    assert compute_staged_call_digest(**other_parent) != GOLDEN_DIGEST
    # A generated token may carry logprob 0.0, so a 0.0 → 1.0 mask flip is still a valid row.
    flipped = {**golden_call_inputs(), "token_mask_delta": [1.0, 1.0]}
    assert compute_staged_call_digest(**flipped) != GOLDEN_DIGEST


def test_digest_layout_matches_a_hand_built_payload() -> None:
    inputs = golden_call_inputs()

    def text(s: str) -> bytes:
        return struct.pack(">Q", len(s.encode())) + s.encode()

    def column(fmt: str, values: list[Any]) -> bytes:
        raw = struct.pack(f">Q{len(values)}{fmt}", len(values), *values)
        return struct.pack(">Q", len(raw)) + raw

    payload = (
        bytes([3, 2, 1])
        + text("rollout-1")
        + text("call-1")
        + b"\x01"
        + text("parent-1")
        + text("token_in")
        + struct.pack(">4Q", 3, 2, 5, 7)
        + column("Q", inputs["token_ids_delta"])
        + column("f", inputs["token_mask_delta"])
        + column("f", inputs["generation_log_probs_delta"])
        + bytes.fromhex(GOLDEN_EXTRAS_DIGEST)
        + b"\x01"
        + bytes.fromhex("1" * 64)
        + b"\x01"
        + bytes.fromhex("2" * 64)
    )
    assert hashlib.sha256(b"nemo-gym-staging-call-v2" + payload).hexdigest() == GOLDEN_DIGEST


def test_streaming_column_header_equals_one_shot_form() -> None:
    from capture_core.staging._encoding import float32_list, length_prefixed, token_list

    ids = [7, 8, 9]
    one_shot = length_prefixed(token_list(ids, "ids"))
    assert one_shot == struct.pack(">QQ", 8 + 8 * 3, 3) + struct.pack(">3Q", *ids)
    values = [0.5, -0.25]
    assert length_prefixed(float32_list(values, "v")) == struct.pack(">QQ2f", 8 + 4 * 2, 2, *values)


# --- float32 encoding ----------------------------------------------------------------------------


def test_floats_are_rounded_to_float32_bit_patterns() -> None:
    from capture_core.staging._encoding import float32_list

    encoded = float32_list([0.1, -0.25, -0.0, 0.0, 1e-50], "v")
    assert encoded[8:] == bytes.fromhex("3dcccccdbe800000800000000000000000000000")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (float("-inf"), "finite"),
        (1e39, "float32"),
        (-3.5e38, "float32"),
        (1, "float"),
        (True, "float"),
    ],
)
def test_logprob_that_cannot_be_encoded_is_refused(value: object, reason: str) -> None:
    inputs = {**golden_call_inputs(), "generation_log_probs_delta": [0.0, value]}
    with pytest.raises(InvalidStagedCallError, match=reason) as caught:
        compute_staged_call_digest(**inputs)
    assert caught.value.field == "generation_log_probs_delta"


# --- rules enforced before hashing ---------------------------------------------------------------

RULE_BREAKS: list[tuple[dict[str, object], str, str]] = [
    ({"schema_version": 4}, "schema_version", "newer"),
    ({"schema_version": 2}, "schema_version", "no longer supported"),
    ({"schema_version": 3.0}, "schema_version", "must be the int 3"),
    ({"digest_version": 1}, "digest_version", "no longer supported"),
    ({"extras_digest_version": 2}, "extras_digest_version", "newer"),
    ({"rollout_id": ""}, "rollout_id", "non-empty"),
    ({"model_call_id": ""}, "model_call_id", "non-empty"),
    ({"parent_call_id": ""}, "parent_call_id", "non-empty"),
    ({"mode": "tokens"}, "mode", "'text' or 'token_in'"),
    ({"mode": "text"}, "mode", "'token_in' for a call with parent_call_id"),
    ({"parent_call_id": None}, "mode", "'text' for a call without parent_call_id"),
    ({"parent_call_id": None, "mode": "text"}, "prev_len", "must be 0"),
    ({"prev_len": 0, "cum_len": 2}, "prev_len", "must be > 0"),
    ({"prev_len": -1}, "prev_len", r"\[0, 2\*\*64\)"),
    ({"weight_version": True}, "weight_version", "must be an int"),
    ({"delta_len": 0, "cum_len": 3}, "delta_len", "must be > 0"),
    ({"delta_len": 3, "cum_len": 6}, "delta_len", "must equal len"),
    ({"token_mask_delta": [0.0]}, "token_mask_delta", "as many values"),
    ({"generation_log_probs_delta": [0.0, -0.25, 0.0]}, "generation_log_probs_delta", "as many"),
    ({"token_mask_delta": [0.0, 0.5]}, "token_mask_delta", "0.0 or 1.0"),
    ({"token_mask_delta": [0.0, float("nan")]}, "token_mask_delta", "0.0 or 1.0"),
    ({"generation_log_probs_delta": [-0.5, -0.25]}, "generation_log_probs_delta", "position 0"),
    ({"cum_len": 6}, "cum_len", r"prev_len \+ delta_len"),
    ({"token_ids_delta": [10, -1]}, "token_ids_delta", "outside"),
    ({"token_ids_delta": [10, 2**64]}, "token_ids_delta", "outside"),
    ({"token_ids_delta": [10, 11.0]}, "token_ids_delta", "must be an int"),
    ({"token_ids_delta": [10, False]}, "token_ids_delta", "must be an int"),
    ({"extras_digest": GOLDEN_EXTRAS_DIGEST.upper()}, "extras_digest", "lowercase hex"),
    ({"chain_hash": "1" * 63}, "chain_hash", "lowercase hex"),
    ({"cumulative_hash": None}, "cumulative_hash", "lowercase hex"),
    ({"rollout_id": "r\ud800"}, "rollout_id", "UTF-8"),
]


@pytest.mark.parametrize(("change", "field", "reason"), RULE_BREAKS)
def test_rules_are_enforced_before_hashing(
    change: dict[str, object], field: str, reason: str
) -> None:
    with pytest.raises(InvalidStagedCallError, match=reason) as caught:
        compute_staged_call_digest(**{**golden_call_inputs(), **change})
    assert caught.value.field == field
    assert isinstance(caught.value, ValueError)


def test_negative_zero_carry_logprob_is_a_zero() -> None:
    # -0.0 == 0.0, so a carried position may hold either; the digest still tells them apart.
    inputs = {**golden_call_inputs(), "generation_log_probs_delta": [-0.0, -0.25]}
    assert compute_staged_call_digest(**inputs) != compute_staged_call_digest(
        **golden_call_inputs()
    )


def test_chain_hash_refuses_a_bad_parent() -> None:
    with pytest.raises(InvalidStagedCallError, match="lowercase hex") as caught:
        compute_chain_hash("A" * 64, [1])
    assert caught.value.field == "parent_chain_hash"
    assert compute_chain_hash(None, []) != compute_chain_hash(None, [0])


def test_cumulative_hash_refuses_non_int_ids() -> None:
    with pytest.raises(InvalidStagedCallError, match="int"):
        compute_cumulative_hash([1, "2"])  # type: ignore[list-item]
    assert compute_cumulative_hash((1, 2)) == compute_cumulative_hash([1, 2])


# --- extras encoding ------------------------------------------------------------------------------


def _tagged_int(value: int) -> bytes:
    return b"I" + value.to_bytes(8, "big", signed=True)


def test_extras_encoding_by_hand() -> None:
    extras = {"b": [True, None, 1.5, "x"], "a": -2}
    expected = (
        b"D"
        + struct.pack(">Q", 2)
        + struct.pack(">Q", 1)
        + b"a"
        + _tagged_int(-2)
        + struct.pack(">Q", 1)
        + b"b"
        + b"L"
        + struct.pack(">Q", 4)
        + b"B\x01"
        + b"N"
        + b"F"
        + struct.pack(">d", 1.5)
        + b"S"
        + struct.pack(">Q", 1)
        + b"x"
    )
    assert extras_value(extras, "extras") == expected
    digest = hashlib.sha256(b"nemo-gym-staging-extras-v1\x01" + expected).hexdigest()
    assert compute_extras_digest(extras) == digest


def test_int_runs_encode_like_single_ints() -> None:
    values = [0, 1, -1, 2**63 - 1, -(2**63)]
    expected = b"L" + struct.pack(">Q", len(values)) + b"".join(map(_tagged_int, values))
    assert extras_value(values, "v") == expected
    mixed = [*values, "s"]
    assert extras_value(mixed, "v").startswith(b"L" + struct.pack(">Q", 6) + expected[9:])


def test_dict_keys_sort_by_utf8_bytes_not_insertion() -> None:
    assert compute_extras_digest({"b": 1, "a": 2}) == compute_extras_digest({"a": 2, "b": 1})
    encoded = extras_value({"\U00010000": 1, "\uffff": 2, "z": 3}, "extras")
    keys_in_order = [b"z", "\uffff".encode(), "\U00010000".encode()]
    positions = [encoded.index(key) for key in keys_in_order]
    assert positions == sorted(positions)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"a": 1}, {"a": 1.0}),
        ({"a": True}, {"a": 1}),
        ({"a": False}, {"a": None}),
        ({"a": 0.0}, {"a": -0.0}),
        ({"a": "1"}, {"a": 1}),
        ({"a": []}, {"a": {}}),
        ({"a": [1, 2]}, {"a": [2, 1]}),
    ],
)
def test_json_types_are_distinguished(left: dict[str, object], right: dict[str, object]) -> None:
    assert compute_extras_digest(left) != compute_extras_digest(right)


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("extras", "reason"),
    [
        ({"a": (1, 2)}, "tuple is not a JSON value"),
        ({"a": b"x"}, "bytes is not a JSON value"),
        ({"a": {1, 2}}, "set is not a JSON value"),
        ({"a": float("nan")}, "finite"),
        ({"a": [float("inf")]}, "finite"),
        ({"a": 2**63}, "outside"),
        ({"a": [1, -(2**63) - 1]}, "outside"),
        ({"a": {1: "x"}}, "keys must be str"),
        ({"a": "\udc80"}, "UTF-8"),
        ({"a": _nested(MAX_EXTRAS_DEPTH)}, "nested deeper"),
        ([1, 2], "must be a dict or None"),
    ],
)
def test_extras_without_a_canonical_encoding_are_refused(extras: object, reason: str) -> None:
    with pytest.raises(InvalidStagedCallError, match=reason):
        compute_extras_digest(extras)  # type: ignore[arg-type]


def test_extras_just_inside_the_depth_limit_are_accepted() -> None:
    assert len(compute_extras_digest({"a": _nested(MAX_EXTRAS_DEPTH - 1)})) == 64


def test_extras_error_names_the_path() -> None:
    with pytest.raises(InvalidStagedCallError) as caught:
        compute_extras_digest({"media": {"sizes": [[1, (2, 3)]]}})
    assert caught.value.field == "extras.media.sizes[0][1]"
