"""Agent-side evidence of a rollout, joined with its capture: observations, trajectory, perf.

* :class:`AgentObservationBundle` (``ng_agent_observations``) and its records:
  :class:`AgentInvocation`, :class:`ToolCallObservation`, :class:`ContextCompaction`,
  :class:`SandboxObservation`; :class:`ModelCallRef` names a captured call;
  :class:`ObservationRecorder` builds a bundle while an agent runs.
* :func:`join_model_call_observations`: resolve the references against the captured calls,
  exactly, with a gap for everything it cannot resolve.
* :class:`TrajectoryRecord` (``ng_trajectory``) and :func:`build_trajectory`, which merges the
  agent's own trajectory, its observations and the capture.
* :class:`RolloutPerf` (``ng_perf``) and :func:`derive_perf`: where the wall time went.
"""

from capture_core.observations.bundle import (
    OBSERVATIONS_KEY,
    AgentInvocation,
    AgentObservationBundle,
    ContextCompaction,
    ObservationRecord,
    SandboxObservation,
    ToolCallObservation,
)
from capture_core.observations.gaps import ObservationGap, dedupe_gaps, gap_codes
from capture_core.observations.join import join_model_call_observations
from capture_core.observations.perf import (
    DEFAULT_CLOCK_TOLERANCE_S,
    PERF_KEY,
    PERF_SCHEMA_VERSION,
    PerfDerivation,
    PerfEvidence,
    RolloutPerf,
    derive_perf,
)
from capture_core.observations.projection import (
    TASK_ID_KEYS,
    build_trajectory,
    history_redacted,
    project_call,
    trajectory_rollout_id,
    trajectory_task_id,
    unix_seconds,
)
from capture_core.observations.recorder import InvocationRecorder, ObservationRecorder
from capture_core.observations.refs import ModelCallRef, ModelServerRef, canonical_ref
from capture_core.observations.trajectory import (
    SCHEMA_VERSION,
    TRAJECTORY_KEY,
    ResponseMetadata,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryTokenStats,
    TrajectoryToolCall,
    TrajectoryTurn,
)

__all__ = [
    "DEFAULT_CLOCK_TOLERANCE_S",
    "OBSERVATIONS_KEY",
    "PERF_KEY",
    "PERF_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "TASK_ID_KEYS",
    "TRAJECTORY_KEY",
    "AgentInvocation",
    "AgentObservationBundle",
    "ContextCompaction",
    "InvocationRecorder",
    "ModelCallRef",
    "ModelServerRef",
    "ObservationGap",
    "ObservationRecord",
    "ObservationRecorder",
    "PerfDerivation",
    "PerfEvidence",
    "ResponseMetadata",
    "RolloutPerf",
    "SandboxObservation",
    "ToolCallObservation",
    "TrajectoryModelCall",
    "TrajectoryRecord",
    "TrajectoryTokenStats",
    "TrajectoryToolCall",
    "TrajectoryTurn",
    "build_trajectory",
    "canonical_ref",
    "dedupe_gaps",
    "derive_perf",
    "gap_codes",
    "history_redacted",
    "join_model_call_observations",
    "project_call",
    "trajectory_rollout_id",
    "trajectory_task_id",
    "unix_seconds",
]
