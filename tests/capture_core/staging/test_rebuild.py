"""verify_and_linearize: a three-call continuation rebuilds exactly; any damage gets its code."""

from __future__ import annotations

import doctest
import json
import random
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from capture_core.staging import (
    LinearizedRollout,
    RolloutReceipt,
    StagedCallRecord,
    StagedCallSnapshot,
    StagingError,
    VerificationCode,
    VerificationError,
    build_receipt,
    build_staged_call_record,
    compute_extras_digest,
    compute_staged_call_digest,
    rebuild,
    verify_and_linearize,
)
from tests.capture_core.staging.examples import call_record_json

# Three calls: a root text call, then two token_in continuations; the weight version changes
# before the third. The generated log-probs include values float32 cannot hold exactly (-0.1)
# and a signed zero, to show what "float32-exact as staged" means.
PROMPT = [101, 102, 103, 104]
GENERATIONS: list[tuple[list[int], list[int], list[float], int]] = [
    # (carried prompt tokens, generated tokens, generated log-probs, weight version)
    (PROMPT, [201, 202, 203], [-0.5, -1.25, -0.1], 3),
    ([301, 302], [401, 402], [-2.0, -0.0], 3),
    ([501], [601, 602, 603], [-3.5, -0.75, -0.3333333333333333], 4),
]
CALL_IDS = ["c1", "c2", "c3"]
ROUTED = {"routed_experts": [[[1, 2]], [[3, 4]]], "media_spans": [{"start": 0, "length": 2}]}
VERSION_CODES = {
    "schema_version": VerificationCode.UNSUPPORTED_SCHEMA,
    "digest_version": VerificationCode.UNSUPPORTED_DIGEST,
    "extras_digest_version": VerificationCode.UNSUPPORTED_EXTRAS_DIGEST,
}
DIGEST_HEX = re.compile(r"[0-9a-f]{64}")


def staged_calls(rollout_id: str = "r1") -> list[StagedCallRecord]:
    records: list[StagedCallRecord] = []
    tokens: list[int] = []
    for call_id, (carry, generated, logprobs, weight_version) in zip(
        CALL_IDS, GENERATIONS, strict=True
    ):
        parent = records[-1] if records else None
        prompt = [*tokens, *carry]
        records.append(
            build_staged_call_record(
                rollout_id=rollout_id,
                model_call_id=call_id,
                prompt_token_ids=prompt,
                generated_token_ids=generated,
                generated_logprobs=logprobs,
                weight_version=weight_version,
                parent_call_id=None if parent is None else parent.model_call_id,
                parent_chain_hash=None if parent is None else parent.chain_hash,
                prev_len=len(tokens),
                extras=dict(ROUTED) if call_id == "c2" else None,
            )
        )
        tokens = [*prompt, *generated]
    return records


def manifest_of(records: Sequence[StagedCallRecord], **top: Any) -> dict[str, Any]:
    rows = [call_record_json(r, response_id=f"resp-{r.model_call_id}") for r in records]
    return {"rollout_id": records[0].rollout_id, "records": rows, **top}


def receipt_of(records: Sequence[StagedCallRecord], terminal: str = "c3") -> RolloutReceipt:
    outcome = build_receipt(manifest_of(records), declared_terminal_call_id=terminal)
    assert not outcome.masked, outcome
    assert outcome.receipt is not None
    return outcome.receipt


def as_bytes(records: Sequence[StagedCallRecord]) -> list[bytes]:
    return [r.model_dump_json().encode() for r in records]


def by_key(records: Sequence[StagedCallRecord]) -> dict[str, bytes]:
    return {f"{r.rollout_id}/{r.model_call_id}": r.model_dump_json().encode() for r in records}


def receipt_with(rows: list[dict[str, Any]], terminal: str, **fields: Any) -> RolloutReceipt:
    """A receipt built directly, for manifests build_receipt would not produce."""
    return RolloutReceipt.model_validate(
        {
            "rollout_id": "r1",
            "manifest": rows,
            "terminal_model_call_id": terminal,
            "terminal_selection": "declared",
            **fields,
        }
    )


