"""Agent-side frames: invocations, tool executions, compactions and sandboxes of each rollout.

They come from the rollout records' ``ng_trajectory`` (invocations and tool executions, after
the collector's join) and ``ng_agent_observations`` (compactions and sandboxes, which the
trajectory does not carry). A rollout without that evidence has no rows here.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from ngcapture_viz.frames._columns import UTC_TIME, Column, FrameSchema

__all__ = ["COMPACTIONS", "INVOCATIONS", "SANDBOXES", "TOOL_EXECUTIONS"]

_INT = pl.Int64()
_STR = pl.String()
_FLOAT = pl.Float64()
_CAT = pl.Categorical()

INVOCATIONS: Final = FrameSchema(
    "invocations",
    [
        Column("run", _CAT, "The run's label."),
        Column("rollout_id", _STR, "The rollout."),
        Column("invocation_id", _STR, "The agent or sub-agent conversation (the agent's id)."),
        Column("parent_invocation_id", _STR, "The invocation that started it (null: a root)."),
        Column("spawned_by_tool_call_id", _STR, "The parent's tool call that started it."),
        Column("depth", _INT, "0 for a root, parent's depth + 1 (null: a parent not observed)."),
        Column("status", _CAT, "completed, failed, incomplete or unknown, as the agent said."),
        Column("duration_ms", _FLOAT, "How long it ran, as the agent measured it."),
        Column("error_type", _STR, "Why it failed, when it did."),
        Column("num_model_calls", _INT, "Model calls it referenced."),
        Column(
            "model_call_ids",
            pl.List(_STR),
            "The captured calls it owns (null entry: a reference the join could not resolve).",
        ),
        Column("num_tool_calls", _INT, "Tool executions it reported."),
    ],
)

TOOL_EXECUTIONS: Final = FrameSchema(
    "tool_executions",
    [
        Column("run", _CAT, "The run's label."),
        Column("rollout_id", _STR, "The rollout."),
        Column("invocation_id", _STR, "The invocation that ran the tool."),
        Column("tool_call_id", _STR, "The tool call's id (what the model's request named)."),
        Column("tool_name", _CAT, "Tool name."),
        Column("started_at", UTC_TIME, "When the tool started (UTC), per `timing_source`."),
        Column("completed_at", UTC_TIME, "When it ended (UTC)."),
        Column("duration_ms", _FLOAT, "How long it ran."),
        Column("timing_source", _CAT, "Who measured the times: executor, artifact or harness."),
        Column("status", _CAT, "completed, failed, timeout, cancelled, incomplete or unknown."),
        Column("error_type", _STR, "Why it failed, when it did."),
        Column("sandbox_id", _STR, "Where it ran, when the agent said."),
        Column(
            "requested_by_model_call_id",
            _STR,
            "The captured call whose response asked for this tool call (by `tool_call_id`).",
        ),
    ],
)

COMPACTIONS: Final = FrameSchema(
    "compactions",
    [
        Column("run", _CAT, "The run's label."),
        Column("rollout_id", _STR, "The rollout."),
        Column("invocation_id", _STR, "The invocation whose context was compacted."),
        Column("observed_at", UTC_TIME, "When (UTC)."),
        Column("trigger", _STR, "Why, as the agent said (e.g. `auto`, `manual`)."),
        Column("tokens_before", _INT, "Context tokens before, as reported."),
        Column("tokens_after", _INT, "Context tokens after, as reported."),
        Column("outcome", _CAT, "completed, failed, aborted or unknown."),
        Column("before_model_call_id", _STR, "The last call before it (when joined)."),
        Column("after_model_call_id", _STR, "The first call after it (when joined)."),
    ],
)

SANDBOXES: Final = FrameSchema(
    "sandboxes",
    [
        Column("run", _CAT, "The run's label."),
        Column("rollout_id", _STR, "The rollout."),
        Column("role", _CAT, "agent, verifier or environment."),
        Column("provider", _STR, "Who provided it."),
        Column("sandbox_id", _STR, "Its id (tool executions name it)."),
        Column("outcome", _CAT, "completed, failed, timeout, oom, sandbox_error, cancelled..."),
        Column("exit_code", _INT, "Its exit code."),
        Column("wall_time_s", _FLOAT, "Wall time it ran."),
        Column("cpu_time_s", _FLOAT, "CPU time it used."),
        Column("peak_memory_mib", _FLOAT, "Peak memory."),
        Column("resource_usage_source", _STR, "Where the usage figures came from."),
        Column("error_type", _STR, "Why it failed, when it did."),
    ],
)
