"""Agent-side evidence of rollout records: kept small while reading, turned into frames.

:func:`compact_evidence` keeps, from one record, what the agent frames need and no payload:
the trajectory's invocations (without conversations) and tool executions (without outputs),
its gaps, the observations' compactions and sandboxes, and ``ng_perf``.
:func:`evidence_frames` builds the ``invocations``, ``tool_executions``, ``compactions``,
``sandboxes`` and ``perf`` frames of a run from them. Values of the wrong type read as null.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import orjson
import polars as pl

from capture_core import (
    OBSERVATIONS_KEY,
    PERF_KEY,
    TRAJECTORY_KEY,
    GapCode,
    ModelCallCaptureAttachment,
)
from ngcapture_viz.frames.agent import COMPACTIONS, INVOCATIONS, SANDBOXES, TOOL_EXECUTIONS
from ngcapture_viz.frames.perf import PERF

__all__ = ["EVIDENCE_FRAMES", "compact_evidence", "evidence_frames"]

#: The agent-side frames of a run, in order.
EVIDENCE_FRAMES: Final = ("invocations", "tool_executions", "compactions", "sandboxes", "perf")
_SCHEMAS: Final = {"invocations": INVOCATIONS, "tool_executions": TOOL_EXECUTIONS,
                   "compactions": COMPACTIONS, "sandboxes": SANDBOXES, "perf": PERF}  # fmt: skip


def compact_evidence(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the agent frames need from one rollout record (None: it has no such evidence)."""
    found: dict[str, Any] = {}
    trajectory = row.get(TRAJECTORY_KEY)
    if isinstance(trajectory, Mapping):
        found["invocations"] = [
            {k: v for k, v in item.items() if k != "conversation"}
            for item in _objects(trajectory.get("invocations"))
        ]
        found["tool_calls"] = [
            {k: v for k, v in item.items() if k != "output"}
            for item in _objects(trajectory.get("tool_calls"))
        ]
        found["gaps"] = _objects(trajectory.get("gaps"))
    observations = row.get(OBSERVATIONS_KEY)
    if isinstance(observations, Mapping):
        records = _objects(observations.get("records"))
        found["compactions"] = [r for r in records if r.get("kind") == "context_compaction"]
        found["sandboxes"] = [r for r in records if r.get("kind") == "sandbox"]
    if isinstance(row.get(PERF_KEY), Mapping):
        found["perf"] = row[PERF_KEY]
    return found or None


def evidence_frames(
    label: str | None,
    rollouts: Iterable[tuple[str, Mapping[str, Any], ModelCallCaptureAttachment | None]],
) -> dict[str, pl.DataFrame]:
    """The agent frames of a run from ``(rollout_id, compact evidence, attachment)`` triples.

    Example:
        >>> evidence_frames("r", [])["perf"].height
        0
    """
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in EVIDENCE_FRAMES}
    for rollout_id, evidence, attachment in rollouts:
        base = {"run": label, "rollout_id": rollout_id}
        rows["invocations"] += _invocations(base, evidence)
        rows["tool_executions"] += _tool_executions(base, evidence, _requesters(attachment))
        rows["compactions"] += [_compaction(base, r) for r in evidence.get("compactions", ())]
        rows["sandboxes"] += [_sandbox(base, r) for r in evidence.get("sandboxes", ())]
        perf = _perf(base, evidence)
        if perf is not None:
            rows["perf"].append(perf)
    return {name: _SCHEMAS[name].from_rows(rows[name]) for name in EVIDENCE_FRAMES}


