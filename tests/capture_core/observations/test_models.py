"""Validation of the observation and trajectory models (upstream's rules, §9.1-9.2)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from capture_core.observations import (
    AgentInvocation,
    AgentObservationBundle,
    ContextCompaction,
    ModelCallRef,
    ObservationGap,
    SandboxObservation,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryTurn,
)

SERVER = {"type": "responses_api_models", "name": "policy_model"}


def invocation(invocation_id: str, parent: str | None = None) -> dict[str, Any]:
    return {"kind": "agent_invocation", "invocation_id": invocation_id,
            "parent_invocation_id": parent}  # fmt: skip


@pytest.mark.parametrize("ref", [{}, {"response_id": "r1"}, {"model_ref": SERVER},
                                 {"model_call_id": "", "response_id": "r1"}])  # fmt: skip
def test_a_reference_needs_a_join_key(ref: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="model_call_id or both model_ref and response_id"):
        ModelCallRef.model_validate(ref)


def test_complete_references() -> None:
    assert ModelCallRef(model_call_id="c1").label() == "c1"
    assert ModelCallRef.model_validate({"model_ref": SERVER, "response_id": "r1"}).label() == "r1"


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([invocation("a"), invocation("a")], "not unique"),
        ([invocation("a", parent="a")], "own ancestor"),
        ([invocation("a", parent="b"), invocation("b", parent="a")], "own ancestor"),
        ([invocation("a", "b"), invocation("b", "c"), invocation("c", "a")], "own ancestor"),
        ([{"kind": "turn", "invocation_id": "a"}], "turns go in ng_trajectory"),
        ([{"kind": "agent_invocation", "invocation_id": "a", "producer_extension": 1}],
         "Extra inputs are not permitted"),
        ([{"kind": "tool_call", "invocation_id": "a", "tool_call_id": "t", "output": "x"}],
         "Extra inputs are not permitted"),
        ([{"invocation_id": "a"}], "Unable to extract tag"),
        ([{**invocation("a"), "conversation": [{"content": "no role, no type"}]}],
         "neither a 'type' nor a 'role'"),
    ],
)  # fmt: skip
def test_a_bundle_refuses(records: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AgentObservationBundle.model_validate({"source": "s", "records": records})


def test_a_bundle_allows_a_missing_parent_and_refuses_unknown_top_keys() -> None:
    bundle = AgentObservationBundle.model_validate(
        {"source": "s", "records": [invocation("child", parent="not-observed")]}
    )
    assert [i.parent_invocation_id for i in bundle.invocations()] == ["not-observed"]
    with pytest.raises(ValidationError, match="Extra inputs"):
        AgentObservationBundle.model_validate({"source": "s", "producer_extension": {}})


def test_assignment_is_validated() -> None:
    gap = ObservationGap(code="x")
    with pytest.raises(ValidationError):
        gap.code = 7  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("model", "data"),
    [
        (ToolCallObservation, {"duration_ms": -1}),
        (ToolCallObservation, {"started_at": 10.0, "completed_at": 9.5}),
        (AgentInvocation, {"duration_ms": -0.1}),
        (ContextCompaction, {"tokens_before": -1}),
        (ContextCompaction, {"tokens_after": -3}),
        (SandboxObservation, {"wall_time_s": -1}),
        (SandboxObservation, {"cpu_time_s": -1}),
        (SandboxObservation, {"peak_memory_mib": -1}),
        (ToolCallObservation, {"status": "exploded"}),
        (ToolCallObservation, {"timing_source": "guessed"}),
    ],
)
def test_negative_or_unknown_values_are_refused(model: Any, data: dict[str, Any]) -> None:
    base = {"invocation_id": "a", "tool_call_id": "t", "role": "agent"}
    fields = {k: v for k, v in base.items() if k in model.model_fields}
    with pytest.raises(ValidationError):
        model.model_validate({**fields, **data})


def test_a_compaction_keeps_counts_as_reported() -> None:
    compaction = ContextCompaction(invocation_id="a", tokens_before=10, tokens_after=50)
    assert (compaction.tokens_before, compaction.tokens_after) == (10, 50)


def test_a_trajectory_refuses_repeated_ids_and_foreign_turns() -> None:
    call = TrajectoryModelCall(model_call_id="c1")
    with pytest.raises(ValidationError, match="model_call_id must be unique"):
        TrajectoryRecord(task_id="t", rollout_id="0-0", model_calls=[call, call])
    TrajectoryRecord(task_id="t", rollout_id="0-0",
                     model_calls=[TrajectoryModelCall(), TrajectoryModelCall()])  # fmt: skip
    turn = {"invocation_id": "a", "task_id": "t", "rollout_id": "0-0", "turn_no": 1,
            "timestamp": 1.0}  # fmt: skip
    with pytest.raises(ValidationError, match="belongs to task"):
        TrajectoryRecord(task_id="t", rollout_id="0-1", turns=[TrajectoryTurn(**turn)])
    with pytest.raises(ValidationError, match="is repeated"):
        TrajectoryRecord(task_id="t", rollout_id="0-0",
                         turns=[TrajectoryTurn(**turn), TrajectoryTurn(**turn)])  # fmt: skip
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        TrajectoryTurn(**{**turn, "turn_no": 0})
    with pytest.raises(ValidationError, match="not unique"):
        TrajectoryRecord(task_id="t", rollout_id="0-0",
                         invocations=[AgentInvocation(invocation_id="a")] * 2)  # fmt: skip


def test_null_keys_are_written() -> None:
    record = TrajectoryRecord(task_id="t", rollout_id="0-0",
                              gaps=[ObservationGap(code="turns_unavailable")])  # fmt: skip
    dumped = record.model_dump(mode="json")
    assert dumped["gaps"] == [{"code": "turns_unavailable", "invocation_id": None, "detail": None}]
    assert list(dumped) == ["schema_version", "task_id", "rollout_id", "invocations", "turns",
                            "model_calls", "tool_calls", "gaps"]  # fmt: skip