def code_of(receipt: RolloutReceipt, snapshots: Any) -> tuple[str, str | None]:
    with pytest.raises(VerificationError) as caught:
        verify_and_linearize(receipt, snapshots)
    return caught.value.code, caught.value.model_call_id


def bits(values: Sequence[float]) -> list[bytes]:
    return [struct.pack(">f", value) for value in values]


# --- The happy path --------------------------------------------------------------------------


FORMS: dict[str, Callable[[list[StagedCallRecord]], Any]] = {
    "json-bytes-in-order": as_bytes,
    "models-in-order": lambda records: [
        StagedCallSnapshot.model_validate(r.model_dump()) for r in records
    ],
    "records-in-order": list,
    "bytes-by-staging-key": by_key,
}


@pytest.mark.parametrize("form", FORMS)
def test_three_call_continuation_linearizes_exactly(form: str) -> None:
    records = staged_calls()
    row = verify_and_linearize(receipt_of(records), FORMS[form](records))

    tokens: list[int] = []
    mask: list[float] = []
    logprobs: list[float] = []
    for carry, generated, generated_logprobs, _ in GENERATIONS:
        tokens += carry + generated
        mask += [0.0] * len(carry) + [1.0] * len(generated)
        logprobs += [0.0] * len(carry) + generated_logprobs
    assert row.rollout_id == "r1"
    assert row.token_ids == tuple(tokens)
    assert all(type(t) is int for t in row.token_ids)
    assert bits(row.token_mask) == bits(mask)
    assert bits(row.logprobs) == bits(logprobs)
    assert row.model_call_ids == ("c1", "c2", "c3")
    assert row.prompt_len == len(PROMPT)
    assert row.weight_versions == (3, 3, 4)
    assert row.weight_version_spans == ((3, 0, 11), (4, 11, 15))
    assert len(row.token_ids) == len(row.token_mask) == len(row.logprobs) == 15


def test_logprobs_are_the_float32_values_that_were_hashed() -> None:
    row = verify_and_linearize(receipt_of(staged_calls()), as_bytes(staged_calls()))
    # -0.1 is staged as a float64 but hashed (and returned) as its float32 value.
    assert row.logprobs[6] == struct.unpack(">f", struct.pack(">f", -0.1))[0] != -0.1
    # The sign of a generated zero survives.
    assert struct.pack(">f", row.logprobs[10]) == struct.pack(">f", -0.0)
    assert all(type(value) is float for value in row.logprobs)


def test_an_intermediate_terminal_linearizes_its_own_lineage() -> None:
    records = staged_calls()
    row = verify_and_linearize(receipt_of(records, terminal="c2"), as_bytes(records))
    assert row.model_call_ids == ("c1", "c2")
    assert row.weight_version_spans == ((3, 0, 11),)
    assert len(row.token_ids) == 11


def test_a_dead_branch_is_verified_but_not_linearized() -> None:
    records = staged_calls()
    sibling = build_staged_call_record(
        rollout_id="r1",
        model_call_id="c2-retry",
        parent_call_id="c1",
        parent_chain_hash=records[0].chain_hash,
        prev_len=records[0].cum_len,
        prompt_token_ids=[*PROMPT, 201, 202, 203, 301],
        generated_token_ids=[999],
        generated_logprobs=[-9.0],
        weight_version=3,
    )
    everything = [*records, sibling]
    row = verify_and_linearize(receipt_of(everything), as_bytes(everything))
    assert row.model_call_ids == ("c1", "c2", "c3")
    assert 999 not in row.token_ids
    # Its snapshot is still required, and still checked.
    assert code_of(receipt_of(everything), as_bytes(records)) == (
        VerificationCode.ROW_COUNT_MISMATCH,
        None,
    )
    tampered = {**by_key(everything), "r1/c2-retry": as_bytes(records)[1]}
    assert code_of(receipt_of(everything), tampered) == (
        VerificationCode.DUPLICATE_SNAPSHOT,
        "c2",
    )
    missing = by_key(everything)
    del missing["r1/c2-retry"]
    assert code_of(receipt_of(everything), missing) == (
        VerificationCode.ROW_COUNT_MISMATCH,
        "c2-retry",
    )


