"""Project a rollout's evidence into its ``ng_trajectory``.

:func:`build_trajectory` merges three sources, each optional, in this order:

1. the trajectory the agent produced itself (``result["ng_trajectory"]``): validated (else the
   gap ``producer_trajectory_invalid``), its identity checked against the canonical task and
   rollout ids (else ``producer_trajectory_identity_mismatch`` and its turns are rewritten to
   the canonical identity), then its gaps, invocations, turns, tool and model calls taken over;
2. the agent's observations (``result["ng_agent_observations"]``): validated (else
   ``agent_observations_invalid``), their gaps taken over, invocations not yet present
   appended, and each observed tool call merged into the entry with the same
   ``(invocation_id, tool_call_id)``: its non-null fields win, except that an observed
   ``unknown`` status never hides a known one, and its ``output`` is the matching
   ``function_call_output`` of that invocation's conversation, when there is one;
3. the captured calls (``result["ng_model_call_capture"]["calls"]``): each projected (payloads,
   timing, response metadata, token stats) and merged by ``model_call_id`` into the producer's
   call (capture's non-null values win, the producer's position is kept) or appended in
   ``call_index`` order; the capture's gaps are copied (one that is not a gap becomes
   ``model_call_capture_gap_invalid``).

Then the record says what it lacks (``model_calls_unavailable``, ``turns_unavailable``,
``conversation_unavailable``) and repeated gaps are dropped, the first kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from capture_core.ids import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, rollout_id_from_body
from capture_core.observations.bundle import (
    OBSERVATIONS_KEY,
    AgentInvocation,
    AgentObservationBundle,
    ToolCallObservation,
)
from capture_core.observations.gaps import ObservationGap, dedupe_gaps, gap_codes
from capture_core.observations.trajectory import (
    TRAJECTORY_KEY,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryToolCall,
    TrajectoryTurn,
)
from capture_core.records import ATTACHMENT_KEY, GapCode

__all__ = [
    "TASK_ID_KEYS",
    "build_trajectory",
    "history_redacted",
    "trajectory_rollout_id",
    "trajectory_task_id",
    "why",
]

TASK_ID_KEYS: Final = ("task_id", "problem_id", "instance_id")
_METADATA: Final = ("response_id", "model_ref", "model", "dialect", "status_code",
                    "response_status", "finish_reason", "error_category",
                    "latency_ttft_ms")  # fmt: skip
_TOKENS: Final = (("tokens_in", "prompt_tokens"), ("tokens_out", "completion_tokens"),
                  ("tokens_reasoning", "reasoning_tokens"), ("tokens_total", "total_tokens"),
                  ("cached_tokens", "cached_tokens"))  # fmt: skip
_OVERWRITTEN: Final = ("started_at", "completed_at", "duration_ms", "request", "response")
_MAX_DETAIL: Final = 300


def trajectory_task_id(row: Mapping[str, Any]) -> str:
    """The task id of a rollout: the row's ``task_id``, ``problem_id`` or ``instance_id``,
    else its ``_ng_task_index``.

    Raises:
        ValueError: the row has none of them.

    Example:
        >>> trajectory_task_id({"problem_id": 17, "_ng_task_index": 3})
        '17'
    """
    for key in TASK_ID_KEYS:
        if row.get(key) is not None:
            return str(row[key])
    if row.get(TASK_INDEX_KEY) is None:
        raise ValueError("the row has no task_id, problem_id, instance_id or _ng_task_index")
    return str(row[TASK_INDEX_KEY])


def trajectory_rollout_id(row: Mapping[str, Any]) -> str:
    """The rollout id of a dispatched row, derived as capture derives it.

    Raises:
        ValueError: the row has no usable id (an invalid explicit id, or no indices).

    Example:
        >>> trajectory_rollout_id({"_ng_task_index": 2, "_ng_rollout_index": 3})
        '2-3'
    """
    rollout_id = rollout_id_from_body(row)
    if rollout_id is None:
        raise ValueError(f"the row has no {TASK_INDEX_KEY} and {ROLLOUT_INDEX_KEY}")
    return rollout_id


def history_redacted(result: Mapping[str, Any]) -> bool:
    """Whether the agent's trajectory or observations carry ``multimodal_history_redacted``.

    Example:
        >>> history_redacted({"ng_agent_observations": {"gaps": [
        ...     {"code": "multimodal_history_redacted"}]}})
        True
    """
    codes = gap_codes(result.get(TRAJECTORY_KEY)) | gap_codes(result.get(OBSERVATIONS_KEY))
    return GapCode.MULTIMODAL_HISTORY_REDACTED in codes


def why(exc: BaseException) -> str:
    """A short detail for a validation failure: the class, and the first error's place."""
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        text = f"{type(exc).__name__}: {where + ': ' if where else ''}{first['msg']}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text[:_MAX_DETAIL]


