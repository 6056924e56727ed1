"""Building a call's delta and staged row from a prompt and a generation."""

from __future__ import annotations

from typing import Any

import pytest

from capture_core.staging import (
    CaptureMode,
    InvalidStagedCallError,
    StagedCallRecord,
    StagingDelta,
    build_staged_call_record,
    build_staging_delta,
    compute_chain_hash,
    compute_cumulative_hash,
    default_staging_key,
)
from tests.capture_core.staging.examples import C1, C2, C2_EXTRAS, chain_records


def test_root_delta_is_the_whole_prompt_then_the_generation() -> None:
    delta = build_staging_delta([1, 2, 3], [4, 5], [-0.5, -0.25], prev_len=0)
    assert delta == StagingDelta(
        token_ids=[1, 2, 3, 4, 5],
        token_mask=[0.0, 0.0, 0.0, 1.0, 1.0],
        logprobs=[0.0, 0.0, 0.0, -0.5, -0.25],
    )


def test_continuation_delta_starts_after_the_parent() -> None:
    delta = build_staging_delta((1, 2, 3, 4, 5, 6, 7), (8,), (-1.0,), prev_len=5)
    assert delta.token_ids == [6, 7, 8]
    assert delta.token_mask == [0.0, 0.0, 1.0]
    assert delta.logprobs == [0.0, 0.0, -1.0]


def test_delta_may_be_generation_only_or_carry_only() -> None:
    assert build_staging_delta([1, 2], [3], [-0.1], prev_len=2).token_ids == [3]
    carry_only = build_staging_delta([1, 2, 3], [], [], prev_len=1)
    assert carry_only == StagingDelta([2, 3], [0.0, 0.0], [0.0, 0.0])


@pytest.mark.parametrize(
    ("prompt", "generated", "logprobs", "prev_len", "field", "reason"),
    [
        ([1, 2], [3], [-0.1], 3, "prev_len", r"\[0, len\(prompt\) = 2\]"),
        ([1, 2], [3], [-0.1], -1, "prev_len", "must be an int"),
        ([1, 2], [3], [-0.1], True, "prev_len", "must be an int"),
        ([1, 2], [3], [-0.1], 1.0, "prev_len", "must be an int"),
        ([1, 2], [3, 4], [-0.1], 0, "generated_logprobs", "one logprob per generated token"),
        ([1, 2], [], [], 2, "token_ids_delta", "adds no tokens"),
    ],
)
def test_delta_rules(
    prompt: list[int],
    generated: list[int],
    logprobs: list[float],
    prev_len: int,
    field: str,
    reason: str,
) -> None:
    with pytest.raises(InvalidStagedCallError, match=reason) as caught:
        build_staging_delta(prompt, generated, logprobs, prev_len=prev_len)
    assert caught.value.field == field


def test_builder_reproduces_the_chain_vectors() -> None:
    c1, c2 = chain_records()
    for record, expected in ((c1, C1), (c2, C2)):
        assert {key: getattr(record, key) for key in expected} == expected
    assert (c1.mode, c2.mode) == (CaptureMode.TEXT, CaptureMode.TOKEN_IN)
    assert (c1.delta_len, c1.cum_len, c2.delta_len, c2.cum_len) == (5, 5, 3, 8)
    assert c2.extras == C2_EXTRAS
    assert c1.extras is None


def test_chain_continuity_properties() -> None:
    c1, c2 = chain_records()
    whole = c1.token_ids_delta + c2.token_ids_delta
    assert c2.cumulative_hash == compute_cumulative_hash(whole)
    root_chain = compute_chain_hash(None, c1.token_ids_delta)
    assert c2.chain_hash == compute_chain_hash(root_chain, c2.token_ids_delta)


def test_builder_returns_a_validated_record() -> None:
    c1, _ = chain_records()
    assert isinstance(c1, StagedCallRecord)
    assert StagedCallRecord.model_validate_json(c1.model_dump_json()) == c1


def test_parent_and_chain_hash_go_together() -> None:
    c1, _ = chain_records()
    common: dict[str, Any] = {
        "rollout_id": "r1",
        "model_call_id": "c2",
        "prompt_token_ids": [1, 2, 3, 4, 5, 6],
        "generated_token_ids": [7],
        "generated_logprobs": [-1.0],
        "weight_version": 0,
        "prev_len": 5,
    }
    with pytest.raises(InvalidStagedCallError, match="exactly when parent_call_id"):
        build_staged_call_record(**common, parent_call_id="c1")
    with pytest.raises(InvalidStagedCallError, match="exactly when parent_call_id"):
        build_staged_call_record(**common, parent_chain_hash=c1.chain_hash)
    with pytest.raises(InvalidStagedCallError, match="must be 0 when there is no parent"):
        build_staged_call_record(**common)


@pytest.mark.parametrize(
    ("logprobs", "reason"),
    [([-1], "must be a float"), ([float("nan")], "finite"), ([1e39], "float32")],
)
def test_builder_refuses_unencodable_logprobs(logprobs: list[float], reason: str) -> None:
    with pytest.raises(InvalidStagedCallError, match=reason) as caught:
        build_staged_call_record(
            rollout_id="r1",
            model_call_id="c1",
            prompt_token_ids=[1],
            generated_token_ids=[2],
            generated_logprobs=logprobs,
            weight_version=0,
        )
    assert caught.value.field == "generation_log_probs_delta"


def test_builder_refuses_bad_extras_and_ids() -> None:
    common: dict[str, Any] = {
        "rollout_id": "r1",
        "model_call_id": "c1",
        "generated_token_ids": [2],
        "generated_logprobs": [-0.5],
        "weight_version": 0,
    }
    with pytest.raises(InvalidStagedCallError, match="not a JSON value"):
        build_staged_call_record(**common, prompt_token_ids=[1], extras={"a": (1,)})
    with pytest.raises(InvalidStagedCallError, match="outside"):
        build_staged_call_record(**common, prompt_token_ids=[-1])


def test_default_staging_key() -> None:
    assert default_staging_key("r1-a1", "c2") == "r1-a1/c2"
    for rollout_id, call_id in (("", "c"), ("r", ""), ("r", None)):
        with pytest.raises(InvalidStagedCallError, match="non-empty"):
            default_staging_key(rollout_id, call_id)  # type: ignore[arg-type]
