"""Builders and projection (reference §11.6 and the builder part of §12.4)."""

from __future__ import annotations

import collections
import random

import pytest

from capture_core.exceptions import TokenBuildError
from capture_core.tokens import (
    BuildOutput,
    Chain,
    ChainLink,
    TokenEntry,
    check_prefix_contiguity,
    per_request,
    prefix_merging,
    project_chain_to_output_items,
    project_main_chain_response,
    run_builder,
)
from tests.capture_core.tokens.entries import entry, three_turns


def _shape(out: BuildOutput) -> list[tuple[str, list[str]]]:
    return [(c.chain_id, [link.entry.model_call_id for link in c.links]) for c in out.chains]


def _cumulative_prompts(chain: Chain) -> list[list[int]]:
    return [item["prompt_token_ids"] for item in project_chain_to_output_items(chain)]


# --- prefix_merging -------------------------------------------------------------------------


def test_an_append_only_rollout_is_one_main_chain() -> None:
    out = prefix_merging(three_turns())
    assert _shape(out) == [("main", ["c1", "c2", "c3"])]
    chain = out.chains[0]
    assert chain.root_prompt == [1, 2, 3]
    assert [link.interstitial for link in chain.links] == [[], [4, 5], [6]]
    assert _cumulative_prompts(chain) == [
        [1, 2, 3], [1, 2, 3, 10, 11, 4, 5], [1, 2, 3, 10, 11, 4, 5, 12, 6],
    ]  # fmt: skip
    assert [link.entry.generation_token_ids for link in chain.links] == [[10, 11], [12], [13, 14]]
    assert [len(link.entry.generation_log_probs) for link in chain.links] == [2, 1, 2]
    notes = out.notes
    assert (notes.roots, notes.chains, notes.delivered_fraction) == (1, 1, 1.0)
    assert (notes.generated_tokens_captured, notes.generated_tokens_delivered) == (5, 5)
    assert out.quarantined == []


def test_a_long_rollout_builds_without_recursion() -> None:
    entries, prompt = [], [1]
    for turn in range(1_100):
        generated = [1000 + turn]
        entries.append(entry(f"t{turn:05d}", list(prompt), generated, created_at=float(turn)))
        prompt += generated if turn % 10 else [*generated, 2]  # now and then a tool token
    out = prefix_merging(entries)
    assert len(out.chains) == 1
    assert len(out.chains[0].links) == 1_100
    assert out.notes.delivered_fraction == 1.0


def test_the_result_does_not_depend_on_input_order() -> None:
    entries = [*three_turns(), entry("x1", [1, 2, 3, 10, 11, 4, 5], [99]),
               entry("z", [7, 7], [8], created_at=9.0)]  # fmt: skip
    expected = prefix_merging(entries)
    rng = random.Random(7)
    for _ in range(20):
        shuffled = entries[:]
        rng.shuffle(shuffled)
        assert prefix_merging(shuffled) == expected


def test_a_retry_the_rollout_continued_from_wins() -> None:
    entries = [
        entry("c1", [1, 2], [3]),
        entry("c2a", [1, 2, 3, 4], [5]),  # retried: nothing continued from it
        entry("c2b", [1, 2, 3, 4], [6]),
        entry("c3", [1, 2, 3, 4, 6, 7], [8]),
    ]
    out = prefix_merging(entries)
    assert _shape(out) == [("main", ["c1", "c2b", "c3"])]
    assert out.quarantined == ["c2a"]
    assert out.notes.unresolved_retries == []


def test_retries_nobody_continued_from_are_unresolved() -> None:
    entries = [entry("c1", [1, 2], [3]), entry("c2b", [1, 2, 3, 4], [6]),
               entry("c2a", [1, 2, 3, 4], [5])]  # fmt: skip
    out = prefix_merging(entries)
    assert _shape(out) == [("main", ["c1", "c2a"])]  # the smallest id is kept
    assert out.quarantined == ["c2b"]
    assert out.notes.unresolved_retries == ["c2a", "c2b"]


def test_ambiguous_identical_parents_quarantine_the_child() -> None:
    entries = [
        entry("c1", [1, 2], [3]),
        entry("c2a", [1, 2, 3, 4], [5]),
        entry("c2b", [1, 2, 3, 4], [5]),  # the same prompt and generation
        entry("c3", [1, 2, 3, 4, 5, 6], [7]),
    ]
    out = prefix_merging(entries)
    assert "c3" in out.quarantined
    assert out.notes.unresolved_retries == ["c2a", "c2b"]
    assert out.chains == []  # no path is free of quarantined calls
    with pytest.raises(TokenBuildError, match="no safe trainable chain"):
        project_main_chain_response("r1", out, "m")


