"""TokenEntry and reading token fields from a served response (reference §11.2, §12.3)."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from capture_core.tokens import (
    TOKEN_FIELDS,
    TokenEntry,
    build_token_entry,
    canonical_line,
    entry_digest,
    extract_token_fields,
    response_to_output_items,
    split_token_fields,
)
from tests.capture_core.tokens.entries import entry

TOKENS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4],
          "generation_log_probs": [-0.1, -0.2]}  # fmt: skip


def _responses(**carrier: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "model": "policy",
        "output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "hi"}], **carrier},
        ],
    }  # fmt: skip


def _chat(**carrier: Any) -> dict[str, Any]:
    return {"model": "policy", "choices": [{"index": 0, "message": {"content": "hi", **carrier}}]}


# --- extract_token_fields --------------------------------------------------------------------


def test_extract_from_a_responses_output_item() -> None:
    assert extract_token_fields(_responses(**TOKENS)) == {
        **TOKENS,
        "routed_experts": None,
        "media_spans": None,
    }


def test_extract_from_a_chat_message() -> None:
    fields = extract_token_fields(_chat(**TOKENS, routed_experts=[[1]]))
    assert fields is not None
    assert fields["generation_token_ids"] == [3, 4]
    assert fields["routed_experts"] == [[1]]


def test_extract_gives_none_without_token_fields() -> None:
    assert extract_token_fields(_responses()) is None
    assert extract_token_fields(_chat(prompt_token_ids=None)) is None
    assert extract_token_fields({}) is None


def test_partial_token_metadata_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="partial token metadata is missing: generation_log_probs"):
        extract_token_fields(_responses(prompt_token_ids=[1], generation_token_ids=[2]))


def test_two_carriers_are_refused() -> None:
    body = _responses(**TOKENS)
    body["output"][0].update(TOKENS)
    with pytest.raises(ValueError, match="multiple response items carry token metadata"):
        extract_token_fields(body)


# --- TokenEntry ------------------------------------------------------------------------------


def test_mismatched_generation_and_logprob_lengths_are_refused() -> None:
    with pytest.raises(ValidationError, match="same length"):
        TokenEntry(rollout_id="r", model_call_id="c", prompt_token_ids=[1],
                   generation_token_ids=[1, 2], generation_log_probs=[-0.1])  # fmt: skip


def test_records_carry_schema_version_1() -> None:
    assert orjson.loads(canonical_line(entry("c", [1], [2])))["schema_version"] == 1


def test_an_older_schema_is_read_and_a_newer_one_refused() -> None:
    old = {"schema_version": 0, "rollout_id": "r", "model_call_id": "c", "prompt_token_ids": [1],
           "generation_token_ids": [], "generation_log_probs": []}  # fmt: skip
    assert TokenEntry.model_validate(old).output_items == []
    with pytest.raises(ValidationError, match="newer than this reader understands"):
        TokenEntry.model_validate({**old, "schema_version": 2})


def test_unknown_fields_round_trip() -> None:
    first = TokenEntry.model_validate(
        {**entry("c", [1], [2]).model_dump(), "engine_note": {"kv": [1, 2]}}
    )
    line = canonical_line(first)
    again = TokenEntry.model_validate(orjson.loads(line))
    assert again.model_extra == {"engine_note": {"kv": [1, 2]}}
    assert canonical_line(again) == line


def test_token_item_index_must_point_into_output_items() -> None:
    with pytest.raises(ValidationError, match="outside output_items"):
        entry("c", [1], [2], token_item_index=1)
    with pytest.raises(ValidationError, match="outside output_items"):
        entry("c", [1], [2], token_item_index=-1)


@pytest.mark.parametrize("bad", [True, 1.0, "5", -1])
def test_token_ids_are_non_negative_integers(bad: object) -> None:
    """Stricter than upstream, which coerces ``True``, ``1.0`` and ``"5"``."""
    with pytest.raises(ValidationError):
        TokenEntry(rollout_id="r", model_call_id="c", prompt_token_ids=[1, bad],  # type: ignore[list-item]
                   generation_token_ids=[], generation_log_probs=[])  # fmt: skip


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_log_probs_are_finite(bad: float) -> None:
    """JSON cannot hold NaN or infinity (orjson would write null and the line would not read)."""
    with pytest.raises(ValidationError):
        TokenEntry(rollout_id="r", model_call_id="c", prompt_token_ids=[1],
                   generation_token_ids=[2], generation_log_probs=[bad])  # fmt: skip


def test_canonical_line_has_sorted_keys_and_its_digest_is_sha256() -> None:
    line = canonical_line(entry("c", [1], [2]))
    keys = list(orjson.loads(line))
    assert keys == sorted(keys)
    assert not line.endswith(b"\n")
    assert entry_digest(line) == __import__("hashlib").sha256(line).hexdigest()


def test_an_extra_field_json_cannot_hold_is_refused_when_written() -> None:
    odd = TokenEntry.model_validate({**entry("c", [1], [2]).model_dump(), "blob": object()})
    with pytest.raises(ValueError, match="cannot be written as JSON"):
        canonical_line(odd)


# --- content items and build_token_entry -------------------------------------------------------


def test_chat_messages_become_assistant_message_items() -> None:
    items = response_to_output_items(_chat(**TOKENS))
    assert items == [{"content": "hi", **TOKENS, "type": "message", "role": "assistant"}]


def test_split_token_fields_strips_every_item_and_finds_the_carrier() -> None:
    items = response_to_output_items(_responses(**TOKENS, routed_experts=[[1]], media_spans=[]))
    assert split_token_fields(items) == 1
    assert not any(name in item for item in items for name in TOKEN_FIELDS)
    two = [{"generation_token_ids": [1]}, {"generation_token_ids": [2]}]
    with pytest.raises(ValueError, match="multiple"):
        split_token_fields(two)


def test_build_token_entry_stores_token_arrays_once() -> None:
    body = _responses(**TOKENS, routed_experts=[[7]])
    built = build_token_entry(body, rollout_id="3-2", model_call_id="c1", created_at=5.0)
    assert built is not None
    assert built.model == "policy"
    assert built.prompt_token_ids == [1, 2]
    assert built.routed_experts == [[7]]
    assert built.token_item_index == 1 == len(built.output_items) - 1
    assert not any(name in item for item in built.output_items for name in TOKEN_FIELDS)
    assert built.output_items[1]["content"] == [{"type": "output_text", "text": "hi"}]
    assert "prompt_token_ids" in body["output"][1]  # the response itself is left alone


def test_build_token_entry_prefers_the_context_model_and_stamps_the_time() -> None:
    built = build_token_entry(_chat(**TOKENS), rollout_id="r", model_call_id="c", model="ctx")
    assert built is not None
    assert built.model == "ctx"
    assert built.created_at > 1e9


def test_build_token_entry_without_tokens_is_none_and_bad_ones_raise() -> None:
    assert build_token_entry(_responses(), rollout_id="r", model_call_id="c") is None
    bad = _responses(prompt_token_ids=[1], generation_token_ids=[2], generation_log_probs=[])
    with pytest.raises(ValidationError):
        build_token_entry(bad, rollout_id="r", model_call_id="c")
