"""``ng_trajectory`` projection from capture lines, and what a rollout record gains."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from capture_core import CaptureStore, RawCaptureLine
from capture_core.collect import (
    TrajectoryRecord,
    capture_attachment,
    capture_fields,
    project_trajectory,
)
from capture_core.records import PAYLOAD_FIELDS
from capture_core.testing import Answer, ToolCallSpec, capture_line, torn

LOOKUP = ToolCallSpec("lookup", {"query": "speed of light"}, "call_7")
ROW = {"task_id": "q7", "_ng_task_index": 7, "_ng_rollout_index": 0}


def tool_result(dialect: str, call_id: str, output: str) -> list[dict[str, Any]]:
    """What the next request appends to send a tool's output back, in each dialect."""
    if dialect == "responses":
        return [
            {"type": "function_call", "call_id": call_id, "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": call_id, "output": output},
        ]
    if dialect == "chat":
        return [
            {"role": "assistant", "content": None, "tool_calls": [{"id": call_id}]},
            {"role": "tool", "tool_call_id": call_id, "content": output},
        ]
    return [
        {"role": "assistant", "content": [{"type": "tool_use", "id": call_id}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                      "content": output}]},
    ]  # fmt: skip


def two_turns(dialect: str, *, stream: bool = False) -> list[RawCaptureLine]:
    """Call 0 asks for a tool; call 1's request carries its output and gets a text answer."""
    first = capture_line(dialect, Answer(text="", tool_calls=(LOOKUP,), response_id="r0"),
                         stream=stream, model_call_id="a" * 32, latency_ms=120.5)  # fmt: skip
    second = capture_line(dialect, Answer(response_id="r1", cached_tokens=10),
                          model_call_id="b" * 32, started_at=1786032156.0)  # fmt: skip
    assert second.request is not None
    key = "input" if dialect == "responses" else "messages"
    second.request[key] = [*second.request[key], *tool_result(dialect, "call_7", "299,792 km/s")]
    return [first, second]


def attach(tmp_path: Path, lines: list[RawCaptureLine | bytes], rollout_id: str = "7-0") -> Any:
    store = CaptureStore(tmp_path)
    for line in lines:
        if isinstance(line, bytes):
            with store.path_for(rollout_id).open("ab") as handle:
                handle.write(line + b"\n")
        else:
            store.record(rollout_id, line)
    return capture_attachment([tmp_path], rollout_id, drain_timeout_s=0)


@pytest.mark.parametrize("dialect", ["responses", "chat", "messages"])
def test_the_capture_alone_gives_model_calls_and_says_what_it_lacks(
    tmp_path: Path, dialect: str
) -> None:
    attachment = attach(tmp_path, [*two_turns(dialect)])
    trajectory = project_trajectory(ROW, {}, attachment)
    assert trajectory["schema_version"] == "1.0"
    assert (trajectory["task_id"], trajectory["rollout_id"]) == ("q7", "7-0")
    assert [c["model_call_id"] for c in trajectory["model_calls"]] == ["a" * 32, "b" * 32]
    # Tool executions are agent-side evidence: the capture only shows what the model asked.
    assert trajectory["invocations"] == [] and trajectory["tool_calls"] == []
    assert [t.call_id for t in attachment.calls[0].tool_calls] == ["call_7"]
    assert trajectory["gaps"] == [
        {"code": "turns_unavailable", "invocation_id": None, "detail": None},
        {"code": "conversation_unavailable", "invocation_id": None, "detail": None},
    ]
    TrajectoryRecord.model_validate(trajectory)  # the dump validates as the model again


def test_model_calls_carry_payloads_metadata_and_tokens(tmp_path: Path) -> None:
    lines = two_turns("responses", stream=True)
    raw = RawCaptureLine(model_call_id="c" * 32, dialect="chat", status_code=502,
                         error_category="upstream_error", request_raw="not json",
                         response_raw="<html>bad gateway</html>", latency_ms=3.0)  # fmt: skip
    attachment = attach(tmp_path, [*lines, raw])
    calls = project_trajectory(ROW, {}, attachment)["model_calls"]
    first, second, third = calls
    assert list(first) == ["model_call_id", "started_at", "completed_at", "duration_ms",
                           "request", "response", "response_metadata", "token_stats"]  # fmt: skip
    assert first["request"] == lines[0].request
    assert first["response"] == lines[0].response  # the reassembled stream, not the SSE text
    assert first["duration_ms"] == 120.5
    assert first["started_at"] == 1786032154.12  # Unix seconds, like the capture line
    assert first["response_metadata"] == {
        "response_id": "r0", "model_ref": {"type": "responses_api_models", "name": "policy_model"},
        "model": "sim-model-1", "dialect": "responses", "status_code": 200,
        "response_status": "completed", "finish_reason": first["response_metadata"]["finish_reason"],
        "error_category": None, "latency_ttft_ms": 213.4,
    }  # fmt: skip
    assert second["token_stats"] == {"prompt_tokens": 94, "completion_tokens": 28,
                                     "reasoning_tokens": second["token_stats"]["reasoning_tokens"],
                                     "total_tokens": 122, "cached_tokens": 10}  # fmt: skip
    assert (third["request"], third["response"]) == ("not json", "<html>bad gateway</html>")
    assert third["response_metadata"]["error_category"] == "upstream_error"
    assert third["token_stats"]["prompt_tokens"] is None