def test_rows_restored_from_another_attempt_verify_against_their_capture_key() -> None:
    records = staged_calls(rollout_id="r1")
    rows = manifest_of(records)["records"]
    receipt = receipt_with([{**row, "capture_key": "r1"} for row in rows], "c3", rollout_id="r1-a1")
    assert verify_and_linearize(receipt, as_bytes(records)).rollout_id == "r1-a1"
    plain = receipt_with(rows, "c3", rollout_id="r1-a1")
    assert code_of(plain, as_bytes(records)) == (VerificationCode.WRONG_ROLLOUT, "c1")


# --- Tampering with staged bytes -------------------------------------------------------------


def expected_outcome(mutated: bytes, original: dict[str, Any]) -> str | None:
    """The code a byte-flipped snapshot must fail with, derived from what the flip changed.

    ``None`` means the flip changed nothing the snapshot means, so verification must succeed.
    """
    try:
        data = json.loads(mutated)
    except ValueError:
        return VerificationCode.INVALID_SNAPSHOT
    if not isinstance(data, dict) or set(data) != set(original):
        return VerificationCode.INVALID_SNAPSHOT
    changed = [k for k in original if json.dumps(data[k]) != json.dumps(original[k])]
    if not changed:
        return None
    (field,) = changed
    if field in VERSION_CODES:
        return (
            VERSION_CODES[field] if type(data[field]) is int else VerificationCode.INVALID_SNAPSHOT
        )
    if field in ("digest", "extras_digest"):
        well_formed = isinstance(data[field], str) and DIGEST_HEX.fullmatch(data[field])
        return VerificationCode.CORRUPT_DIGEST if well_formed else VerificationCode.INVALID_SNAPSHOT
    # Anything else: corrupt if the content would be a valid snapshot under its own digests.
    try:
        if field == "extras":
            data["extras_digest"] = compute_extras_digest(data["extras"])
        covered = {k: v for k, v in data.items() if k not in ("digest", "extras")}
        data["digest"] = compute_staged_call_digest(**covered)
        StagedCallSnapshot.model_validate(data)
    except (ValueError, TypeError):
        return VerificationCode.INVALID_SNAPSHOT
    if data["digest"] == original["digest"]:
        # A float64 change below float32 precision: the staged (hashed) content is unchanged.
        return None
    return VerificationCode.CORRUPT_DIGEST


