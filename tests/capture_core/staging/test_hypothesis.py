"""Properties of building, serializing and hashing staged rows."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from capture_core.staging import (
    CommitCoords,
    StagedCallRecord,
    StagedCallSnapshot,
    build_staged_call_record,
    compute_cumulative_hash,
    compute_extras_digest,
)
from capture_core.staging._encoding import extras_value

TOKEN_IDS = st.integers(min_value=0, max_value=2**31 - 1)
# Finite floats that are also finite in float32 (what a logprob can be).
LOGPROBS = st.floats(allow_nan=False, allow_infinity=False, width=32) | st.floats(
    min_value=-1e38, max_value=1e38, allow_nan=False
)
CHARACTERS = st.characters(exclude_categories=["Cs"])  # lone surrogates are not UTF-8
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=CHARACTERS, max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(alphabet=CHARACTERS, max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def calls(draw: st.DrawFn) -> dict[str, Any]:
    prompt = draw(st.lists(TOKEN_IDS, max_size=40))
    generated = draw(st.lists(TOKEN_IDS, min_size=0 if prompt else 1, max_size=40))
    logprobs = draw(st.lists(LOGPROBS, min_size=len(generated), max_size=len(generated)))
    # prev_len leaves at least one token in the delta.
    top = len(prompt) if generated else len(prompt) - 1
    prev_len = draw(st.integers(min_value=0, max_value=top))
    parent: dict[str, Any] = {}
    if prev_len:
        parent = {
            "parent_call_id": draw(st.text(alphabet=CHARACTERS, min_size=1, max_size=8)),
            "parent_chain_hash": draw(st.binary(min_size=32, max_size=32)).hex(),
        }
    keys = st.text(alphabet=CHARACTERS, max_size=6)
    extras = draw(st.none() | st.dictionaries(keys, JSON_VALUES, max_size=3))
    return {
        "rollout_id": draw(st.text(alphabet=CHARACTERS, min_size=1, max_size=12)),
        "model_call_id": draw(st.text(alphabet=CHARACTERS, min_size=1, max_size=12)),
        "prompt_token_ids": prompt,
        "generated_token_ids": generated,
        "generated_logprobs": logprobs,
        "weight_version": draw(st.integers(min_value=0, max_value=2**64 - 1)),
        "prev_len": prev_len,
        "extras": extras,
        **parent,
    }


@settings(max_examples=150, deadline=None)
@given(calls())
def test_json_round_trip_keeps_the_digest(call: dict[str, Any]) -> None:
    record = build_staged_call_record(**call)
    text = record.model_dump_json()
    again = StagedCallRecord.model_validate_json(text)
    assert again == record
    assert again.digest == record.digest
    assert again.model_dump_json() == text
    # Floats survive JSON bit for bit (float32 bits are what the digest hashes).
    original = struct.pack(f">{record.delta_len}d", *record.generation_log_probs_delta)
    assert struct.pack(f">{again.delta_len}d", *again.generation_log_probs_delta) == original
    snapshot = StagedCallSnapshot.model_validate_json(text)
    assert snapshot.digest == record.digest
    coords = CommitCoords.for_staged(record, staging_key="k")
    assert CommitCoords.model_validate_json(coords.model_dump_json()) == coords


@settings(max_examples=100, deadline=None)
@given(calls())
def test_digests_are_deterministic_and_consistent(call: dict[str, Any]) -> None:
    first = build_staged_call_record(**call)
    second = build_staged_call_record(**call)
    assert first.digest == second.digest
    assert first.chain_hash == second.chain_hash
    prompt = list(call["prompt_token_ids"])
    generated = list(call["generated_token_ids"])
    assert first.cumulative_hash == compute_cumulative_hash(prompt + generated)
    assert first.extras_digest == compute_extras_digest(call["extras"])
    assert first.token_mask_delta.count(1.0) == len(generated)


@settings(max_examples=100, deadline=None)
@given(calls(), st.data())
def test_negative_zero_logprob_changes_the_digest(
    call: dict[str, Any], data: st.DataObject
) -> None:
    logprobs = list(call["generated_logprobs"])
    assume(logprobs)
    index = data.draw(st.integers(min_value=0, max_value=len(logprobs) - 1))
    digests = set()
    for zero in (0.0, -0.0):
        logprobs[index] = zero
        record = build_staged_call_record(**{**call, "generated_logprobs": logprobs})
        digests.add(record.digest)
    assert len(digests) == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=30))
def test_int_runs_match_the_one_at_a_time_encoding(values: list[int]) -> None:
    one_at_a_time = b"".join(b"I" + v.to_bytes(8, "big", signed=True) for v in values)
    expected = b"L" + len(values).to_bytes(8, "big") + one_at_a_time
    assert extras_value(values, "v") == expected
