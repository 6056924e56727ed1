"""``ng_perf``: where a rollout's wall time went, derived only from evidence that suffices.

The rollout's window (the collector's clock around the agent's run) is split into disjoint
parts by a sweep over the captured model calls and the observed tool executions:

* ``model_time_ms``: at least one model call in flight (whatever else runs);
* ``tool_time_ms``: a tool executing and no model call in flight;
* ``overhead_time_ms``: neither (the harness's own time, queueing, the network to the server);

so ``model + tool + overhead == wall`` by definition. ``tool_model_overlap_ms`` is the tool time
hidden under model time (a sub-agent's calls inside the tool that spawned it, a tool run in
parallel with a call). Per-call figures come from the capture: model-call concurrency (peak,
and mean over the time with a call in flight), output tokens per second of model time, the
median time to first token and the share of prompt tokens served from the provider's cache.
``evidence`` says, per figure, which evidence it came from and how many calls reported it.

:func:`derive_perf` returns no record, but the reason, when the evidence does not suffice: no
window, a capture that misses calls or times, no agent-side account of the tools (so tool time
is unknown), a tool execution without times, or an interval outside the window by more than the
clock tolerance (clocks that disagree). Null means unknown, never 0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from pydantic import Field

from capture_core.observations._model import StrictModel
from capture_core.observations.trajectory import (
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryToolCall,
)
from capture_core.records import GapCode

__all__ = [
    "DEFAULT_CLOCK_TOLERANCE_S",
    "PERF_KEY",
    "PERF_SCHEMA_VERSION",
    "PerfDerivation",
    "PerfEvidence",
    "RolloutPerf",
    "derive_perf",
]

PERF_KEY: Final = "ng_perf"
PERF_SCHEMA_VERSION: Final = "1"
DEFAULT_CLOCK_TOLERANCE_S: Final = 0.05

#: Capture gaps after which the captured calls are not all of the rollout's calls.
_CAPTURE_MISSING: Final = (
    GapCode.MODEL_CALL_CAPTURE_NO_RECORDS,
    GapCode.MODEL_CALL_CAPTURE_RECORDS_UNREADABLE,
    GapCode.MODEL_CALL_CAPTURE_INCOMPLETE,
    GapCode.MODEL_CALL_CAPTURE_UNREADABLE,
    GapCode.MODEL_CALL_CAPTURE_PENDING,
    GapCode.MODEL_CALL_CAPTURE_LOST,
    GapCode.MODEL_CALL_CAPTURE_FAILED,
    GapCode.MODEL_CALLS_UNAVAILABLE,
)
#: Agent-side gaps after which the tool executions are not all known and timed.
_TOOLS_MISSING: Final = (
    GapCode.AGENT_OBSERVATIONS_INVALID,
    GapCode.PRODUCER_TRAJECTORY_INVALID,
    GapCode.TOOL_TIMING_UNAVAILABLE,
)
WINDOW: Final = "collector_clock"
CALL_TIMES: Final = "capture_timestamps"
USAGE: Final = "capture_usage"
TTFT: Final = "capture_ttft"
INVOCATIONS: Final = "agent_invocations"


class PerfEvidence(StrictModel):
    """Where a figure came from: evidence tags, and how many calls reported its input."""

    sources: list[str]
    reported: int | None = Field(default=None, ge=0)
    of: int | None = Field(default=None, ge=0)


class RolloutPerf(StrictModel):
    """The ``ng_perf`` of one rollout (schema ``"1"``); times in milliseconds."""

    schema_version: Literal["1"] = PERF_SCHEMA_VERSION
    started_at: float
    completed_at: float
    wall_time_ms: float = Field(ge=0)
    model_time_ms: float = Field(ge=0)
    tool_time_ms: float = Field(ge=0)
    overhead_time_ms: float = Field(ge=0)
    tool_model_overlap_ms: float = Field(ge=0)
    model_calls: int = Field(ge=0)
    tool_calls: int = Field(ge=0)
    model_concurrency_peak: int = Field(ge=0)
    model_concurrency_mean: float | None = Field(default=None, ge=0)
    tokens_out: int | None = Field(default=None, ge=0)
    tokens_out_per_s: float | None = Field(default=None, ge=0)
    ttft_p50_ms: float | None = Field(default=None, ge=0)
    cache_hit_share: float | None = Field(default=None, ge=0, le=1)
    evidence: dict[str, PerfEvidence]


@dataclass(frozen=True, slots=True)
class PerfDerivation:
    """The record, or (``perf`` None) why the evidence does not suffice."""

    perf: RolloutPerf | None
    reason: str | None = None


@dataclass(slots=True)
class _Sweep:
    """Seconds of each part of the window, and the in-flight count integral and peak."""

    model: float = 0.0
    tool: float = 0.0
    overlap: float = 0.0
    overhead: float = 0.0
    in_flight: float = 0.0  # integral of the number of model calls in flight
    peak: int = 0

    def add(self, seconds: float, calls: int, tools: int) -> None:
        if seconds <= 0:
            return
        if calls:
            self.model += seconds
            self.in_flight += calls * seconds
            self.overlap += seconds if tools else 0.0
        elif tools:
            self.tool += seconds
        else:
            self.overhead += seconds


Interval = tuple[float, float]


def derive_perf(
    trajectory: TrajectoryRecord,
    *,
    started_at: float | None,
    completed_at: float | None,
    clock_tolerance_s: float = DEFAULT_CLOCK_TOLERANCE_S,
) -> PerfDerivation:
    """The ``ng_perf`` of a rollout from its trajectory and its window, when they suffice.

    Args:
        trajectory: the rollout's projected ``ng_trajectory`` (its gaps say what is missing).
        started_at, completed_at: the rollout's window, Unix seconds (None: unknown).
        clock_tolerance_s: how far an interval may stick out of the window (it is clipped);
            further out, the clocks disagree and nothing is derived.

    Example:
        >>> derive_perf(trajectory, started_at=t0, completed_at=t1).perf.wall_time_ms
        ...  # doctest: +SKIP
        812.4
    """
    if started_at is None or completed_at is None or completed_at < started_at:
        return PerfDerivation(None, "rollout_window_unknown")
    codes = {gap.code for gap in trajectory.gaps}
    for code in _CAPTURE_MISSING:
        if code in codes:
            return PerfDerivation(None, f"capture:{code}")
    calls, tools = trajectory.model_calls, trajectory.tool_calls
    if not trajectory.invocations:
        return PerfDerivation(None, "agent_observations_unavailable")
    for code in _TOOLS_MISSING:
        if code in codes:
            return PerfDerivation(None, f"agent:{code}")
    window = (started_at, completed_at)
    tolerance = clock_tolerance_s
    try:
        model = [
            _interval(c.started_at, c.completed_at, window, tolerance, _call_name(c, i))
            for i, c in enumerate(calls)
        ]
        tool = [
            _interval(t.started_at, t.completed_at, window, tolerance, _tool_name(t)) for t in tools
        ]
    except _Insufficient as exc:
        return PerfDerivation(None, str(exc))
    return PerfDerivation(_perf(window, calls, tools, model, tool))


class _Insufficient(Exception):
    """An interval that cannot be used (untimed, or outside the window)."""


def _interval(
    start: float | None, end: float | None, window: Interval, tolerance: float, name: str
) -> Interval:
    if start is None or end is None:
        raise _Insufficient(f"untimed:{name}")
    if start < window[0] - tolerance:
        raise _Insufficient(f"clock:{name} starts {window[0] - start:.3f} s before the rollout")
    if end > window[1] + tolerance:
        raise _Insufficient(f"clock:{name} ends {end - window[1]:.3f} s after the rollout")
    low = min(max(start, window[0]), window[1])
    return low, min(max(end, low), window[1])


def _call_name(call: TrajectoryModelCall, position: int) -> str:
    return f"model_call {call.model_call_id or call.response_metadata.response_id or position}"


def _tool_name(tool: TrajectoryToolCall) -> str:
    return f"tool_call {tool.invocation_id}/{tool.tool_call_id}"


def _sweep(window: Interval, model: Sequence[Interval], tool: Sequence[Interval]) -> _Sweep:
    events = [(s, 1, 0) for s, _ in model] + [(e, -1, 0) for _, e in model]
    events += [(s, 0, 1) for s, _ in tool] + [(e, 0, -1) for _, e in tool]
    events.sort(key=lambda event: event[0])
    sweep = _Sweep()
    calls = tools = 0
    previous = window[0]
    for time, group in itertools.groupby(events, key=lambda event: event[0]):
        sweep.add(time - previous, calls, tools)
        for _, call_step, tool_step in group:
            calls, tools = calls + call_step, tools + tool_step
        sweep.peak = max(sweep.peak, calls)
        previous = time
    sweep.add(window[1] - previous, calls, tools)
    return sweep


def _perf(
    window: Interval,
    calls: Sequence[TrajectoryModelCall],
    tools: Sequence[TrajectoryToolCall],
    model: Sequence[Interval],
    tool: Sequence[Interval],
) -> RolloutPerf:
    sweep = _sweep(window, model, tool)
    timing = sorted({f"tool_timestamps:{t.timing_source or 'unspecified'}" for t in tools})
    outs = [c.token_stats.completion_tokens for c in calls]
    reported_outs = [n for n in outs if n is not None]
    tokens_out = sum(reported_outs) if outs and len(reported_outs) == len(outs) else None
    ttfts = sorted(x for c in calls if (x := c.response_metadata.latency_ttft_ms) is not None)
    cache = [(c.token_stats.cached_tokens, c.token_stats.prompt_tokens) for c in calls
             if c.token_stats.cached_tokens is not None
             and c.token_stats.prompt_tokens is not None]  # fmt: skip
    prompt = sum(p for _, p in cache)
    n = len(calls)
    everything = [WINDOW, CALL_TIMES, INVOCATIONS, *timing]

    def evidence(*sources: str, reported: int | None = None) -> PerfEvidence:
        return PerfEvidence(sources=list(sources), reported=reported,
                            of=None if reported is None else n)  # fmt: skip

    return RolloutPerf(
        started_at=window[0],
        completed_at=window[1],
        wall_time_ms=(window[1] - window[0]) * 1000,
        model_time_ms=sweep.model * 1000,
        tool_time_ms=sweep.tool * 1000,
        overhead_time_ms=sweep.overhead * 1000,
        tool_model_overlap_ms=sweep.overlap * 1000,
        model_calls=n,
        tool_calls=len(tools),
        model_concurrency_peak=sweep.peak,
        model_concurrency_mean=sweep.in_flight / sweep.model if sweep.model > 0 else None,
        tokens_out=tokens_out,
        tokens_out_per_s=(
            tokens_out / sweep.model if tokens_out is not None and sweep.model > 0 else None
        ),
        ttft_p50_ms=ttfts[max(0, math.ceil(0.5 * len(ttfts)) - 1)] if ttfts else None,
        cache_hit_share=sum(c for c, _ in cache) / prompt if prompt > 0 else None,
        evidence={
            "wall_time_ms": evidence(WINDOW),
            "model_time_ms": evidence(WINDOW, CALL_TIMES, reported=n),
            "tool_time_ms": evidence(WINDOW, CALL_TIMES, INVOCATIONS, *timing),
            "overhead_time_ms": evidence(*everything),
            "tool_model_overlap_ms": evidence(WINDOW, CALL_TIMES, *timing),
            "model_concurrency_peak": evidence(CALL_TIMES, reported=n),
            "model_concurrency_mean": evidence(CALL_TIMES, reported=n),
            "tokens_out": evidence(USAGE, reported=len(reported_outs)),
            "tokens_out_per_s": evidence(USAGE, CALL_TIMES, reported=len(reported_outs)),
            "ttft_p50_ms": evidence(TTFT, reported=len(ttfts)),
            "cache_hit_share": evidence(USAGE, reported=len(cache)),
        },
    )
