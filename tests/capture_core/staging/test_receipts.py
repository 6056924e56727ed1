"""build_receipt: row-by-row validation, poisoning, duplicates and terminal selection."""

from __future__ import annotations

import doctest
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capture_core.staging import (
    NON_POISONING_FAILURE_REASONS,
    CallRecord,
    LedgerFailureReason,
    ReceiptOutcome,
    RolloutManifest,
    StagedCallRecord,
    TerminalSelection,
    build_staged_call_record,
)
from capture_core.staging import receipts as receipts_module
from capture_core.staging.receipts import build_receipt
from tests.capture_core.staging.examples import call_record_json


class Tree:
    """Staged calls of one rollout, each continuing its parent's tokens."""

    def __init__(self, rollout_id: str = "r1") -> None:
        self.rollout_id = rollout_id
        self.records: dict[str, StagedCallRecord] = {}
        self.tokens: dict[str, list[int]] = {}

    def add(
        self, call_id: str, parent: str | None = None, *, generated: tuple[int, ...] = (9,)
    ) -> Tree:
        prefix = self.tokens[parent] if parent else []
        prompt = [*prefix, 5]
        self.records[call_id] = build_staged_call_record(
            rollout_id=self.rollout_id,
            model_call_id=call_id,
            prompt_token_ids=prompt,
            generated_token_ids=list(generated),
            generated_logprobs=[-0.5] * len(generated),
            weight_version=1,
            parent_call_id=parent,
            parent_chain_hash=self.records[parent].chain_hash if parent else None,
            prev_len=len(prefix),
        )
        self.tokens[call_id] = [*prompt, *generated]
        return self

    def row(self, call_id: str, **changes: Any) -> dict[str, Any]:
        body = call_record_json(self.records[call_id], response_id=f"resp-{call_id}")
        return {**body, "admitted_at": None, **changes}

    def manifest(self, *rows: dict[str, Any], failures: tuple[str, ...] = ()) -> dict[str, Any]:
        return {
            "schema_version": 3,
            "rollout_id": self.rollout_id,
            "records": list(rows) if rows else [self.row(c) for c in self.records],
            "failures": [{"model_call_id": f"f{i}", "reason": r} for i, r in enumerate(failures)],
        }


def chain() -> Tree:
    """c1 -> c2 -> c3."""
    return Tree().add("c1").add("c2", "c1").add("c3", "c2")


def selected(outcome: ReceiptOutcome) -> tuple[str | None, str | None, str | None]:
    assert not outcome.masked and outcome.reason is None, outcome
    receipt = outcome.receipt
    assert receipt is not None and not receipt.capture_poisoned
    return (
        receipt.terminal_model_call_id,
        receipt.terminal_selection,
        receipt.terminal_attribution_reason,
    )


def masked(outcome: ReceiptOutcome) -> str:
    assert outcome.masked and outcome.reason is not None, outcome
    if outcome.receipt is not None:
        assert outcome.receipt.capture_poisoned
        assert outcome.receipt.failure_reason == outcome.reason
    return outcome.reason


# --- Reading the manifest --------------------------------------------------------------------


def test_a_clean_manifest_gives_an_unpoisoned_receipt() -> None:
    tree = chain()
    manifest = tree.manifest()
    outcome = build_receipt(manifest)
    assert selected(outcome) == ("c3", TerminalSelection.HEURISTIC, None)
    receipt = outcome.receipt
    assert receipt is not None
    assert receipt.rollout_id == "r1"
    assert receipt.reward is None and receipt.failure_reason is None
    assert receipt.manifest == [CallRecord.model_validate(row) for row in manifest["records"]]
    assert outcome.problems == ()


def test_every_input_form_reads_the_same() -> None:
    manifest = chain().manifest()
    expected = build_receipt(manifest)
    assert build_receipt(json.dumps(manifest).encode()) == expected
    assert build_receipt(RolloutManifest.model_validate(manifest)) == expected
    # Keys that take their defaults may be left out.
    del manifest["schema_version"], manifest["failures"]
    assert build_receipt(manifest) == expected


