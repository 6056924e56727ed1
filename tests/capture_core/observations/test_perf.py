"""``derive_perf``: the parts of a rollout's wall time, per-call figures, and when it refuses."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capture_core.observations import (
    AgentInvocation,
    ObservationGap,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryToolCall,
    derive_perf,
)

T = 1_786_000_000.0  # a realistic Unix time: float precision matters there


def model_call(start: float, end: float | None, **stats: Any) -> TrajectoryModelCall:
    ttft = stats.pop("ttft", None)
    return TrajectoryModelCall.model_validate({
        "started_at": T + start, "completed_at": None if end is None else T + end,
        "response_metadata": {"latency_ttft_ms": ttft}, "token_stats": stats})  # fmt: skip


def tool(
    start: float | None, end: float | None, name: str = "t", source: str | None = "executor"
) -> TrajectoryToolCall:
    return TrajectoryToolCall(invocation_id="main", tool_call_id=name, timing_source=source,  # type: ignore[arg-type]
                              started_at=None if start is None else T + start,
                              completed_at=None if end is None else T + end)  # fmt: skip


def record(calls: list[TrajectoryModelCall], tools: list[TrajectoryToolCall] = (),  # type: ignore[assignment]
           gaps: tuple[str, ...] = (), invocations: bool = True) -> TrajectoryRecord:  # fmt: skip
    return TrajectoryRecord(
        task_id="t", rollout_id="0-0", model_calls=calls, tool_calls=list(tools),
        invocations=[AgentInvocation(invocation_id="main")] if invocations else [],
        gaps=[ObservationGap(code=code) for code in gaps],
    )  # fmt: skip


def perf(trajectory: TrajectoryRecord, start: float = 0.0, end: float = 10.0) -> Any:
    derived = derive_perf(trajectory, started_at=T + start, completed_at=T + end)
    assert derived.perf is not None, derived.reason
    return derived.perf


def test_sequential_calls_and_a_tool_partition_the_wall_time() -> None:
    result = perf(record([model_call(1, 3, completion_tokens=10), model_call(5, 6, completion_tokens=5)],
                         [tool(3.25, 4.5)]))  # fmt: skip
    assert result.wall_time_ms == pytest.approx(10_000)
    assert result.model_time_ms == pytest.approx(3_000)
    assert result.tool_time_ms == pytest.approx(1_250)
    assert result.overhead_time_ms == pytest.approx(5_750)
    assert result.tool_model_overlap_ms == 0
    assert (result.model_concurrency_peak, result.model_concurrency_mean) == (1, pytest.approx(1.0))
    assert (result.model_calls, result.tool_calls, result.tokens_out) == (2, 1, 15)
    assert result.tokens_out_per_s == pytest.approx(5.0)
    assert result.evidence["tool_time_ms"].sources == [
        "collector_clock", "capture_timestamps", "agent_invocations", "tool_timestamps:executor"]  # fmt: skip
    assert result.evidence["wall_time_ms"].model_dump() == {"sources": ["collector_clock"],
                                                           "reported": None, "of": None}  # fmt: skip


def test_overlap_counts_as_model_time_and_concurrency_is_time_weighted() -> None:
    calls = [model_call(1, 4, completion_tokens=10, ttft=100.0, prompt_tokens=10, cached_tokens=5),
             model_call(2, 5, completion_tokens=20, ttft=300.0, prompt_tokens=10),
             model_call(6, 6, completion_tokens=0, ttft=200.0, prompt_tokens=30, cached_tokens=0)]  # fmt: skip
    result = perf(record(calls, [tool(3, 7, source=None), tool(3.5, 3.75, "u", "harness")]))
    assert result.model_time_ms == pytest.approx(4_000)  # [1, 5]; the zero-length call adds none
    assert result.tool_time_ms == pytest.approx(2_000)  # [5, 7]: [3, 5] is under model time
    assert result.tool_model_overlap_ms == pytest.approx(2_000)
    assert result.overhead_time_ms == pytest.approx(4_000)
    assert result.model_concurrency_peak == 2
    assert result.model_concurrency_mean == pytest.approx(6 / 4)
    assert result.tokens_out_per_s == pytest.approx(30 / 4)
    assert result.ttft_p50_ms == 200.0
    assert result.cache_hit_share == pytest.approx(5 / 40)
    assert result.evidence["cache_hit_share"].model_dump() == {"sources": ["capture_usage"],
                                                              "reported": 2, "of": 3}  # fmt: skip
    assert result.evidence["overhead_time_ms"].sources[-2:] == [
        "tool_timestamps:harness", "tool_timestamps:unspecified"]  # fmt: skip


def test_unknown_per_call_figures_are_null_not_zero() -> None:
    result = perf(record([model_call(1, 2, completion_tokens=4), model_call(3, 4)]))
    assert (result.tokens_out, result.tokens_out_per_s) == (None, None)  # one call did not say
    assert (result.ttft_p50_ms, result.cache_hit_share) == (None, None)
    assert result.evidence["tokens_out"].model_dump()["reported"] == 1
    no_calls_in_flight = perf(record([model_call(1, 1, completion_tokens=3)]))
    assert no_calls_in_flight.model_time_ms == 0
    assert (no_calls_in_flight.model_concurrency_mean, no_calls_in_flight.tokens_out_per_s) == (
        None,
        None,
    )


def test_intervals_a_little_outside_the_window_are_clipped() -> None:
    result = perf(record([model_call(-0.01, 2)], [tool(9.5, 10.02)]))
    assert result.model_time_ms == pytest.approx(2_000)
    assert result.tool_time_ms == pytest.approx(500)
    assert result.model_time_ms + result.tool_time_ms + result.overhead_time_ms == pytest.approx(
        10_000
    )


@pytest.mark.parametrize(
    ("trajectory", "window", "reason"),
    [
        (record([model_call(1, 2)]), (None, 10.0), "rollout_window_unknown"),
        (record([model_call(1, 2)]), (5.0, 4.0), "rollout_window_unknown"),
        (record([model_call(1, 2)], gaps=("model_call_capture_incomplete",)), (0, 10),
         "capture:model_call_capture_incomplete"),
        (record([], gaps=("model_calls_unavailable",)), (0, 10), "capture:model_calls_unavailable"),
        (record([model_call(1, 2)], invocations=False), (0, 10), "agent_observations_unavailable"),
        (record([model_call(1, 2)], gaps=("tool_timing_unavailable",)), (0, 10),
         "agent:tool_timing_unavailable"),
        (record([model_call(1, None)]), (0, 10), "untimed:model_call 0"),
        (record([model_call(1, 2)], [tool(3, None, "x")]), (0, 10), "untimed:tool_call main/x"),
        (record([model_call(1, 2)], [tool(None, 4, "x")]), (0, 10), "untimed:tool_call main/x"),
        (record([model_call(-0.5, 2)]), (0, 10), "clock:model_call 0 starts 0.500 s before"),
        (record([model_call(1, 2)], [tool(3, 10.2, "x")]), (0, 10),
         "clock:tool_call main/x ends 0.200 s after"),
    ],
)  # fmt: skip
def test_insufficient_evidence_gives_a_reason_and_no_record(
    trajectory: TrajectoryRecord, window: tuple[float | None, float], reason: str
) -> None:
    start = None if window[0] is None else T + window[0]
    derived = derive_perf(trajectory, started_at=start, completed_at=T + window[1])
    assert derived.perf is None
    assert derived.reason is not None and derived.reason.startswith(reason), derived.reason


SPANS = st.tuples(st.floats(-0.04, 10.04), st.floats(0, 5)).map(
    lambda s: (s[0], min(s[0] + s[1], 10.04))
)


@settings(max_examples=200, deadline=None)
@given(st.lists(SPANS, max_size=8), st.lists(SPANS, max_size=5))
def test_the_parts_always_add_up_to_the_wall_time(
    calls: list[tuple[float, float]], tools: list[tuple[float, float]]
) -> None:
    trajectory = record([model_call(s, e) for s, e in calls],
                        [tool(s, e, f"t{i}") for i, (s, e) in enumerate(tools)])  # fmt: skip
    result = perf(trajectory)
    parts = result.model_time_ms + result.tool_time_ms + result.overhead_time_ms
    assert math.isclose(parts, result.wall_time_ms, abs_tol=1e-3)
    assert result.tool_model_overlap_ms <= result.model_time_ms + 1e-6
    assert result.model_concurrency_peak <= len(calls)
    if result.model_time_ms > 0:
        assert 1 - 1e-9 <= result.model_concurrency_mean <= result.model_concurrency_peak + 1e-9
