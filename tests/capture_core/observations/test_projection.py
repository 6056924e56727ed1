"""``build_trajectory``: golden cases built from the projection rules (§9.2)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from capture_core.observations import build_trajectory, project_call, unix_seconds

ROW = {"task_id": "collector-task", "problem_id": "ignored", "_ng_task_index": 2,
       "_ng_rollout_index": 3}  # fmt: skip
SERVER = {"type": "responses_api_models", "name": "policy_model"}


def turn(invocation_id: str, turn_no: int, timestamp: float, **identity: str) -> dict[str, Any]:
    return {"invocation_id": invocation_id, "task_id": identity.get("task_id", "collector-task"),
            "rollout_id": identity.get("rollout_id", "2-3"), "turn_no": turn_no,
            "timestamp": timestamp, "question": f"q{turn_no}"}  # fmt: skip


def gap_list(record: Any) -> list[tuple[str, str | None, str | None]]:
    return [(g.code, g.invocation_id, g.detail) for g in record.gaps]


PRODUCER = {
    "schema_version": "1.0", "task_id": "collector-task", "rollout_id": "2-3",
    "invocations": [{"invocation_id": "main", "status": "completed", "conversation": [
        {"role": "user", "content": "hi"},
        {"type": "function_call_output", "call_id": "t1", "output": "from main's conversation"},
    ]}],
    "turns": [turn("main", 2, 20.0), turn("main", 1, 10.0), turn("aaa", 1, 20.0)],
    "model_calls": [{"model_call_id": "c1", "request": {"from": "producer"},
                     "response_metadata": {"model": "producer-model", "finish_reason": "stop"},
                     "token_stats": {"prompt_tokens": 5, "reasoning_tokens": 1}}],
    "tool_calls": [
        {"invocation_id": "main", "tool_call_id": "t0", "tool_name": "only-producer",
         "status": "failed", "output": "producer output"},
        {"invocation_id": "main", "tool_call_id": "t1", "tool_name": "search",
         "status": "completed", "output": "replaced"},
    ],
    "gaps": [{"code": "agent_transcript_unavailable", "invocation_id": "main"},
             {"code": "shared"}],
}  # fmt: skip
OBSERVATIONS = {
    "source": "harness",
    "records": [
        {"kind": "tool_call", "invocation_id": "main", "tool_call_id": "t1", "status": "unknown",
         "started_at": 100.0, "completed_at": 100.5, "timing_source": "executor"},
        {"kind": "agent_invocation", "invocation_id": "main", "status": "failed"},
        {"kind": "agent_invocation", "invocation_id": "sub", "parent_invocation_id": "main",
         "spawned_by_tool_call_id": "t1", "conversation": [
             {"type": "function_call_output", "call_id": "t2", "output": {"rows": 3}}]},
        {"kind": "tool_call", "invocation_id": "sub", "tool_call_id": "t2", "status": "timeout"},
        {"kind": "tool_call", "invocation_id": "sub", "tool_call_id": "t3"},
        {"kind": "sandbox", "role": "agent", "outcome": "completed"},
    ],
    "gaps": [{"code": "shared"}, {"code": "subagent_hierarchy_unavailable", "detail": "x"}],
}  # fmt: skip


def capture_call(index: int, call_id: str | None, **fields: Any) -> dict[str, Any]:
    base = {"model_call_id": call_id, "response_id": f"resp-{index}", "call_index": index,
            "model_ref": SERVER, "model": "captured-model", "dialect": "responses",
            "status_code": 200, "response_status": None, "finish_reason": None,
            "started_at": "2026-08-06T16:02:34.120000Z", "completed_at": 1786032154.96,
            "tokens_in": 94, "tokens_out": 28, "tokens_reasoning": None, "tokens_total": 122,
            "request": {"input": f"call {index}"}, "response": {"status": "completed"},
            "cached_tokens": 0, "error_category": None, "latency_total_ms": 842.7,
            "latency_ttft_ms": 213.4}  # fmt: skip
    return {**base, **fields}


CAPTURE = {
    "rollout_id": "2-3", "metrics": {},
    "calls": [
        capture_call(2, "c2", request=None, request_raw="not json", response=None,
                     response_raw="<html>", tokens_in=True, tokens_out=-1, tokens_total="5"),
        capture_call(1, "c1", response_status="incomplete", tokens_in=7, finish_reason=None),
        capture_call(0, "c0", response={"status": "completed"}),
        "not a call",
    ],
    "gaps": [{"code": "model_call_capture_incomplete"}, {"code": 5},
             {"code": "shared", "detail": None}],
}  # fmt: skip


def test_every_source_is_merged_by_the_rules() -> None:
    result = {"ng_trajectory": PRODUCER, "ng_agent_observations": OBSERVATIONS,
              "ng_model_call_capture": CAPTURE, "response": {"id": "untouched"}}  # fmt: skip
    before = copy.deepcopy(result)
    record = build_trajectory(ROW, result)
    assert result == before  # nothing given is modified
    assert (record.task_id, record.rollout_id) == ("collector-task", "2-3")
    # invocations: the producer's first (its "main" wins), observed new ones appended
    assert [(i.invocation_id, i.status) for i in record.invocations] == [
        ("main", "completed"), ("sub", "unknown")]  # fmt: skip
    # turns by (timestamp, invocation, turn_no)
    assert [(t.timestamp, t.invocation_id, t.turn_no) for t in record.turns] == [
        (10.0, "main", 1), (20.0, "aaa", 1), (20.0, "main", 2)]  # fmt: skip
    tools = {(t.invocation_id, t.tool_call_id): t for t in record.tool_calls}
    assert list(tools) == [("main", "t0"), ("main", "t1"), ("sub", "t2"), ("sub", "t3")]
    assert tools["main", "t0"].output == "producer output"  # producer-only: untouched
    merged = tools["main", "t1"]
    assert merged.status == "completed"  # an observed "unknown" never hides a known status
    assert (merged.tool_name, merged.started_at, merged.completed_at) == ("search", 100.0, 100.5)
    assert merged.timing_source == "executor"
    assert merged.output == "from main's conversation"
    assert tools["sub", "t2"].status == "timeout" and tools["sub", "t2"].output == {"rows": 3}
    assert tools["sub", "t3"].output is None and tools["sub", "t3"].status == "unknown"
    # model calls: producer's position kept, capture-only appended in call_index order
    assert [c.model_call_id for c in record.model_calls] == ["c1", "c0", "c2"]
    c1, c0, c2 = record.model_calls
    assert c1.request == {"input": "call 1"}  # capture's non-null top-level value wins
    assert c1.response_metadata.model_dump(exclude_none=True) == {
        "response_id": "resp-1", "model_ref": SERVER, "model": "captured-model",
        "dialect": "responses", "status_code": 200, "response_status": "incomplete",
        "finish_reason": "stop", "latency_ttft_ms": 213.4}  # fmt: skip
    assert c1.token_stats.model_dump() == {"prompt_tokens": 7, "completion_tokens": 28,
                                           "reasoning_tokens": 1, "total_tokens": 122,
                                           "cached_tokens": 0}  # fmt: skip
    assert c0.response_metadata.response_status == "completed"  # from response.status
    assert (c0.started_at, c0.completed_at, c0.duration_ms) == (1786032154.12, 1786032154.96, 842.7)
    assert (c2.request, c2.response) == ("not json", "<html>")  # the raw text
    assert c2.token_stats.model_dump() == {"prompt_tokens": None, "completion_tokens": None,
                                           "reasoning_tokens": None, "total_tokens": None,
                                           "cached_tokens": 0}  # only non-negative ints  # fmt: skip
    assert gap_list(record) == [
        ("agent_transcript_unavailable", "main", None),
        ("shared", None, None),  # in producer, observations and capture: the first is kept
        ("subagent_hierarchy_unavailable", None, "x"),
        ("model_call_capture_incomplete", None, None),
        ("model_call_capture_gap_invalid", None, "ValidationError"),
    ]
    dumped = record.model_dump(mode="json")
    assert dumped["gaps"][0] == {"code": "agent_transcript_unavailable", "invocation_id": "main",
                                 "detail": None}  # null keys are written  # fmt: skip
    assert dumped["tool_calls"][3]["started_at"] is None


def test_a_producer_with_another_identity_is_normalized() -> None:
    producer = {**PRODUCER, "task_id": "agent-task", "rollout_id": "9-9",
                "turns": [turn("main", 1, 1.0, task_id="agent-task", rollout_id="9-9")],
                "gaps": []}  # fmt: skip
    record = build_trajectory(ROW, {"ng_trajectory": producer})
    assert gap_list(record)[0] == ("producer_trajectory_identity_mismatch", None,
                                   "task_id,rollout_id")  # fmt: skip
    (only,) = record.turns
    assert (only.task_id, only.rollout_id) == ("collector-task", "2-3")
    partial = {**producer, "task_id": "collector-task",
               "turns": [turn("main", 1, 1.0, rollout_id="9-9")]}  # fmt: skip
    assert gap_list(build_trajectory(ROW, {"ng_trajectory": partial}))[0][2] == "rollout_id"


@pytest.mark.parametrize(
    ("producer", "detail"),
    [({"schema_version": "2.0", "task_id": "t", "rollout_id": "2-3"}, "ValidationError"),
     ({**PRODUCER, "producer_extension": 1}, "ValidationError"),
     ([PRODUCER], "list"), ("text", "str")],
)  # fmt: skip
def test_an_invalid_producer_trajectory_is_a_gap_and_is_not_used(
    producer: Any, detail: str
) -> None:
    record = build_trajectory(ROW, {"ng_trajectory": producer})
    assert gap_list(record) == [
        ("producer_trajectory_invalid", None, detail),
        ("model_calls_unavailable", None, None),
        ("turns_unavailable", None, None),
        ("conversation_unavailable", None, None),
    ]
    assert record.invocations == [] and record.turns == []


def test_invalid_observations_are_a_gap_and_are_not_used() -> None:
    bad = {**OBSERVATIONS, "records": [{"kind": "turn", "invocation_id": "main"}]}
    record = build_trajectory(ROW, {"ng_agent_observations": bad, "ng_model_call_capture": CAPTURE})
    (first, *_) = gap_list(record)
    assert first[0] == "agent_observations_invalid" and "turns go in ng_trajectory" in str(first[2])
    assert record.invocations == []
    assert [c.model_call_id for c in record.model_calls] == ["c0", "c1", "c2"]


def test_what_the_record_lacks_is_said_last_and_once() -> None:
    record = build_trajectory({"_ng_task_index": 4, "_ng_rollout_index": 0}, {})
    assert (record.task_id, record.rollout_id) == ("4", "4-0")
    assert gap_list(record) == [("model_calls_unavailable", None, None),
                                ("turns_unavailable", None, None),
                                ("conversation_unavailable", None, None)]  # fmt: skip
    with_calls = build_trajectory(ROW, {"ng_model_call_capture": {"calls": [capture_call(0, None)],
                                                                  "gaps": []}})  # fmt: skip
    assert [g[0] for g in gap_list(with_calls)] == ["turns_unavailable", "conversation_unavailable"]


def test_an_explicit_rollout_id_and_task_keys_in_order() -> None:
    row = {"instance_id": 7, "_ng_rollout_id": "s7.1-0", "_ng_attempt_index": 2}
    record = build_trajectory(row, {})
    assert (record.task_id, record.rollout_id) == ("7", "s7.1-0-a2")
    assert build_trajectory({"problem_id": "p", "_ng_task_index": 0, "_ng_rollout_index": 0},
                            {}).task_id == "p"  # fmt: skip


@pytest.mark.parametrize(
    ("row", "capture", "message"),
    [
        (ROW, {"calls": [capture_call(0, "x", latency_total_ms=-1.0)]}, "greater than or equal"),
        (ROW, {"calls": [capture_call(0, "x"), capture_call(1, "x")]}, "must be unique"),
        (ROW, {"calls": [capture_call(0, "x", started_at="yesterday")]}, "Invalid isoformat"),
        ({"_ng_task_index": 1}, {"calls": []}, "_ng_rollout_index"),
        ({"id": "q"}, {"calls": []}, "no task_id"),
    ],
)  # fmt: skip
def test_evidence_that_cannot_make_a_record_raises(
    row: dict[str, Any], capture: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_trajectory(row, {"ng_model_call_capture": capture})


def test_call_projection_and_timestamps() -> None:
    call = project_call({"model_call_id": "m", "response": {"status": 5}, "tokens_in": 0})
    assert call.response_metadata.response_status is None  # a non-string status is not used
    assert call.token_stats.prompt_tokens == 0  # 0 is a reported value
    assert unix_seconds(12) == 12.0 and unix_seconds(None) is None
    with pytest.raises(ValueError, match="time zone"):
        unix_seconds("2026-08-06T16:02:34")
    with pytest.raises(ValueError, match="not a timestamp"):
        unix_seconds(float("nan"))