def _invocations(base: dict[str, Any], evidence: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = evidence.get("invocations", ())
    parents = {_str(i.get("invocation_id")): _str(i.get("parent_invocation_id")) for i in items}
    tools: dict[str | None, int] = {}
    for tool in evidence.get("tool_calls", ()):
        key = _str(tool.get("invocation_id"))
        tools[key] = tools.get(key, 0) + 1
    rows = []
    for item in items:
        invocation_id = _str(item.get("invocation_id"))
        refs = _objects(item.get("model_calls"))
        rows.append({**base, "invocation_id": invocation_id,
                     "parent_invocation_id": parents.get(invocation_id),
                     "spawned_by_tool_call_id": _str(item.get("spawned_by_tool_call_id")),
                     "depth": _depth(invocation_id, parents),
                     "status": _str(item.get("status")),
                     "duration_ms": _float(item.get("duration_ms")),
                     "error_type": _str(item.get("error_type")),
                     "num_model_calls": len(refs),
                     "model_call_ids": [_str(r.get("model_call_id")) for r in refs],
                     "num_tool_calls": tools.get(invocation_id, 0)})  # fmt: skip
    return rows


def _depth(invocation_id: str | None, parents: Mapping[str | None, str | None]) -> int | None:
    depth, seen, current = 0, {invocation_id}, parents.get(invocation_id)
    while current is not None:
        if current not in parents or current in seen:
            return None  # a parent that was not observed (or a cycle: not a valid bundle)
        seen.add(current)
        depth, current = depth + 1, parents[current]
    return depth


def _requesters(attachment: ModelCallCaptureAttachment | None) -> dict[str, str | None]:
    """Tool call id -> the captured call whose response asked for it."""
    found: dict[str, str | None] = {}
    for call in attachment.calls if attachment is not None else ():
        for tool in call.tool_calls:
            if tool.call_id is not None:
                found.setdefault(tool.call_id, call.model_call_id)
    return found


def _tool_executions(
    base: dict[str, Any], evidence: Mapping[str, Any], requesters: Mapping[str, str | None]
) -> list[dict[str, Any]]:
    rows = []
    for item in evidence.get("tool_calls", ()):
        tool_call_id = _str(item.get("tool_call_id"))
        rows.append({**base, "invocation_id": _str(item.get("invocation_id")),
                     "tool_call_id": tool_call_id, "tool_name": _str(item.get("tool_name")),
                     "started_at": _time(item.get("started_at")),
                     "completed_at": _time(item.get("completed_at")),
                     "duration_ms": _float(item.get("duration_ms")),
                     "timing_source": _str(item.get("timing_source")),
                     "status": _str(item.get("status")),
                     "error_type": _str(item.get("error_type")),
                     "sandbox_id": _str(item.get("sandbox_id")),
                     "requested_by_model_call_id": requesters.get(tool_call_id or "")})  # fmt: skip
    return rows


def _compaction(base: dict[str, Any], item: Mapping[str, Any]) -> dict[str, Any]:
    before, after = item.get("before_model_call"), item.get("after_model_call")
    return {**base, "invocation_id": _str(item.get("invocation_id")),
            "observed_at": _time(item.get("observed_at")), "trigger": _str(item.get("trigger")),
            "tokens_before": _int(item.get("tokens_before")),
            "tokens_after": _int(item.get("tokens_after")), "outcome": _str(item.get("outcome")),
            "before_model_call_id": _str(before.get("model_call_id"))
            if isinstance(before, Mapping) else None,
            "after_model_call_id": _str(after.get("model_call_id"))
            if isinstance(after, Mapping) else None}  # fmt: skip


def _sandbox(base: dict[str, Any], item: Mapping[str, Any]) -> dict[str, Any]:
    row = {**base, "exit_code": _int(item.get("exit_code"))}
    for name in ("role", "provider", "sandbox_id", "outcome", "resource_usage_source",
                 "error_type"):  # fmt: skip
        row[name] = _str(item.get(name))
    for name in ("wall_time_s", "cpu_time_s", "peak_memory_mib"):
        row[name] = _float(item.get(name))
    return row


def _perf(base: dict[str, Any], evidence: Mapping[str, Any]) -> dict[str, Any] | None:
    perf = evidence.get("perf")
    if isinstance(perf, Mapping):
        row = {**base, "started_at": _time(perf.get("started_at")),
               "completed_at": _time(perf.get("completed_at")),
               "evidence": orjson.dumps(perf.get("evidence")).decode()
               if perf.get("evidence") is not None else None}  # fmt: skip
        for column in PERF.columns:
            if column.name not in row and column.name != "unavailable_reason":
                convert = _int if column.dtype == pl.Int64() else _float
                row[column.name] = convert(perf.get(column.name))
        return row
    reasons = [_str(g.get("detail")) for g in evidence.get("gaps", ())
               if g.get("code") == GapCode.PERF_UNAVAILABLE]  # fmt: skip
    if not reasons:
        return None
    return {**base, "unavailable_reason": reasons[0] or "unknown"}


def _objects(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None  # type: ignore[arg-type]  # checked above


def _time(value: object) -> datetime | None:
    seconds = _float(value)
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