def test_capture_gaps_are_carried_and_an_empty_capture_says_so(tmp_path: Path) -> None:
    good = capture_line("chat", Answer())
    attachment = attach(tmp_path, [good, torn(good)])
    assert project_trajectory(ROW, {}, attachment)["gaps"][0] == {
        "code": "model_call_capture_records_unreadable", "invocation_id": None,
        "detail": "count=1"}  # fmt: skip
    empty = capture_attachment([tmp_path], "9-9", drain_timeout_s=0)
    assert [g["code"] for g in project_trajectory(ROW, {}, empty)["gaps"]] == [
        "model_call_capture_no_records", "model_calls_unavailable", "turns_unavailable",
        "conversation_unavailable"]  # fmt: skip


def test_success_moves_payloads_out_of_the_attachment(tmp_path: Path) -> None:
    attachment = attach(tmp_path, [*two_turns("chat")])
    row = {"task_id": "q1", "_ng_task_index": 7, "_ng_rollout_index": 0}
    result = {"response": {"id": "x"}, "reward": 1.0, "generation_token_ids": [1, 2]}
    before = copy.deepcopy((row, result, attachment.model_dump()))
    fields = capture_fields(row, result, attachment)
    assert list(fields) == ["ng_model_call_capture", "ng_trajectory"]  # no window: no ng_perf
    capture = fields["ng_model_call_capture"]
    assert list(capture) == ["rollout_id", "metrics", "calls"]
    assert all(not set(PAYLOAD_FIELDS) & set(call) for call in capture["calls"])
    assert fields["ng_trajectory"]["model_calls"][1]["request"]["messages"][-1]["role"] == "tool"
    assert fields["ng_trajectory"]["gaps"][-1] == {
        "code": "perf_unavailable", "invocation_id": None, "detail": "rollout_window_unknown"}  # fmt: skip
    assert (row, result, attachment.model_dump()) == before  # nothing given is modified


def duplicate_ids(tmp_path: Path) -> Any:
    line = capture_line("chat", Answer(), model_call_id="f" * 32)
    return attach(tmp_path, [line, line.model_copy(), torn(line)])


def negative_latency(tmp_path: Path) -> Any:
    return attach(tmp_path, [capture_line("chat", Answer(), latency_ms=-4.0)])


@pytest.mark.parametrize(
    ("build", "row", "detail"),
    [
        (duplicate_ids, ROW, "ValidationError"),
        (negative_latency, ROW, "ValidationError"),
        (negative_latency, {"no": "task id"}, "ValueError"),
    ],
)
def test_a_failed_projection_keeps_payloads_and_says_why(
    tmp_path: Path, build: Any, row: dict[str, Any], detail: str, caplog: pytest.LogCaptureFixture
) -> None:
    attachment = build(tmp_path)
    with pytest.raises(ValueError):
        project_trajectory(row, {}, attachment)
    fields = capture_fields(row, {}, attachment, window=(0.0, 1.0))
    assert list(fields) == ["ng_model_call_capture"]  # no ng_trajectory, no ng_perf
    capture = fields["ng_model_call_capture"]
    gaps = [g for g in capture["gaps"] if g["code"] == "trajectory_projection_failed"]
    assert gaps == [{"code": "trajectory_projection_failed", "detail": detail}]
    assert capture["gaps"][-1] == gaps[0]  # after the capture's own gaps
    assert capture["calls"] and all(call["request"] and call["response"]
                                    for call in capture["calls"])  # fmt: skip
    assert attachment.gaps == [g for g in attachment.gaps if g.code != gaps[0]["code"]]
    assert "could not project the trajectory of rollout" in caplog.text


def test_a_projection_failure_from_anywhere_is_a_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from capture_core.collect import trajectory

    def explode(row: object, result: object) -> object:
        raise RuntimeError("boom")

    monkeypatch.setattr(trajectory, "build_trajectory", explode)
    fields = capture_fields(ROW, {}, attach(tmp_path, [capture_line("chat", Answer())]))
    assert fields["ng_model_call_capture"]["gaps"] == [
        {"code": "trajectory_projection_failed", "detail": "RuntimeError"}
    ]
    assert "ng_trajectory" not in fields