def test_a_row_with_a_newer_column_masks_the_rollout() -> None:
    tree = chain()
    rows = [tree.row("c1"), tree.row("c2", finish_reason="stop"), tree.row("c3")]
    outcome = build_receipt(tree.manifest(*rows), declared_terminal_call_id="c3")
    assert masked(outcome) == "invalid_manifest_row"
    receipt = outcome.receipt
    assert receipt is not None
    # No terminal is chosen from untrusted rows; the selection keeps its default.
    assert receipt.terminal_model_call_id is None
    assert receipt.terminal_selection is TerminalSelection.HEURISTIC
    assert [row.model_call_id for row in receipt.manifest] == ["c1", "c3"]
    assert outcome.problems == ("records[1]: finish_reason: Extra inputs are not permitted",)


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"cum_len": 99}, "records[0]: cum_len"),
        ({"prev_len": 1.0}, "records[0]: prev_len"),
        ({"digest": "A" * 64}, "records[0]: digest"),
        ({"response_id": None}, "records[0]: response_id"),
        ({"schema_version": 4}, "records[0]: schema_version"),
    ],
)
def test_an_invalid_row_masks_the_rollout(change: dict[str, Any], where: str) -> None:
    tree = chain()
    outcome = build_receipt(tree.manifest(tree.row("c1", **change), tree.row("c2")))
    assert masked(outcome) == "invalid_manifest_row"
    assert len(outcome.problems) == 1
    assert outcome.problems[0].startswith(where)


def test_a_row_that_is_not_an_object_masks_the_rollout() -> None:
    tree = chain()
    manifest = tree.manifest()
    manifest["records"].insert(1, "c2")
    del manifest["records"][0]["digest"]
    outcome = build_receipt(manifest)
    assert masked(outcome) == "invalid_manifest_row"
    assert [p.split(":")[0] for p in outcome.problems] == ["records[0]", "records[1]"]


@pytest.mark.parametrize(
    "manifest",
    [
        b"{not json",
        b"\xff\xfe\x00",
        b"[" * 100_000,
        b"[]",
        b'"r1"',
        {"records": []},
        {"rollout_id": "", "records": []},
        {"rollout_id": 7},
        {1: "r1"},
    ],
)
def test_a_manifest_without_a_rollout_id_gives_no_receipt(manifest: Any) -> None:
    outcome = build_receipt(manifest)
    assert (outcome.receipt, outcome.masked, outcome.reason) == (None, True, "invalid_manifest_row")
    assert outcome.problems


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"records": {"c1": {}}}, "records: must be a list, got dict"),
        ({"failures": "none"}, "failures: must be a list, got str"),
        ({"schema_version": 2}, "manifest: schema_version"),
        ({"cursor": 5}, "manifest: cursor: Extra inputs are not permitted"),
    ],
)
def test_a_damaged_envelope_masks_the_rollout(change: dict[str, Any], problem: str) -> None:
    outcome = build_receipt({**chain().manifest(), **change})
    assert masked(outcome) == "invalid_manifest_row"
    assert outcome.receipt is not None and outcome.receipt.rollout_id == "r1"
    assert any(p.startswith(problem) for p in outcome.problems), outcome.problems


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=10)
    | st.sampled_from(["r1", "c1", "c2", "text", "token_in", "a" * 64, "stop"])
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=25,
)
KEYS = st.sampled_from(
    [*CallRecord.model_fields, "rollout_id", "records", "failures", "reason", "x"]
)


@st.composite
def damaged_manifests(draw: st.DrawFn) -> Any:
    """A real manifest with some keys removed or given arbitrary JSON values."""
    tree = chain().add("c4", "c2", generated=(8, 7))
    manifest: dict[str, Any] = tree.manifest(
        failures=draw(st.lists(st.text(max_size=12), max_size=2))
    )
    targets: list[dict[str, Any]] = [manifest, *manifest["records"], *manifest["failures"]]
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        target = draw(st.sampled_from(targets))
        key = draw(KEYS)
        if draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = draw(JSON_VALUES)
    return manifest