@pytest.mark.parametrize("index", range(3))
def test_every_flipped_byte_of_a_snapshot_is_detected_with_its_code(index: int) -> None:
    records = staged_calls()
    receipt = receipt_of(records)
    clean = verify_and_linearize(receipt, as_bytes(records))
    staged = as_bytes(records)
    original = json.loads(staged[index])
    rng = random.Random(index)
    outcomes: dict[str, int] = {}
    for position in range(len(staged[index])):  # every position (each is < 1.5 kB)
        mutated = bytearray(staged[index])
        mutated[position] ^= 1 << rng.randrange(8)
        snapshots = [*staged[:index], bytes(mutated), *staged[index + 1 :]]
        expected = expected_outcome(bytes(mutated), original)
        if expected is None:
            assert verify_and_linearize(receipt, snapshots) == clean
            outcomes["harmless"] = outcomes.get("harmless", 0) + 1
            continue
        code, call_id = code_of(receipt, snapshots)
        assert (code, call_id) == (expected, CALL_IDS[index]), (position, bytes(mutated))
        outcomes[code] = outcomes.get(code, 0) + 1
    assert sum(outcomes.values()) == len(staged[index]) > 400
    # Both parse-level and digest-level damage are exercised; harmless flips are rare.
    assert outcomes[VerificationCode.INVALID_SNAPSHOT] > 50
    assert outcomes[VerificationCode.CORRUPT_DIGEST] > 50
    assert outcomes.get("harmless", 0) <= 3


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("schema_version", 4, VerificationCode.UNSUPPORTED_SCHEMA),
        ("schema_version", 2, VerificationCode.UNSUPPORTED_SCHEMA),
        ("digest_version", 3, VerificationCode.UNSUPPORTED_DIGEST),
        ("extras_digest_version", 2, VerificationCode.UNSUPPORTED_EXTRAS_DIGEST),
        ("schema_version", "3", VerificationCode.INVALID_SNAPSHOT),
        ("token_ids_delta", [1.5], VerificationCode.INVALID_SNAPSHOT),
        (
            "generation_log_probs_delta",
            [0.0, 0.0, 0.0, 0.0, -0.5, -1.25, 0.5],
            VerificationCode.CORRUPT_DIGEST,
        ),
        ("cum_len", 8, VerificationCode.INVALID_SNAPSHOT),
        ("extras", {"routed_experts": "nrlre1:int8:1x1x1:AA=="}, VerificationCode.CORRUPT_DIGEST),
        ("newer_column", 1, VerificationCode.INVALID_SNAPSHOT),
    ],
)
def test_snapshot_content_codes(field: str, value: object, code: str) -> None:
    records = staged_calls()
    staged = as_bytes(records)
    body = json.loads(staged[0])
    body[field] = value
    staged[0] = json.dumps(body).encode()
    assert code_of(receipt_of(records), staged) == (code, "c1")


def test_a_model_changed_without_validation_is_caught() -> None:
    records = staged_calls()
    forged = records[1].model_copy(update={"token_ids_delta": [301, 302, 401, 403]})
    snapshots = [records[0], forged, records[2]]
    assert code_of(receipt_of(records), snapshots) == (VerificationCode.CORRUPT_DIGEST, "c2")


def test_a_snapshot_of_the_wrong_type_is_invalid() -> None:
    records = staged_calls()
    snapshots: list[Any] = [records[0].model_dump(), *records[1:]]
    assert code_of(receipt_of(records), snapshots) == (VerificationCode.INVALID_SNAPSHOT, "c1")


# --- The snapshot set ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dropped", "expected"),
    [
        ("c3", (VerificationCode.MISSING_TERMINAL, "c3")),
        ("c2", (VerificationCode.MISSING_PARENT, "c2")),
        ("c1", (VerificationCode.MISSING_PARENT, "c1")),
    ],
)
def test_a_dropped_snapshot_is_missing(dropped: str, expected: tuple[str, str]) -> None:
    records = staged_calls()
    receipt = receipt_of(records)
    keyed = by_key(records)
    del keyed[f"r1/{dropped}"]
    assert code_of(receipt, keyed) == expected
    in_order = [
        s for r, s in zip(records, as_bytes(records), strict=True) if r.model_call_id != dropped
    ]
    assert code_of(receipt, in_order) == (VerificationCode.ROW_COUNT_MISMATCH, None)


def test_an_extra_snapshot_does_not_match_the_row_count() -> None:
    records = staged_calls()
    receipt = receipt_of(records)
    extra = {**by_key(records), "r1/c4": as_bytes(records)[0]}
    assert code_of(receipt, extra) == (VerificationCode.ROW_COUNT_MISMATCH, None)
    assert code_of(receipt, [*as_bytes(records), as_bytes(records)[0]]) == (
        VerificationCode.ROW_COUNT_MISMATCH,
        None,
    )


