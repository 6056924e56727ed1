"""Where each gap code lands in a rollout record, and the rest of the collector sequence:
join, redaction, projection failure, ng_perf (golden cases from the spec's rules)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from capture_core import GapCode, ModelCallCaptureAttachment, ModelCallRecord, ModelRef
from capture_core.collect import attach_evidence, capture_fields
from capture_core.metrics import aggregate_model_call_records
from capture_core.records import Gap

ROW = {"task_id": "t9", "_ng_task_index": 2, "_ng_rollout_index": 3}
SERVER = {"type": "responses_api_models", "name": "policy_model"}
T = 1_786_032_154.0
SECRET = "iVBORw0KGgoSECRETBASE64"


def call(index: int, response_id: str, start: float, end: float, **extra: Any) -> ModelCallRecord:
    image = {"type": "input_image", "image_url": f"data:image/png;base64,{SECRET}"}
    return ModelCallRecord(
        call_index=index, model_call_id=f"c{index}", response_id=response_id,
        model_ref=ModelRef(name="policy_model"), started_at=T + start, completed_at=T + end,
        latency_total_ms=(end - start) * 1000, tokens_out=10,
        request={"input": [{"role": "user", "content": [image]}]},
        response={"id": response_id, "status": "completed"}, **extra,
    )  # fmt: skip


def attachment(*calls: ModelCallRecord, gaps: tuple[Gap, ...] = ()) -> ModelCallCaptureAttachment:
    return ModelCallCaptureAttachment(rollout_id="2-3", metrics=aggregate_model_call_records(list(calls)),
                                      calls=list(calls), gaps=list(gaps))  # fmt: skip


def two_calls(*gaps: Gap) -> ModelCallCaptureAttachment:
    return attachment(call(0, "r0", 1.0, 2.0), call(1, "r1", 3.0, 4.0), gaps=gaps)


def observations(*refs: str, gaps: list[dict[str, Any]] | None = None,
                 conversation: bool = True) -> dict[str, Any]:  # fmt: skip
    items = [{"role": "user", "content": "hi"},
             {"type": "function_call_output", "call_id": "t1", "output": "42"}]  # fmt: skip
    return {"source": "test", "gaps": gaps or [], "records": [
        {"kind": "agent_invocation", "invocation_id": "main", "status": "completed",
         "model_calls": [{"model_ref": SERVER, "response_id": r} for r in refs],
         "conversation": items if conversation else []},
        {"kind": "tool_call", "invocation_id": "main", "tool_call_id": "t1", "tool_name": "calc",
         "started_at": T + 2.25, "completed_at": T + 2.75, "timing_source": "executor",
         "status": "completed"}]}  # fmt: skip


def producer(**changes: Any) -> dict[str, Any]:
    turn = {"invocation_id": "main", "task_id": "t9", "rollout_id": "2-3", "turn_no": 1,
            "timestamp": T, "question": "q", "answer": "a"}  # fmt: skip
    return {"schema_version": "1.0", "task_id": "t9", "rollout_id": "2-3", "turns": [turn],
            **changes}  # fmt: skip


WINDOW = (T, T + 5.0)
Scenario = Callable[[], tuple[dict[str, Any], ModelCallCaptureAttachment | None]]
CAPTURE, OBSERVATIONS, TRAJECTORY = (
    "ng_model_call_capture",
    "ng_agent_observations",
    "ng_trajectory",
)


def codes_at(fields: dict[str, Any], key: str) -> list[str]:
    value = fields.get(key)
    return [g["code"] for g in value.get("gaps", ())] if isinstance(value, dict) else []


def clean() -> tuple[dict[str, Any], ModelCallCaptureAttachment | None]:
    return {OBSERVATIONS: observations("r0", "r1"), TRAJECTORY: producer()}, two_calls()


def capture_gap(code: GapCode) -> Scenario:
    return lambda: ({OBSERVATIONS: observations("r0", "r1"), TRAJECTORY: producer()},
                    two_calls(Gap(code=code, detail="count=1")))  # fmt: skip


BAD_BUNDLE = {"source": "test", "records": [{"kind": "turn", "invocation_id": "main"}]}
# code -> (scenario, where it must be, where it must not be)
PLACES: dict[str, tuple[Scenario, set[str]]] = {
    **{code: (capture_gap(code), {CAPTURE, TRAJECTORY}) for code in (
        GapCode.MODEL_CALL_CAPTURE_NO_RECORDS, GapCode.MODEL_CALL_CAPTURE_RECORDS_UNREADABLE,
        GapCode.MODEL_CALL_CAPTURE_INCOMPLETE, GapCode.MODEL_CALL_CAPTURE_UNREADABLE,
        GapCode.MODEL_CALL_CAPTURE_PENDING, GapCode.MODEL_CALL_CAPTURE_LOST,
        GapCode.MODEL_CALL_CAPTURE_FAILED)},
    GapCode.AGENT_OBSERVATION_JOIN_FAILED: (lambda: ({OBSERVATIONS: BAD_BUNDLE}, two_calls()),
                                            {CAPTURE, TRAJECTORY}),
    GapCode.AGENT_OBSERVATIONS_INVALID: (lambda: ({OBSERVATIONS: BAD_BUNDLE}, two_calls()),
                                         {TRAJECTORY}),
    GapCode.MODEL_CALL_REFERENCE_UNMATCHED: (
        lambda: ({OBSERVATIONS: observations("r0", "r1", "r7")}, two_calls()),
        {OBSERVATIONS, TRAJECTORY}),
    GapCode.MODEL_CALL_REFERENCE_AMBIGUOUS: (
        lambda: ({OBSERVATIONS: observations("r0")},
                 attachment(call(0, "r0", 1, 2), call(1, "r0", 3, 4))), {OBSERVATIONS, TRAJECTORY}),
    GapCode.MODEL_CALL_REFERENCE_CONFLICT: (
        lambda: ({OBSERVATIONS: observations("r0", "r0", "r1")}, two_calls()),
        {OBSERVATIONS, TRAJECTORY}),
    GapCode.MODEL_CALL_OWNERSHIP_UNAVAILABLE: (
        lambda: ({OBSERVATIONS: observations("r0")}, two_calls()), {OBSERVATIONS, TRAJECTORY}),
    GapCode.PRODUCER_TRAJECTORY_INVALID: (
        lambda: ({OBSERVATIONS: observations("r0", "r1"), TRAJECTORY: producer(turns="x")},
                 two_calls()), {TRAJECTORY}),
    GapCode.PRODUCER_TRAJECTORY_IDENTITY_MISMATCH: (
        lambda: ({OBSERVATIONS: observations("r0", "r1"),
                  TRAJECTORY: producer(task_id="agent-side", turns=[])}, two_calls()),
        {TRAJECTORY}),
    GapCode.MODEL_CALLS_UNAVAILABLE: (lambda: ({OBSERVATIONS: observations()}, None), {TRAJECTORY}),
    GapCode.TURNS_UNAVAILABLE: (lambda: ({OBSERVATIONS: observations("r0", "r1")}, two_calls()),
                                {TRAJECTORY}),
    GapCode.CONVERSATION_UNAVAILABLE: (
        lambda: ({OBSERVATIONS: observations("r0", "r1", conversation=False)}, two_calls()),
        {TRAJECTORY}),
    GapCode.TRAJECTORY_PROJECTION_FAILED: (
        lambda: ({}, attachment(call(0, "r0", 2, 1))), {CAPTURE}),  # a negative latency
    GapCode.MULTIMODAL_HISTORY_REDACTED: (
        lambda: ({OBSERVATIONS: observations("r0", "r1",
                                             gaps=[{"code": "multimodal_history_redacted"}]),
                  TRAJECTORY: producer()}, two_calls()), {OBSERVATIONS, TRAJECTORY}),
    GapCode.TOOL_TIMING_UNAVAILABLE: (
        lambda: ({OBSERVATIONS: observations("r0", "r1", gaps=[{"code": "tool_timing_unavailable"}]),
                  TRAJECTORY: producer()}, two_calls()), {OBSERVATIONS, TRAJECTORY}),
    GapCode.PERF_UNAVAILABLE: (lambda: ({TRAJECTORY: producer()}, two_calls()), {TRAJECTORY}),
}  # fmt: skip
#: Reached only through build_trajectory with a raw attachment (tests/.../test_projection.py):
#: the collector's own attachment never holds a gap that is not a gap.
ELSEWHERE = {GapCode.MODEL_CALL_CAPTURE_GAP_INVALID}


def test_every_gap_code_has_a_case() -> None:
    assert set(GapCode) == set(PLACES) | ELSEWHERE


@pytest.mark.parametrize("code", sorted(PLACES))
def test_each_gap_code_lands_where_the_spec_says(code: str) -> None:
    scenario, places = PLACES[code]
    result, captured = scenario()
    fields = capture_fields(ROW, result, captured, window=WINDOW)
    found = {key for key in (CAPTURE, OBSERVATIONS, TRAJECTORY) if code in codes_at(fields, key)}
    assert found == places, (code, {k: codes_at(fields, k) for k in fields})


def test_a_clean_rollout_has_no_gap_and_a_perf_record() -> None:
    result, captured = clean()
    fields = capture_fields(ROW, result, captured, window=WINDOW)
    assert list(fields) == [CAPTURE, OBSERVATIONS, TRAJECTORY, "ng_perf"]
    assert [codes_at(fields, k) for k in (CAPTURE, OBSERVATIONS, TRAJECTORY)] == [[], [], []]
    perf = fields["ng_perf"]
    assert (perf["wall_time_ms"], perf["model_time_ms"], perf["tool_time_ms"]) == (
        pytest.approx(5000), pytest.approx(2000), pytest.approx(500))  # fmt: skip
    assert perf["overhead_time_ms"] == pytest.approx(2500)
    joined = fields[OBSERVATIONS]["records"][0]["model_calls"]
    assert [ref["model_call_id"] for ref in joined] == ["c0", "c1"]  # canonical refs
    (tool,) = fields[TRAJECTORY]["tool_calls"]
    assert (tool["output"], tool["timing_source"], tool["started_at"]) == (
        "42",
        "executor",
        T + 2.25,
    )


def test_perf_refuses_with_the_reason_in_the_trajectory_gaps() -> None:
    result, captured = clean()
    gap = Gap(code=GapCode.MODEL_CALL_CAPTURE_PENDING, detail="count=1")
    fields = capture_fields(ROW, result, two_calls(gap), window=WINDOW)
    assert "ng_perf" not in fields
    assert fields[TRAJECTORY]["gaps"][-1] == {"code": "perf_unavailable", "invocation_id": None,
                                              "detail": "capture:model_call_capture_pending"}  # fmt: skip
    no_agent = capture_fields(ROW, {}, captured, window=WINDOW)
    assert no_agent[TRAJECTORY]["gaps"][-1]["detail"] == "agent_observations_unavailable"


def test_a_failed_join_leaves_the_observations_as_the_agent_gave_them() -> None:
    fields = capture_fields(ROW, {OBSERVATIONS: BAD_BUNDLE}, two_calls(), window=WINDOW)
    assert fields[OBSERVATIONS] == BAD_BUNDLE
    (gap,) = fields[CAPTURE]["gaps"]
    assert gap["code"] == "agent_observation_join_failed" and "ValidationError" in gap["detail"]
    assert (
        "payloads" not in str(fields[CAPTURE]["calls"])
        and "request" not in fields[CAPTURE]["calls"][0]
    )


def test_redacted_history_leaves_no_payload_copy_in_the_row() -> None:
    result, captured = PLACES[GapCode.MULTIMODAL_HISTORY_REDACTED][0]()
    assert (
        captured is not None and SECRET in orjson.dumps(captured.model_dump(mode="json")).decode()
    )
    fields = capture_fields(ROW, result, captured, window=WINDOW)
    assert SECRET not in orjson.dumps(fields).decode()
    assert all(c["request"] is None and c["response"] is None
               for c in fields[TRAJECTORY]["model_calls"])  # fmt: skip
    assert "ng_perf" in fields  # redaction does not hide timing
    unredacted = capture_fields(ROW, clean()[0], captured, window=WINDOW)
    assert SECRET in orjson.dumps(unredacted[TRAJECTORY]).decode()  # payloads live there
    assert SECRET not in orjson.dumps(unredacted[CAPTURE]).decode()  # ...and only there
    # the producer trajectory carrying the gap works the same way
    by_trajectory = {TRAJECTORY: producer(gaps=[{"code": "multimodal_history_redacted"}])}
    assert SECRET not in orjson.dumps(capture_fields(ROW, by_trajectory, captured)).decode()
    # a failed projection keeps no payload either
    broken = attachment(call(0, "r0", 2, 1))
    failed = capture_fields(ROW, result, broken, window=WINDOW)
    assert TRAJECTORY not in failed and SECRET not in orjson.dumps(failed).decode()


def test_projection_failure_without_capture_goes_to_observations_else_a_minimal_trajectory() -> (
    None
):
    result = {OBSERVATIONS: observations(), TRAJECTORY: producer(schema_version="1.0"),
              "x": 1}  # fmt: skip
    row = {"task_id": "t9", "_ng_task_index": 2}  # no rollout index: identity fails
    fields = capture_fields(row, result, None, window=WINDOW)
    assert fields[OBSERVATIONS]["gaps"][-1] == {"code": "trajectory_projection_failed",
                                                "detail": "ValueError"}  # fmt: skip
    assert TRAJECTORY not in fields
    only_producer = capture_fields(row, {TRAJECTORY: producer()}, None, window=WINDOW)
    assert only_producer == {TRAJECTORY: {
        "schema_version": "1.0", "task_id": "t9", "rollout_id": "", "invocations": [],
        "turns": [], "model_calls": [], "tool_calls": [],
        "gaps": [{"code": "trajectory_projection_failed", "invocation_id": None,
                  "detail": "ValueError"}]}}  # fmt: skip


def test_nothing_to_attach_and_attach_evidence() -> None:
    assert capture_fields(ROW, {"response": {}}, None, window=WINDOW) == {}
    record = {**ROW, "response": {}, TRAJECTORY: "stale", "reward": 1.0}
    result, captured = clean()
    before = copy.deepcopy(result)
    new = attach_evidence(record, ROW, result, captured, window=WINDOW)
    assert list(new) == [*ROW, "response", "reward", CAPTURE, OBSERVATIONS, TRAJECTORY, "ng_perf"]
    assert result == before and record[TRAJECTORY] == "stale"
    gone = attach_evidence(record, ROW, {TRAJECTORY: producer(turns="x")}, None)
    assert gone[TRAJECTORY]["gaps"][0]["code"] == "producer_trajectory_invalid"
