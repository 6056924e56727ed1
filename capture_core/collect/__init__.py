"""Rollout collection: run rollouts through the capture server and attach their evidence.

* :func:`collect` / :class:`CollectConfig`: the collection loop behind ``ngcapture collect``.
* :class:`SimpleAgent`, and for custom agents :func:`rollout_base_url` and
  :func:`rollout_id_from_body`.
* :func:`capture_attachment`, :func:`project_trajectory`, :func:`capture_fields`: the
  ``ng_model_call_capture`` and ``ng_trajectory`` fields of a rollout record.
* :func:`plan_attempts`, :func:`clear_rollouts`: resume attempts and clearing before dispatch.
"""

from capture_core.collect.agent import (
    TOOLS,
    Agent,
    SimpleAgent,
    Tool,
    rollout_base_url,
    rollout_id_from_body,
    run_tool,
    task_prompt,
)
from capture_core.collect.attachment import DEFAULT_DRAIN_TIMEOUT_S, capture_attachment
from capture_core.collect.attempts import (
    CLEARED_DIR,
    DEFAULT_MAX_ATTEMPTS,
    AttemptPlan,
    BadLine,
    ClearReport,
    CollectError,
    ResumeState,
    clear_rollouts,
    expand_rows,
    failures_path,
    load_resume_state,
    plan_attempts,
    read_jsonl_rows,
    rollout_ids,
)
from capture_core.collect.grader import grade, parse_answer
from capture_core.collect.runner import EXAMPLE_TASKS, CollectConfig, CollectSummary, collect
from capture_core.collect.trajectory import (
    SCHEMA_VERSION,
    TRAJECTORY_KEY,
    TrajectoryRecord,
    capture_fields,
    project_trajectory,
)

__all__ = [
    "CLEARED_DIR",
    "DEFAULT_DRAIN_TIMEOUT_S",
    "DEFAULT_MAX_ATTEMPTS",
    "EXAMPLE_TASKS",
    "SCHEMA_VERSION",
    "TOOLS",
    "TRAJECTORY_KEY",
    "Agent",
    "AttemptPlan",
    "BadLine",
    "ClearReport",
    "CollectConfig",
    "CollectError",
    "CollectSummary",
    "ResumeState",
    "SimpleAgent",
    "Tool",
    "TrajectoryRecord",
    "capture_attachment",
    "capture_fields",
    "clear_rollouts",
    "collect",
    "expand_rows",
    "failures_path",
    "grade",
    "load_resume_state",
    "parse_answer",
    "plan_attempts",
    "project_trajectory",
    "read_jsonl_rows",
    "rollout_base_url",
    "rollout_id_from_body",
    "rollout_ids",
    "run_tool",
    "task_prompt",
]