@settings(max_examples=300, deadline=None)
@given(
    manifest=damaged_manifests() | JSON_VALUES | st.binary(max_size=64),
    declared=st.none() | st.sampled_from(["c1", "c3", "c4", "zz", ""]) | JSON_SCALARS,
    response_id=st.none() | st.sampled_from(["resp-c3", "resp-c4", ""]) | JSON_SCALARS,
    as_bytes=st.booleans(),
)
def test_build_receipt_never_raises(
    manifest: Any, declared: Any, response_id: Any, as_bytes: bool
) -> None:
    if as_bytes and not isinstance(manifest, bytes):
        manifest = json.dumps(manifest).encode()
    outcome = build_receipt(
        manifest, declared_terminal_call_id=declared, terminal_response_id=response_id
    )
    assert isinstance(outcome, ReceiptOutcome)
    assert outcome.masked == (outcome.reason is not None)
    if outcome.receipt is None:
        assert outcome.masked and outcome.problems
    else:
        receipt = outcome.receipt
        assert receipt.capture_poisoned == outcome.masked
        assert receipt.failure_reason == outcome.reason
        if not outcome.masked:
            ids = [row.model_call_id for row in receipt.manifest]
            assert receipt.terminal_model_call_id in ids


# --- Failure rows ----------------------------------------------------------------------------


@pytest.mark.parametrize("reason", [*LedgerFailureReason, "some_future_reason"])
def test_failure_rows_poison_except_one(reason: str) -> None:
    outcome = build_receipt(chain().manifest(failures=(reason,)))
    if reason in NON_POISONING_FAILURE_REASONS:
        assert selected(outcome) == ("c3", TerminalSelection.HEURISTIC, None)
    else:
        assert masked(outcome) == reason
        # The terminal is still recorded, for diagnosis.
        assert outcome.receipt is not None and outcome.receipt.terminal_model_call_id == "c3"


def test_the_first_poisoning_failure_is_the_reason() -> None:
    failures = (
        "request_finished_without_staged_coordinates",
        "worker_capture_failed",
        "unresolved_parent",
    )
    assert masked(build_receipt(chain().manifest(failures=failures))) == "worker_capture_failed"


def test_a_poisoning_failure_takes_precedence_over_an_invalid_row() -> None:
    tree = chain()
    rows = [tree.row("c1", shard=1), tree.row("c2")]
    outcome = build_receipt(tree.manifest(*rows, failures=("worker_capture_failed",)))
    assert masked(outcome) == "worker_capture_failed"
    assert outcome.problems[0].startswith("records[0]: shard")


def test_an_invalid_failure_row_masks_the_rollout() -> None:
    manifest = chain().manifest()
    manifest["failures"] = [
        {"model_call_id": "c4", "reason": "request_finished_without_staged_coordinates", "at": 1}
    ]
    outcome = build_receipt(manifest)
    assert masked(outcome) == "invalid_manifest_row"
    assert outcome.problems == ("failures[0]: at: Extra inputs are not permitted",)


def test_only_non_poisoning_failures_and_no_rows() -> None:
    manifest = chain().manifest(failures=("request_finished_without_staged_coordinates",))
    manifest["records"] = []
    assert masked(build_receipt(manifest)) == "no_records"


# --- Duplicate rows --------------------------------------------------------------------------


def test_identical_duplicate_rows_fold() -> None:
    tree = chain()
    rows = [tree.row("c1"), tree.row("c2"), tree.row("c1"), tree.row("c3"), tree.row("c2")]
    outcome = build_receipt(tree.manifest(*rows))
    assert selected(outcome) == ("c3", TerminalSelection.HEURISTIC, None)
    assert outcome.receipt is not None
    assert [row.model_call_id for row in outcome.receipt.manifest] == ["c1", "c2", "c3"]