def test_the_earliest_root_is_main() -> None:
    entries = [
        entry("late", [50], [1, 2, 3], created_at=2.0),
        entry("early", [60], [1, 2, 3, 4], created_at=1.0),
        entry("early-2", [60, 1, 2, 3, 4, 9], [5, 6, 7], created_at=1.5),
    ]
    out = prefix_merging(entries)
    assert _shape(out) == [("main", ["early", "early-2"]), ("branch-0", ["late"])]
    notes = out.notes
    assert (notes.generated_tokens_captured, notes.generated_tokens_delivered) == (10, 7)
    assert notes.delivered_fraction == 0.7
    assert (notes.roots, notes.chains) == (2, 2)


def test_an_orchestrator_is_delivered_over_its_sub_agent() -> None:
    entries = [
        entry("orch-1", [1, 1], [2], created_at=1.0),
        entry("sub-1", [9, 9], [8, 8, 8], created_at=1.1),  # a sub-agent's own conversation
        entry("orch-2", [1, 1, 2, 3], [4], created_at=2.0),
    ]
    assert prefix_merging(entries).chains[0].links[0].entry.model_call_id == "orch-1"


def test_an_auxiliary_call_that_finishes_first_is_main_a_known_limitation() -> None:
    entries = [
        entry("aux", [5], [6, 6], created_at=0.5),
        entry("agent-1", [1], [2, 2, 2, 2], created_at=1.0),
        entry("agent-2", [1, 2, 2, 2, 2, 3], [4, 4, 4, 4], created_at=2.0),
    ]
    out = prefix_merging(entries)
    assert _shape(out)[0] == ("main", ["aux"])
    assert out.notes.delivered_fraction < 0.5


def test_timestamp_ties_break_by_call_id() -> None:
    entries = [entry("bbb", [1], [2], created_at=1.0), entry("aaa", [3], [4], created_at=1.0)]
    assert _shape(prefix_merging(entries))[0] == ("main", ["aaa"])


def test_a_compaction_starts_a_new_root() -> None:
    entries = [
        entry("c1", [1, 2], [3], created_at=1.0),
        entry("c2", [1, 2, 3, 4], [5], created_at=2.0),
        entry("after", [100, 101], [6, 7], created_at=3.0),  # the summary replaced the history
    ]
    out = prefix_merging(entries)
    assert len(out.chains) == 2
    assert out.notes.delivered_fraction < 1


def test_an_empty_generation_is_never_a_parent() -> None:
    entries = [entry("e1", [1, 2], []), entry("e2", [1, 2], [3])]
    out = prefix_merging(entries)
    assert _shape(out) == [("main", ["e2"])]
    assert out.notes.empty_generation_calls == ["e1"]
    only_empty = prefix_merging([entry("e1", [1], []), entry("e0", [2], [])])
    assert only_empty.chains == []
    assert only_empty.notes.empty_generation_calls == ["e1", "e0"]  # input order


def test_a_broken_chain_is_split_and_the_main_projection_stays_contiguous() -> None:
    entries = [
        entry("c1", [1, 2], [3], created_at=1.0),
        entry("c2", [1, 2, 3, 4], [5], created_at=2.0),
        entry("c3", [1, 2, 9, 9], [6], created_at=3.0),  # does not extend c2 (or c1)
    ]
    out = prefix_merging(entries)
    assert (out.notes.roots, out.notes.chains) == (2, 2)
    response = project_main_chain_response("r1", out, "m")
    check_prefix_contiguity(response)
    assert _shape(out)[0] == ("main", ["c1", "c2"])


# --- per_request and run_builder --------------------------------------------------------------


def test_per_request_gives_one_chain_per_call_with_the_same_tokens() -> None:
    entries = three_turns()
    out = per_request(entries)
    assert [c.chain_id for c in out.chains] == ["req-0", "req-1", "req-2"]
    assert out.notes.chains == 3

    def generated(o: BuildOutput) -> collections.Counter[int]:
        return collections.Counter(
            t for c in o.chains for link in c.links for t in link.entry.generation_token_ids
        )

    assert generated(out) == generated(prefix_merging(entries))
    with pytest.raises(TokenBuildError, match="per_request built 3 chains"):
        project_main_chain_response("r1", out, "m")


def test_run_builder_by_name() -> None:
    assert run_builder(three_turns(), "per_request").notes.builder == "per_request"
    assert run_builder(three_turns()).notes.builder == "prefix_merging"
    with pytest.raises(TokenBuildError, match="unknown token builder 'best'"):
        run_builder([], "best")