@pytest.mark.parametrize(("first", "second"), [(0, 1), (1, 2), (0, 2)])
def test_swapped_snapshots_are_refused(first: int, second: int) -> None:
    records = staged_calls()
    receipt = receipt_of(records)
    staged = as_bytes(records)
    staged[first], staged[second] = staged[second], staged[first]
    assert code_of(receipt, staged) == (VerificationCode.SNAPSHOT_ORDER_MISMATCH, CALL_IDS[first])
    keyed = by_key(records)
    a, b = f"r1/{CALL_IDS[first]}", f"r1/{CALL_IDS[second]}"
    keyed[a], keyed[b] = keyed[b], keyed[a]
    assert code_of(receipt, keyed) == (VerificationCode.SNAPSHOT_IDENTITY_MISMATCH, CALL_IDS[first])


def test_a_repeated_or_foreign_snapshot_is_refused() -> None:
    records = staged_calls()
    receipt = receipt_of(records)
    staged = as_bytes(records)
    assert code_of(receipt, [staged[0], staged[0], staged[2]]) == (
        VerificationCode.DUPLICATE_SNAPSHOT,
        "c1",
    )
    stranger = build_staged_call_record(
        rollout_id="r1",
        model_call_id="c9",
        prompt_token_ids=[1],
        generated_token_ids=[2],
        generated_logprobs=[-1.0],
        weight_version=3,
    )
    assert code_of(receipt, [staged[0], stranger, staged[2]]) == (
        VerificationCode.SNAPSHOT_IDENTITY_MISMATCH,
        "c2",
    )


def test_a_snapshot_from_another_rollout_is_refused() -> None:
    records = staged_calls()
    elsewhere = staged_calls(rollout_id="r2")
    snapshots = [records[0], elsewhere[1], records[2]]
    assert code_of(receipt_of(records), snapshots) == (VerificationCode.WRONG_ROLLOUT, "c2")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("weight_version", 9),
        ("digest", "0" * 64),
        ("extras_digest", "0" * 64),
        ("chain_hash", "1" * 64),
        ("cumulative_hash", "2" * 64),
    ],
)
def test_a_manifest_row_that_differs_from_its_snapshot(field: str, value: object) -> None:
    records = staged_calls()
    rows = manifest_of(records)["records"]
    rows[1][field] = value
    assert code_of(receipt_with(rows, "c3"), as_bytes(records)) == (f"wrong_{field}", "c2")


def test_a_manifest_row_with_other_lengths_differs_from_its_snapshot() -> None:
    records = staged_calls()
    rows = manifest_of(records)["records"]
    rows[2].update(delta_len=5, cum_len=16)
    receipt = receipt_with(rows, "c2")  # c3 is a dead branch here, so the graph is fine
    assert code_of(receipt, as_bytes(records)) == ("wrong_delta_len", "c3")


# --- Forgeries that are consistent within one record -----------------------------------------


def test_a_re_digested_parent_breaks_the_child_chain() -> None:
    records = staged_calls()
    c1 = records[0]
    forged_c2 = build_staged_call_record(
        rollout_id="r1",
        model_call_id="c2",
        parent_call_id="c1",
        parent_chain_hash=c1.chain_hash,
        prev_len=c1.cum_len,
        prompt_token_ids=[*PROMPT, 201, 202, 203, 301, 302],
        generated_token_ids=[401, 499],  # one generated token replaced
        generated_logprobs=[-2.0, -0.0],
        weight_version=3,
        extras=dict(ROUTED),
    )
    forged = [c1, forged_c2, records[2]]
    # The ledger agrees with the forged record, so only the chain can tell.
    assert code_of(receipt_of(forged), as_bytes(forged)) == (
        VerificationCode.CHAIN_HASH_MISMATCH,
        "c3",
    )


def test_a_re_digested_root_breaks_the_first_continuation() -> None:
    records = staged_calls()
    forged_c1 = build_staged_call_record(
        rollout_id="r1",
        model_call_id="c1",
        prompt_token_ids=PROMPT,
        generated_token_ids=[201, 202, 204],
        generated_logprobs=[-0.5, -1.25, -0.1],
        weight_version=3,
    )
    forged = [forged_c1, *records[1:]]
    assert code_of(receipt_of(forged), as_bytes(forged)) == (
        VerificationCode.CHAIN_HASH_MISMATCH,
        "c2",
    )


