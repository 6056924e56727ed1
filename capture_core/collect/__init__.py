"""Rollout collection: run rollouts through the capture server and attach their evidence.

* :func:`collect` / :class:`CollectConfig`: the collection loop behind ``ngcapture collect``.
* :class:`SimpleAgent`, and for custom agents :func:`rollout_base_url` and
  :func:`rollout_id_from_body`; :func:`task_request` turns a task row (NeMo Gym
  ``responses_create_params``, a multiple-choice question, a prompt) into a request;
  :func:`chat_request` and :func:`messages_request` translate it for Chat Completions and
  Anthropic Messages.
* :func:`capture_attachment`, :func:`capture_fields`, :func:`project_trajectory`: the
  ``ng_model_call_capture``, ``ng_agent_observations``, ``ng_trajectory`` and ``ng_perf``
  fields of a rollout record.
* :func:`plan_attempts`, :func:`clear_rollouts`: resume attempts and clearing before dispatch.
"""

from capture_core.collect.agent import (
    DELEGATE,
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
    DEFAULT_MAX_ATTEMPTS,
    AttemptPlan,
    BadLine,
    CollectError,
    ResumeState,
    expand_rows,
    failures_path,
    load_resume_state,
    plan_attempts,
    read_jsonl_rows,
    rollout_ids,
)
from capture_core.collect.clearing import CLEARED_DIR, ClearReport, clear_rollouts
from capture_core.collect.grader import grade, parse_answer
from capture_core.collect.mcqa import extract_answer, grade_mcqa
from capture_core.collect.messages_request import (
    DEFAULT_MAX_TOKENS,
    MessagesRequest,
    messages_request,
)
from capture_core.collect.runner import EXAMPLE_TASKS, CollectConfig, CollectSummary, collect
from capture_core.collect.tasks import TaskRequest, TaskRowError, chat_request, task_request
from capture_core.collect.tools import ToolExecution, execute_tool
from capture_core.collect.trajectory import (
    EVIDENCE_KEYS,
    SCHEMA_VERSION,
    TRAJECTORY_KEY,
    TrajectoryRecord,
    attach_evidence,
    capture_fields,
    project_trajectory,
)

__all__ = [
    "CLEARED_DIR",
    "DEFAULT_DRAIN_TIMEOUT_S",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_TOKENS",
    "DELEGATE",
    "EVIDENCE_KEYS",
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
    "MessagesRequest",
    "ResumeState",
    "SimpleAgent",
    "TaskRequest",
    "TaskRowError",
    "Tool",
    "ToolExecution",
    "TrajectoryRecord",
    "attach_evidence",
    "capture_attachment",
    "capture_fields",
    "chat_request",
    "clear_rollouts",
    "collect",
    "execute_tool",
    "expand_rows",
    "extract_answer",
    "failures_path",
    "grade",
    "grade_mcqa",
    "load_resume_state",
    "messages_request",
    "parse_answer",
    "plan_attempts",
    "project_trajectory",
    "read_jsonl_rows",
    "rollout_base_url",
    "rollout_id_from_body",
    "rollout_ids",
    "run_tool",
    "task_prompt",
    "task_request",
]
