"""Build an agent's ``ng_agent_observations`` while it runs.

An agent that sends its model calls through the capture server can record, as it goes, its
invocations (root and sub-agents), the model calls each made (by the model server and the
``response_id`` it saw), and each tool execution with the times its executor measured::

    recorder = ObservationRecorder("my_agent")
    main = recorder.invocation("main")
    main.model_call(response_id=response.id)
    main.tool_call("call_1", tool_name="lookup", started_at=t0, completed_at=t1,
                   status="completed", timing_source="executor")
    main.finish("completed", conversation=items)
    result["ng_agent_observations"] = recorder.to_json()

The collector joins the references to the captured calls exactly (see
:func:`~capture_core.observations.join.join_model_call_observations`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from capture_core.observations.bundle import (
    AgentInvocation,
    AgentObservationBundle,
    InvocationStatus,
    TimingSource,
    ToolCallObservation,
    ToolStatus,
)
from capture_core.observations.gaps import ObservationGap
from capture_core.observations.refs import ModelCallRef, ModelServerRef
from capture_core.records import DEFAULT_MODEL_REF_TYPE

__all__ = ["InvocationRecorder", "ObservationRecorder"]


class InvocationRecorder:
    """One invocation being recorded; its duration runs from creation to :meth:`finish`."""

    def __init__(self, owner: ObservationRecorder, invocation: AgentInvocation) -> None:
        self._owner = owner
        self._started = time.perf_counter()
        self.record = invocation

    @property
    def invocation_id(self) -> str:
        return self.record.invocation_id

    @property
    def model_calls(self) -> list[ModelCallRef]:
        """The references recorded so far."""
        return list(self.record.model_calls)

    def model_call(
        self, *, response_id: str | None = None, model_call_id: str | None = None
    ) -> ModelCallRef:
        """Record a model call this invocation made, by the response id it saw (or call id).

        Raises:
            ValueError: neither is given.
        """
        ref = ModelCallRef(model_call_id=model_call_id, model_ref=self._owner.model_ref,
                           response_id=response_id)  # fmt: skip
        with self._owner.lock:
            self.record.model_calls.append(ref)
        return ref

    def tool_call(
        self,
        tool_call_id: str,
        *,
        tool_name: str | None = None,
        started_at: float | None = None,
        completed_at: float | None = None,
        status: ToolStatus = "unknown",
        timing_source: TimingSource | None = None,
        error_type: str | None = None,
        sandbox_id: str | None = None,
    ) -> ToolCallObservation:
        """Record one tool execution of this invocation."""
        duration = None
        if started_at is not None and completed_at is not None:
            duration = max(0.0, (completed_at - started_at) * 1000)
        observation = ToolCallObservation(
            invocation_id=self.invocation_id, tool_call_id=tool_call_id, tool_name=tool_name,
            started_at=started_at, completed_at=completed_at, duration_ms=duration,
            timing_source=timing_source, status=status, error_type=error_type,
            sandbox_id=sandbox_id,
        )  # fmt: skip
        with self._owner.lock:
            self._owner.tools.append(observation)
        return observation

    def finish(
        self,
        status: InvocationStatus,
        *,
        conversation: Sequence[dict[str, Any]] = (),
        error_type: str | None = None,
    ) -> None:
        """Close the invocation: its outcome, duration and conversation (Responses items)."""
        duration = (time.perf_counter() - self._started) * 1000
        with self._owner.lock:
            data = {**self.record.model_dump(), "status": status, "duration_ms": duration,
                    "error_type": error_type, "conversation": list(conversation)}  # fmt: skip
            self.record = AgentInvocation.model_validate(data)


class ObservationRecorder:
    """Collects one rollout's observations (thread-safe); :meth:`bundle` validates them.

    Args:
        source: the producer's name, written as the bundle's ``source``.
        model_server: the name of the model server the calls go to (capture's ``model_ref``).

    Example:
        >>> recorder = ObservationRecorder("my_agent")
        >>> recorder.invocation("main").model_call(response_id="resp_1").response_id
        'resp_1'
    """

    def __init__(self, source: str, *, model_server: str = "policy_model") -> None:
        self.source = source
        self.model_ref = ModelServerRef(type=DEFAULT_MODEL_REF_TYPE, name=model_server)
        self.lock = threading.Lock()
        self.invocations: list[InvocationRecorder] = []
        self.tools: list[ToolCallObservation] = []
        self.gaps: list[ObservationGap] = []

    def invocation(
        self,
        invocation_id: str,
        *,
        parent_invocation_id: str | None = None,
        spawned_by_tool_call_id: str | None = None,
    ) -> InvocationRecorder:
        """Start recording an invocation (a sub-agent names its parent and spawning call)."""
        record = AgentInvocation(invocation_id=invocation_id,
                                 parent_invocation_id=parent_invocation_id,
                                 spawned_by_tool_call_id=spawned_by_tool_call_id)  # fmt: skip
        recorder = InvocationRecorder(self, record)
        with self.lock:
            self.invocations.append(recorder)
        return recorder

    def gap(
        self, code: str, *, detail: str | None = None, invocation_id: str | None = None
    ) -> None:
        """Record evidence the agent could not observe."""
        with self.lock:
            self.gaps.append(ObservationGap(code=code, invocation_id=invocation_id, detail=detail))

    def bundle(self) -> AgentObservationBundle:
        """The observations so far, validated (unique invocation ids, no parent cycle)."""
        with self.lock:
            records = [*(i.record for i in self.invocations), *self.tools]
            return AgentObservationBundle(source=self.source, records=records, gaps=list(self.gaps))

    def to_json(self) -> dict[str, Any]:
        """:meth:`bundle` as the JSON value of ``ng_agent_observations``."""
        return self.bundle().model_dump(mode="json")