@pytest.mark.parametrize("index", [1, 2])
def test_a_continuation_staged_over_another_prompt_fails_its_cumulative_hash(index: int) -> None:
    records = staged_calls()
    carry, generated, logprobs, weight_version = GENERATIONS[index]
    parent = records[index - 1]
    # Chained properly onto the parent, but the engine saw a different prefix.
    forged = build_staged_call_record(
        rollout_id="r1",
        model_call_id=CALL_IDS[index],
        parent_call_id=parent.model_call_id,
        parent_chain_hash=parent.chain_hash,
        prev_len=parent.cum_len,
        prompt_token_ids=[7] * parent.cum_len + carry,
        generated_token_ids=generated,
        generated_logprobs=logprobs,
        weight_version=weight_version,
        extras=dict(ROUTED) if index == 1 else None,
    )
    records[index] = forged
    assert code_of(receipt_of(records), as_bytes(records)) == (
        VerificationCode.CUMULATIVE_HASH_MISMATCH,
        CALL_IDS[index],
    )


def test_a_mask_with_carry_after_generation_is_refused() -> None:
    fields: dict[str, Any] = {
        "rollout_id": "r1",
        "model_call_id": "c1",
        "parent_call_id": None,
        "mode": "text",
        "prev_len": 0,
        "delta_len": 3,
        "cum_len": 3,
        "weight_version": 1,
        "token_ids_delta": [1, 2, 3],
        "token_mask_delta": [0.0, 1.0, 0.0],
        "generation_log_probs_delta": [0.0, -1.0, 0.0],
        "extras_digest": compute_extras_digest(None),
    }
    good = build_staged_call_record(
        rollout_id="r1",
        model_call_id="c1",
        prompt_token_ids=[1],
        generated_token_ids=[2, 3],
        generated_logprobs=[-1.0, -1.0],
        weight_version=1,
    )
    fields.update(chain_hash=good.chain_hash, cumulative_hash=good.cumulative_hash)
    record = StagedCallSnapshot.model_validate(
        {**fields, "digest": compute_staged_call_digest(**fields)}
    )
    receipt = receipt_of([record], terminal="c1")
    assert code_of(receipt, [record]) == (VerificationCode.INVALID_MASK_ORDER, "c1")


def test_a_call_without_generated_tokens_is_refused() -> None:
    records = staged_calls()[:2]
    prompt_only = build_staged_call_record(
        rollout_id="r1",
        model_call_id="c3",
        parent_call_id="c2",
        parent_chain_hash=records[1].chain_hash,
        prev_len=records[1].cum_len,
        prompt_token_ids=[*PROMPT, 201, 202, 203, 301, 302, 401, 402, 501],
        generated_token_ids=[],
        generated_logprobs=[],
        weight_version=4,
    )
    records.append(prompt_only)
    assert code_of(receipt_of(records), as_bytes(records)) == (
        VerificationCode.EMPTY_GENERATION,
        "c3",
    )


# --- The receipt and its call graph ----------------------------------------------------------


def test_a_poisoned_receipt_is_refused() -> None:
    records = staged_calls()
    manifest = manifest_of(
        records, failures=[{"model_call_id": "c4", "reason": "worker_capture_failed"}]
    )
    receipt = build_receipt(manifest).receipt
    assert receipt is not None
    assert code_of(receipt, as_bytes(records)) == (VerificationCode.CAPTURE_POISONED, None)


def test_an_empty_manifest_is_refused() -> None:
    receipt = RolloutReceipt.model_construct(
        rollout_id="r1", manifest=[], terminal_model_call_id=None, capture_poisoned=False
    )
    assert code_of(receipt, []) == (VerificationCode.EMPTY_MANIFEST, None)


