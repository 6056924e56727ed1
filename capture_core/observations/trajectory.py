"""``ng_trajectory``: one rollout's evidence in one standard record (schema ``"1.0"``).

A :class:`TrajectoryRecord` holds the agent invocations, the semantic turns, the model calls
(payloads, timing, response metadata and token usage) and the tool executions of a rollout,
with every gap in its evidence. It is projected by
:func:`~capture_core.observations.projection.build_trajectory` from the capture, the agent's
observations and any trajectory the agent produced itself. Timestamps are Unix seconds; every
key is written, null where unknown.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field, model_validator

from capture_core.observations._model import StrictModel
from capture_core.observations.bundle import AgentInvocation, ToolCallObservation, check_invocations
from capture_core.observations.gaps import ObservationGap
from capture_core.observations.refs import ModelCallRef, ModelServerRef

__all__ = [
    "SCHEMA_VERSION",
    "TRAJECTORY_KEY",
    "ResponseMetadata",
    "TrajectoryModelCall",
    "TrajectoryRecord",
    "TrajectoryTokenStats",
    "TrajectoryToolCall",
    "TrajectoryTurn",
]

SCHEMA_VERSION: Final = "1.0"
TRAJECTORY_KEY: Final = "ng_trajectory"


class ResponseMetadata(StrictModel):
    """What the server said about a call besides its payload."""

    response_id: str | None = None
    model_ref: ModelServerRef | None = None
    model: str | None = None
    dialect: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    error_category: str | None = None
    latency_ttft_ms: float | None = Field(default=None, ge=0)


class TrajectoryTokenStats(StrictModel):
    """A call's token usage as the provider reported it; null means not reported."""

    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)


class TrajectoryModelCall(StrictModel):
    """One model call: payloads (JSON, or the raw text), timing, metadata and tokens.

    ``request`` / ``response`` are null when the row's multimodal history was redacted.
    """

    model_call_id: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: float | None = Field(default=None, ge=0)
    request: Any = None
    response: Any = None
    response_metadata: ResponseMetadata = Field(default_factory=ResponseMetadata)
    token_stats: TrajectoryTokenStats = Field(default_factory=TrajectoryTokenStats)


class TrajectoryTurn(StrictModel):
    """One semantic turn of an invocation: a question, the answer and the calls it took."""

    invocation_id: str
    task_id: str
    rollout_id: str
    turn_no: int = Field(ge=1)
    timestamp: float
    question: str | None = None
    answer: str | None = None
    reasoning_content: str | None = None
    resolved: bool | None = None
    step_count: int = Field(default=0, ge=0)
    model_calls: list[ModelCallRef] = Field(default_factory=list)


class TrajectoryToolCall(ToolCallObservation):
    """A tool execution, with the output its invocation's conversation sent back."""

    output: Any = None


class TrajectoryRecord(StrictModel):
    """The ``ng_trajectory`` of one rollout.

    Example:
        >>> TrajectoryRecord(task_id="q1", rollout_id="0-0").schema_version
        '1.0'
    """

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    task_id: str
    rollout_id: str
    invocations: list[AgentInvocation] = Field(default_factory=list)
    turns: list[TrajectoryTurn] = Field(default_factory=list)
    model_calls: list[TrajectoryModelCall] = Field(default_factory=list)
    tool_calls: list[TrajectoryToolCall] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> TrajectoryRecord:
        check_invocations(self.invocations)
        ids = [call.model_call_id for call in self.model_calls if call.model_call_id is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("model_call_id must be unique within a trajectory")
        turns: set[tuple[str, int]] = set()
        for turn in self.turns:
            if (turn.task_id, turn.rollout_id) != (self.task_id, self.rollout_id):
                raise ValueError(f"turn {turn.turn_no} of {turn.invocation_id!r} belongs to "
                                 f"task {turn.task_id!r}, rollout {turn.rollout_id!r}")  # fmt: skip
            if (turn.invocation_id, turn.turn_no) in turns:
                raise ValueError(f"turn {turn.turn_no} of {turn.invocation_id!r} is repeated")
            turns.add((turn.invocation_id, turn.turn_no))
        return self