@pytest.mark.parametrize(
    "change", [{"response_id": "resp-other"}, {"admitted_at": 5.0}, {"weight_version": 2}]
)
def test_conflicting_duplicate_rows_mask_the_rollout(change: dict[str, Any]) -> None:
    tree = chain()
    rows = [tree.row("c1"), tree.row("c2"), tree.row("c3"), tree.row("c2", **change)]
    outcome = build_receipt(tree.manifest(*rows), declared_terminal_call_id="c3")
    assert masked(outcome) == "duplicate_call_id"
    receipt = outcome.receipt
    assert receipt is not None
    assert (receipt.terminal_model_call_id, receipt.terminal_selection) == (None, None)
    assert [row.model_call_id for row in receipt.manifest] == ["c1", "c2", "c3"]
    assert receipt.manifest[1].response_id == "resp-c2"  # the first row is kept
    assert outcome.problems == ("records: differing rows share model_call_id 'c2'",)


# --- Terminal selection ----------------------------------------------------------------------


def forked() -> Tree:
    """c1 -> c2 -> c3, and c2 -> c3b (a different generation)."""
    return chain().add("c3b", "c2", generated=(4,))


def test_the_declared_terminal_wins() -> None:
    outcome = build_receipt(forked().manifest(), declared_terminal_call_id="c3b")
    assert selected(outcome) == ("c3b", TerminalSelection.DECLARED, None)


def test_a_response_id_that_agrees_corroborates_the_declared_terminal() -> None:
    outcome = build_receipt(
        forked().manifest(), declared_terminal_call_id="c3b", terminal_response_id="resp-c3b"
    )
    assert selected(outcome) == (
        "c3b",
        TerminalSelection.DECLARED,
        "corroborated_by=declared+response_id",
    )


@pytest.mark.parametrize("declared", ["c9", "", 3])
def test_a_declared_terminal_without_a_row_masks_and_never_falls_back(declared: Any) -> None:
    outcome = build_receipt(
        forked().manifest(), declared_terminal_call_id=declared, terminal_response_id="resp-c3"
    )
    assert masked(outcome) == "missing_declared_terminal_row"
    receipt = outcome.receipt
    assert receipt is not None
    assert (receipt.terminal_model_call_id, receipt.terminal_selection) == (None, None)
    assert receipt.terminal_attribution_reason == "declared_terminal_not_captured"


def test_disagreeing_witnesses_abstain_and_the_heuristic_decides() -> None:
    tree = chain()
    outcome = build_receipt(
        tree.manifest(), declared_terminal_call_id="c2", terminal_response_id="resp-c1"
    )
    assert selected(outcome) == (
        "c3",
        TerminalSelection.HEURISTIC,
        "witness_disagreement[declared=c2;response_id=c1]",
    )
    # When the heuristic cannot decide either, the rollout is masked with the whole trail.
    outcome = build_receipt(
        forked().manifest(), declared_terminal_call_id="c3", terminal_response_id="resp-c3b"
    )
    assert masked(outcome) == "ambiguous_terminal"
    assert outcome.receipt is not None
    assert outcome.receipt.terminal_attribution_reason == (
        "witness_disagreement[declared=c3;response_id=c3b]"
    )


def test_the_response_id_selects_when_nothing_is_declared() -> None:
    outcome = build_receipt(forked().manifest(), terminal_response_id="resp-c3b")
    assert selected(outcome) == ("c3b", TerminalSelection.RESPONSE_ID, None)


@pytest.mark.parametrize(
    ("response_id", "trail"),
    [("resp-none", "response_id_no_match"), ("", "response_has_no_id"), (17, "response_has_no_id")],
)
def test_a_response_id_that_cannot_decide_falls_to_the_heuristic(
    response_id: Any, trail: str
) -> None:
    outcome = build_receipt(chain().manifest(), terminal_response_id=response_id)
    assert selected(outcome) == ("c3", TerminalSelection.HEURISTIC, trail)