class _Projection:
    """The pieces of the record being built, in the order the sources are merged."""

    def __init__(self, task_id: str, rollout_id: str) -> None:
        self.task_id, self.rollout_id = task_id, rollout_id
        self.invocations: list[AgentInvocation] = []
        self.turns: list[TrajectoryTurn] = []
        self.model_calls: list[TrajectoryModelCall] = []
        self.tool_calls: list[TrajectoryToolCall] = []
        self.gaps: list[ObservationGap] = []

    def gap(self, code: GapCode, detail: str | None = None) -> None:
        self.gaps.append(ObservationGap(code=code, detail=detail))

    def producer(self, value: object) -> None:
        if not isinstance(value, Mapping):
            self.gap(GapCode.PRODUCER_TRAJECTORY_INVALID, type(value).__name__)
            return
        try:
            producer = TrajectoryRecord.model_validate(value)
        except ValueError as exc:
            self.gap(GapCode.PRODUCER_TRAJECTORY_INVALID, type(exc).__name__)
            return
        identity = {"task_id": self.task_id, "rollout_id": self.rollout_id}
        mismatched = [name for name, canonical in identity.items()
                      if getattr(producer, name) != canonical]  # fmt: skip
        self.turns = list(producer.turns)
        if mismatched:
            self.gap(GapCode.PRODUCER_TRAJECTORY_IDENTITY_MISMATCH, ",".join(mismatched))
            self.turns = [turn.model_copy(update=identity) for turn in self.turns]
        self.gaps += producer.gaps
        self.invocations = list(producer.invocations)
        self.tool_calls = list(producer.tool_calls)
        self.model_calls = list(producer.model_calls)

    def observations(self, value: object) -> None:
        try:
            if isinstance(value, AgentObservationBundle):
                bundle = value
            else:
                bundle = AgentObservationBundle.model_validate(value)
        except ValueError as exc:
            self.gap(GapCode.AGENT_OBSERVATIONS_INVALID, why(exc))
            return
        self.gaps += bundle.gaps
        present = {invocation.invocation_id for invocation in self.invocations}
        for invocation in bundle.invocations():
            if invocation.invocation_id not in present:
                self.invocations.append(invocation)
                present.add(invocation.invocation_id)
        outputs = _tool_outputs(self.invocations)
        where = {(t.invocation_id, t.tool_call_id): i for i, t in enumerate(self.tool_calls)}
        for observed in bundle.tool_calls():
            key = (observed.invocation_id, observed.tool_call_id)
            known = self.tool_calls[where[key]] if key in where else None
            entry = _merge_tool(known, observed, outputs)
            if key in where:
                self.tool_calls[where[key]] = entry
            else:
                where[key] = len(self.tool_calls)
                self.tool_calls.append(entry)

    def capture(self, value: object) -> None:
        if not isinstance(value, Mapping):
            return
        entries = [c for c in _list(value.get("calls")) if isinstance(c, Mapping)]
        where = {c.model_call_id: i for i, c in enumerate(self.model_calls) if c.model_call_id}
        for entry in sorted(entries, key=_call_index):
            projected = project_call(entry)
            position = where.get(projected.model_call_id) if projected.model_call_id else None
            if position is None:
                self.model_calls.append(projected)
            else:
                self.model_calls[position] = _merge_call(self.model_calls[position], projected)
        for raw in _list(value.get("gaps")):
            try:
                self.gaps.append(ObservationGap.model_validate(raw))
            except ValueError as exc:
                self.gap(GapCode.MODEL_CALL_CAPTURE_GAP_INVALID, type(exc).__name__)

    def finish(self) -> TrajectoryRecord:
        if not self.model_calls:
            self.gap(GapCode.MODEL_CALLS_UNAVAILABLE)
        if not self.turns:
            self.gap(GapCode.TURNS_UNAVAILABLE)
        if not any(invocation.conversation for invocation in self.invocations):
            self.gap(GapCode.CONVERSATION_UNAVAILABLE)
        return TrajectoryRecord(
            task_id=self.task_id,
            rollout_id=self.rollout_id,
            invocations=self.invocations,
            turns=sorted(self.turns, key=lambda t: (t.timestamp, t.invocation_id, t.turn_no)),
            model_calls=self.model_calls,
            tool_calls=self.tool_calls,
            gaps=dedupe_gaps(self.gaps),
        )


