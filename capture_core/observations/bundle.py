"""``ng_agent_observations``: what an agent harness saw of its own rollout.

An :class:`AgentObservationBundle` holds records of four kinds, told apart by ``kind``:

* ``agent_invocation`` (:class:`AgentInvocation`): one root agent or sub-agent conversation,
  its outcome, the model calls it made and its conversation as Responses input items;
* ``tool_call`` (:class:`ToolCallObservation`): one tool execution and when it ran;
* ``context_compaction`` (:class:`ContextCompaction`): the agent shortened its context;
* ``sandbox`` (:class:`SandboxObservation`): an execution environment and what it used.

Records are unordered. The bundle refuses unknown keys, repeated invocation ids, a cycle of
``parent_invocation_id`` links (a missing parent is allowed) and ``kind: "turn"`` (turns belong
to ``ng_trajectory``). Timestamps are Unix seconds, like the capture line's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from capture_core.observations._model import StrictModel
from capture_core.observations.gaps import ObservationGap
from capture_core.observations.refs import ModelCallRef

__all__ = [
    "OBSERVATIONS_KEY",
    "AgentInvocation",
    "AgentObservationBundle",
    "ContextCompaction",
    "ObservationRecord",
    "SandboxObservation",
    "ToolCallObservation",
]

OBSERVATIONS_KEY: Final = "ng_agent_observations"

InvocationStatus = Literal["completed", "failed", "incomplete", "unknown"]
ToolStatus = Literal["completed", "failed", "timeout", "cancelled", "incomplete", "unknown"]
TimingSource = Literal["executor", "artifact", "harness"]
CompactionOutcome = Literal["completed", "failed", "aborted", "unknown"]
SandboxRole = Literal["agent", "verifier", "environment"]
SandboxOutcome = Literal[
    "completed", "failed", "timeout", "oom", "sandbox_error", "cancelled", "unknown"
]
NonNegative = Annotated[float, Field(ge=0)]


class AgentInvocation(StrictModel):
    """One root agent or sub-agent conversation.

    ``model_calls`` names the calls it made; ``conversation`` is its history as Responses
    input items (messages, ``function_call``, ``function_call_output``...).
    """

    kind: Literal["agent_invocation"] = "agent_invocation"
    invocation_id: str
    parent_invocation_id: str | None = None
    spawned_by_tool_call_id: str | None = None
    status: InvocationStatus = "unknown"
    duration_ms: NonNegative | None = None
    error_type: str | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    conversation: list[dict[str, Any]] = Field(default_factory=list)

    @field_validator("conversation")
    @classmethod
    def _items(cls, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, item in enumerate(items):
            if not isinstance(item.get("type"), str) and not isinstance(item.get("role"), str):
                raise ValueError(f"conversation item {index} has neither a 'type' nor a 'role'")
        return items


class ToolCallObservation(StrictModel):
    """One tool execution of an invocation, timed where it ran.

    ``timing_source`` says who measured ``started_at`` / ``completed_at``: the tool
    ``executor`` itself, an ``artifact`` read afterwards, or the agent ``harness`` around it.
    """

    kind: Literal["tool_call"] = "tool_call"
    invocation_id: str
    tool_call_id: str
    sandbox_id: str | None = None
    tool_name: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: NonNegative | None = None
    timing_source: TimingSource | None = None
    status: ToolStatus = "unknown"
    error_type: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> ToolCallObservation:
        started, completed = self.started_at, self.completed_at
        if started is not None and completed is not None and completed < started:
            raise ValueError("completed_at must not be earlier than started_at")
        return self


class ContextCompaction(StrictModel):
    """The agent compacted its context: when, why, how much, and around which model calls."""

    kind: Literal["context_compaction"] = "context_compaction"
    invocation_id: str
    observed_at: float | None = None
    trigger: str | None = None
    tokens_before: int | None = Field(default=None, ge=0)
    tokens_after: int | None = Field(default=None, ge=0)
    outcome: CompactionOutcome = "unknown"
    summary: str | None = None
    first_kept_item_id: str | None = None
    before_model_call: ModelCallRef | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    after_model_call: ModelCallRef | None = None


class SandboxObservation(StrictModel):
    """An execution environment of the rollout and the resources it used."""

    kind: Literal["sandbox"] = "sandbox"
    role: SandboxRole
    provider: str | None = None
    sandbox_id: str | None = None
    outcome: SandboxOutcome = "unknown"
    exit_code: int | None = None
    wall_time_s: NonNegative | None = None
    cpu_time_s: NonNegative | None = None
    peak_memory_mib: NonNegative | None = None
    resource_usage_source: str | None = None
    error_type: str | None = None


ObservationRecord = Annotated[
    AgentInvocation | ToolCallObservation | ContextCompaction | SandboxObservation,
    Field(discriminator="kind"),
]


def check_invocations(invocations: list[AgentInvocation]) -> None:
    """Raise ``ValueError`` on a repeated invocation id or a cycle of parent links."""
    parents: dict[str, str | None] = {}
    for invocation in invocations:
        if invocation.invocation_id in parents:
            raise ValueError(f"invocation id {invocation.invocation_id!r} is not unique")
        parents[invocation.invocation_id] = invocation.parent_invocation_id
    for start, first_parent in parents.items():
        seen = {start}
        parent = first_parent
        while parent is not None and parent in parents:
            if parent in seen:
                raise ValueError(f"invocation {start!r} is its own ancestor (a parent cycle)")
            seen.add(parent)
            parent = parents[parent]


class AgentObservationBundle(StrictModel):
    """The ``ng_agent_observations`` of one rollout.

    Example:
        >>> bundle = AgentObservationBundle.model_validate({"source": "my_agent", "records": [
        ...     {"kind": "agent_invocation", "invocation_id": "main"}]})
        >>> [i.invocation_id for i in bundle.invocations()]
        ['main']
    """

    source: str
    records: list[ObservationRecord] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _no_turns(cls, data: Any) -> Any:
        records = data.get("records") if isinstance(data, Mapping) else None
        for record in records if isinstance(records, list) else ():
            if isinstance(record, Mapping) and record.get("kind") == "turn":
                raise ValueError("kind 'turn' is not an observation: turns go in ng_trajectory")
        return data

    @model_validator(mode="after")
    def _invocation_graph(self) -> AgentObservationBundle:
        check_invocations(list(self.invocations()))
        return self

    def invocations(self) -> Iterator[AgentInvocation]:
        """The ``agent_invocation`` records, in record order."""
        return (r for r in self.records if isinstance(r, AgentInvocation))

    def tool_calls(self) -> Iterator[ToolCallObservation]:
        """The ``tool_call`` records, in record order."""
        return (r for r in self.records if isinstance(r, ToolCallObservation))

    def compactions(self) -> Iterator[ContextCompaction]:
        """The ``context_compaction`` records, in record order."""
        return (r for r in self.records if isinstance(r, ContextCompaction))

    def sandboxes(self) -> Iterator[SandboxObservation]:
        """The ``sandbox`` records, in record order."""
        return (r for r in self.records if isinstance(r, SandboxObservation))