@pytest.mark.parametrize(("field", "code"), list(VERSION_CODES.items()))
def test_a_receipt_of_another_version_is_refused(field: str, code: str) -> None:
    records = staged_calls()
    receipt = receipt_of(records)
    assert code_of(receipt.model_copy(update={field: 9}), as_bytes(records)) == (code, None)
    rows = list(receipt.manifest)
    rows[1] = rows[1].model_copy(update={field: 9})
    assert code_of(receipt.model_copy(update={"manifest": rows}), as_bytes(records)) == (code, "c2")


def test_repeated_rows_or_staging_keys_are_refused() -> None:
    records = staged_calls()
    receipt = receipt_of(records)
    rows = [*receipt.manifest, receipt.manifest[0]]
    repeated = receipt.model_copy(update={"manifest": rows})
    assert code_of(repeated, as_bytes(records)) == (VerificationCode.DUPLICATE_MANIFEST_ROW, "c1")
    shared = manifest_of(records)["records"]
    shared[2]["staging_key"] = shared[1]["staging_key"]
    assert code_of(receipt_with(shared, "c3"), as_bytes(records)) == (
        VerificationCode.DUPLICATE_STAGING_KEY,
        "c3",
    )


def test_a_parent_missing_from_the_manifest() -> None:
    records = staged_calls()
    rows = manifest_of(records)["records"][1:]
    # The declared witness decides without walking the tree, so the receipt is unpoisoned.
    outcome = build_receipt({"rollout_id": "r1", "records": rows}, declared_terminal_call_id="c3")
    assert outcome.receipt is not None and not outcome.masked
    assert code_of(outcome.receipt, as_bytes(records[1:])) == (
        VerificationCode.MISSING_PARENT,
        "c2",
    )


def test_a_child_that_does_not_start_where_its_parent_ends() -> None:
    rows = manifest_of(staged_calls())["records"]
    rows[2].update(prev_len=12, cum_len=16)
    assert code_of(receipt_with(rows, "c3"), as_bytes(staged_calls())) == (
        VerificationCode.PARENT_LENGTH_MISMATCH,
        "c3",
    )


def test_a_lineage_cycle() -> None:
    rows = manifest_of(staged_calls())["records"]
    rows[0].update(parent_call_id="c3", mode="token_in", prev_len=15, cum_len=22)
    assert code_of(receipt_with(rows, "c3"), as_bytes(staged_calls())) == (
        VerificationCode.LINEAGE_CYCLE,
        "c1",
    )


def test_a_receipt_without_its_terminal_row() -> None:
    receipt = receipt_of(staged_calls())
    broken = receipt.model_copy(update={"terminal_model_call_id": "c7"})
    assert code_of(broken, as_bytes(staged_calls())) == (VerificationCode.MISSING_TERMINAL, None)


# --- The error and the module ----------------------------------------------------------------


def test_the_error_carries_its_context() -> None:
    records = staged_calls()
    staged = as_bytes(records)
    staged[1] = b"{"
    with pytest.raises(StagingError) as caught:
        verify_and_linearize(receipt_of(records), staged)
    error = caught.value
    assert isinstance(error, VerificationError)
    assert (error.code, error.rollout_id, error.model_call_id) == ("invalid_snapshot", "r1", "c2")
    assert str(error).startswith("invalid_snapshot (call 'c2'): ")


def test_the_result_is_a_frozen_value() -> None:
    row = verify_and_linearize(receipt_of(staged_calls()), as_bytes(staged_calls()))
    assert isinstance(row, LinearizedRollout)
    with pytest.raises(AttributeError):
        row.prompt_len = 0  # type: ignore[misc]


def test_docstring_examples_run() -> None:
    result = doctest.testmod(rebuild, optionflags=doctest.ELLIPSIS)
    assert (result.failed, result.attempted > 0) == (0, True)