def test_a_response_id_on_two_different_rows_is_ambiguous() -> None:
    tree = forked()
    rows = [tree.row("c1"), tree.row("c2"), tree.row("c3"), tree.row("c3b", response_id="resp-c3")]
    outcome = build_receipt(tree.manifest(*rows), terminal_response_id="resp-c3")
    assert masked(outcome) == "ambiguous_terminal"
    assert outcome.receipt is not None
    assert outcome.receipt.terminal_attribution_reason == "response_id_ambiguous"


def test_a_response_id_on_interchangeable_rows_picks_the_smallest_id() -> None:
    tree = chain()
    retry = tree.row("c3", model_call_id="c3-retry", staging_key="r1/c3-retry")
    rows = [tree.row("c1"), tree.row("c2"), retry, tree.row("c3")]
    outcome = build_receipt(tree.manifest(*rows), terminal_response_id="resp-c3")
    assert selected(outcome) == ("c3", TerminalSelection.RESPONSE_ID, None)
    # The heuristic collapses them the same way.
    assert selected(build_receipt(tree.manifest(*rows)))[0] == "c3"


def test_the_heuristic_prefers_the_branch_that_continues() -> None:
    # c2 forks into c3b (a leaf) and c3 (continued by c4): c4 is the terminal.
    tree = forked().add("c4", "c3")
    assert selected(build_receipt(tree.manifest()))[0] == "c4"
    rows = [tree.row(c) for c in ("c1", "c2", "c3", "c4", "c3b")]
    assert selected(build_receipt(tree.manifest(*rows)))[0] == "c4"


def test_a_fork_of_two_leaves_is_ambiguous() -> None:
    outcome = build_receipt(forked().manifest())
    assert masked(outcome) == "ambiguous_terminal"
    assert outcome.receipt is not None
    assert outcome.receipt.terminal_selection is None


def test_the_heuristic_root_is_the_continued_one_then_the_earliest() -> None:
    tree = chain().add("s1").add("s2")  # two extra one-call roots
    # A root with children beats earlier childless roots.
    rows = [
        tree.row("s1", admitted_at=1.0),
        tree.row("c1", admitted_at=5.0),
        tree.row("c2"),
        tree.row("c3"),
    ]
    assert selected(build_receipt(tree.manifest(*rows)))[0] == "c3"
    # Among childless roots: the earliest admitted, unknown times last, then manifest order.
    only_roots = [tree.row("s1"), tree.row("s2", admitted_at=9.0), tree.row("c1", admitted_at=3.0)]
    assert selected(build_receipt(tree.manifest(*only_roots)))[0] == "c1"
    untimed = [tree.row("s2"), tree.row("s1"), tree.row("c1")]
    assert selected(build_receipt(tree.manifest(*untimed)))[0] == "s2"


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        (["c2", "c3"], "orphaned_row"),
        ([], "no_records"),
    ],
)
def test_a_tree_the_heuristic_cannot_walk(rows: list[str], reason: str) -> None:
    tree = chain()
    manifest = tree.manifest()
    manifest["records"] = [tree.row(c) for c in rows]
    outcome = build_receipt(manifest)
    assert masked(outcome) == reason
    assert outcome.receipt is not None and outcome.receipt.terminal_selection is None


def test_a_manifest_without_a_root() -> None:
    tree = chain()
    looped = tree.row("c1", parent_call_id="c3", mode="token_in", prev_len=6, cum_len=8)
    outcome = build_receipt(tree.manifest(looped, tree.row("c2"), tree.row("c3")))
    assert masked(outcome) == "no_root"


def test_docstring_examples_run() -> None:
    result = doctest.testmod(receipts_module, optionflags=doctest.ELLIPSIS)
    assert (result.failed, result.attempted > 0) == (0, True)