def test_chain_validate_catches_a_logprob_count_mismatch() -> None:
    bad = entry("c1", [1], [2, 3])
    bad.generation_log_probs = [-0.1]  # mutation is not validated
    chain = Chain("main", [ChainLink(bad)], [1])
    with pytest.raises(TokenBuildError, match="2 generated tokens but 1 log-probs") as info:
        chain.validate()
    assert info.value.model_call_id == "c1"


# --- projection -----------------------------------------------------------------------------


def test_projection_is_prefix_contiguous_with_usage() -> None:
    response = project_main_chain_response("r1", prefix_merging(three_turns()), "policy")
    assert (response["id"], response["model"], response["object"]) == ("proj-r1", "policy",
                                                                        "response")  # fmt: skip
    assert [len(i["prompt_token_ids"]) for i in response["output"]] == [3, 7, 9]
    assert response["usage"] == {"input_tokens": 3, "output_tokens": 5}
    check_prefix_contiguity(response)


def test_projection_uses_the_recorded_carrier_and_leaves_other_items_alone() -> None:
    items = [{"type": "reasoning", "summary": [{"text": "think"}]},
             {"type": "message", "content": [{"type": "output_text", "text": "hi"}]}]  # fmt: skip
    chosen = entry("c1", [1], [2], output_items=items, token_item_index=0, routed_experts=[[1]])
    projected = project_chain_to_output_items(prefix_merging([chosen]).chains[0])
    assert projected[0]["generation_token_ids"] == [2]
    assert projected[0]["routed_experts"] == [[1]]
    assert projected[0]["summary"] == [{"text": "think"}]
    assert projected[1] == items[1]  # content kept, no token fields
    assert "media_spans" not in projected[0]  # absent when the call had none


def test_legacy_inline_carriers_are_found_by_scanning() -> None:
    items = [{"type": "message", "content": "a"},
             {"type": "message", "content": "b", "generation_token_ids": [2]}]  # fmt: skip
    legacy = TokenEntry(rollout_id="r1", model_call_id="c1", prompt_token_ids=[1],
                        generation_token_ids=[2], generation_log_probs=[-0.1],
                        output_items=items)  # fmt: skip
    projected = project_chain_to_output_items(prefix_merging([legacy]).chains[0])
    assert "generation_token_ids" not in projected[0]
    assert projected[1]["prompt_token_ids"] == [1]
    no_carrier = legacy.model_copy(update={"output_items": [{"type": "message", "content": "a"}]})
    assert project_chain_to_output_items(prefix_merging([no_carrier]).chains[0])[0][
        "generation_token_ids"
    ] == [2]  # the last item carries


def test_a_call_without_content_items_gets_a_bare_carrier() -> None:
    bare = entry("c1", [1], [2], output_items=[], token_item_index=None)
    projected = project_chain_to_output_items(prefix_merging([bare]).chains[0])
    assert projected == [{"type": "message", "prompt_token_ids": [1], "generation_token_ids": [2],
                          "generation_log_probs": [-0.5]}]  # fmt: skip


def test_projection_carries_content_and_usage_comes_from_token_bearing_items() -> None:
    first = entry("c1", [1, 2], [3], text="first answer",
                  output_items=[{"type": "reasoning", "summary": []},
                                {"type": "message", "content": "first answer"}],
                  token_item_index=1)  # fmt: skip
    second = entry("c2", [1, 2, 3, 4], [5, 6], text="second answer")
    response = project_main_chain_response("r1", prefix_merging([first, second]), "m")
    output = response["output"]
    assert "generation_token_ids" not in output[0]  # the leading content-only item
    assert output[1]["content"] == "first answer"
    assert output[2]["content"][0]["text"] == "second answer"
    assert response["usage"] == {"input_tokens": 2, "output_tokens": 3}
    check_prefix_contiguity(response)


def test_the_contiguity_check_catches_a_gap() -> None:
    response = {"output": [
        {"prompt_token_ids": [1, 2], "generation_token_ids": [3]},
        {"type": "message", "content": "no tokens"},
        {"prompt_token_ids": [1, 2, 9, 4], "generation_token_ids": [5]},
    ]}  # fmt: skip
    with pytest.raises(TokenBuildError, match="output item 2 does not extend"):
        check_prefix_contiguity(response)


def test_no_trainable_tokens_is_refused() -> None:
    empty = prefix_merging([entry("c1", [1], [])])
    with pytest.raises(TokenBuildError, match="no safe trainable chain"):
        project_main_chain_response("r1", empty, "m")


def test_a_chain_without_generated_tokens_is_not_trainable() -> None:
    out = per_request([entry("c1", [1], [])])
    with pytest.raises(TokenBuildError, match="no trainable generated tokens"):
        project_main_chain_response("r1", out, "m")