def build_trajectory(row: Mapping[str, Any], result: Mapping[str, Any]) -> TrajectoryRecord:
    """The ``ng_trajectory`` of a rollout from what it left: the dispatched ``row`` (identity)
    and the ``result`` fields ``ng_trajectory``, ``ng_agent_observations`` and
    ``ng_model_call_capture`` (its calls with payloads unless they are to be left out).

    Raises:
        ValueError: the evidence does not make a valid record (a negative duration, a repeated
            ``model_call_id``, no task id...); pydantic's ``ValidationError`` is a
            ``ValueError``.

    Example:
        >>> build_trajectory({"task_id": "q1", "_ng_task_index": 0, "_ng_rollout_index": 0},
        ...                  {}).gaps[0].code
        'model_calls_unavailable'
    """
    projection = _Projection(trajectory_task_id(row), trajectory_rollout_id(row))
    if result.get(TRAJECTORY_KEY) is not None:
        projection.producer(result[TRAJECTORY_KEY])
    if result.get(OBSERVATIONS_KEY) is not None:
        projection.observations(result[OBSERVATIONS_KEY])
    projection.capture(result.get(ATTACHMENT_KEY))
    return projection.finish()


def project_call(call: Mapping[str, Any]) -> TrajectoryModelCall:
    """One captured call (a ``ng_model_call_capture`` call, payloads or not) as a trajectory
    model call. Only token counts that are non-negative ints are kept.

    Raises:
        ValueError: a field does not validate (a negative latency, a bad timestamp...).
    """
    metadata = {name: call[name] for name in _METADATA if call.get(name) is not None}
    response, request = call.get("response"), call.get("request")
    status = response.get("status") if isinstance(response, Mapping) else None
    if "response_status" not in metadata and isinstance(status, str):
        metadata["response_status"] = status
    tokens = {name: call[key] for key, name in _TOKENS
              if type(call.get(key)) is int and call[key] >= 0}  # fmt: skip
    return TrajectoryModelCall.model_validate({
        "model_call_id": call.get("model_call_id"),
        "started_at": unix_seconds(call.get("started_at")),
        "completed_at": unix_seconds(call.get("completed_at")),
        "duration_ms": call.get("latency_total_ms"),
        "request": request if request is not None else call.get("request_raw"),
        "response": response if response is not None else call.get("response_raw"),
        "response_metadata": metadata,
        "token_stats": tokens,
    })  # fmt: skip


def unix_seconds(value: object) -> float | None:
    """A timestamp as Unix seconds: numbers as they are, datetimes and ISO strings converted.

    Raises:
        ValueError: a string that is not an ISO timestamp, a naive datetime, or not finite.

    Example:
        >>> unix_seconds("2026-08-06T16:02:34.120000Z")
        1786032154.12
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("a timestamp without a time zone is ambiguous")
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise ValueError(f"not a timestamp: {value!r:.80}")


def _merge_call(producer: TrajectoryModelCall, capture: TrajectoryModelCall) -> TrajectoryModelCall:
    update: dict[str, Any] = {}
    for name in _OVERWRITTEN:
        if getattr(capture, name) is not None:
            update[name] = getattr(capture, name)
    for name in ("response_metadata", "token_stats"):
        merged = getattr(producer, name).model_dump()
        merged.update(getattr(capture, name).model_dump(exclude_none=True))
        update[name] = merged
    data = {**producer.model_dump(), **update}
    return TrajectoryModelCall.model_validate(data)


def _call_index(call: Mapping[str, Any]) -> tuple[int, int]:
    index = call.get("call_index")
    return (0, index) if type(index) is int else (1, 0)


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else ()


def _tool_outputs(invocations: Sequence[AgentInvocation]) -> dict[tuple[str, str], Any]:
    """``(invocation id, call id) -> output`` of the ``function_call_output`` items."""
    outputs: dict[tuple[str, str], Any] = {}
    for invocation in invocations:
        for item in invocation.conversation:
            call_id = item.get("call_id")
            if item.get("type") == "function_call_output" and isinstance(call_id, str):
                outputs.setdefault((invocation.invocation_id, call_id), item.get("output"))
    return outputs


def _merge_tool(
    known: TrajectoryToolCall | None,
    observed: ToolCallObservation,
    outputs: Mapping[tuple[str, str], Any],
) -> TrajectoryToolCall:
    merged = known.model_dump() if known is not None else {}
    for name, value in observed:
        keeps_known = name == "status" and value == "unknown" and known is not None
        if value is None or (keeps_known and merged["status"] != "unknown"):
            continue
        merged[name] = value
    key = (observed.invocation_id, observed.tool_call_id)
    if key in outputs:
        merged["output"] = outputs[key]
    return TrajectoryToolCall.model_validate(merged)
