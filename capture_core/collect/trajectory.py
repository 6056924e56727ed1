"""Project a rollout's captured calls into a standard ``ng_trajectory`` (schema ``"1.0"``).

The trajectory lists the model calls in call order with their request and response payloads
(the raw text where a body was not JSON), timing, response metadata and token stats; the tool
calls the model asked for, each with the output a later request sent back (a Responses
``function_call_output`` item, a Chat ``role: tool`` message or a Messages ``tool_result``
block, matched by call id); and the capture's gaps.

:func:`capture_fields` decides what a rollout record gets: after a successful projection the
attached calls drop their payloads (the trajectory and the capture store hold them); if the
projection fails, there is no ``ng_trajectory``, payloads stay attached and the attachment gains
the gap ``trajectory_projection_failed`` (detail: the exception class). Neither touches the
rollout's own fields.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from capture_core.records import (
    ATTACHMENT_KEY,
    Gap,
    GapCode,
    ModelCallCaptureAttachment,
    ModelCallRecord,
    ModelRef,
)

__all__ = [
    "SCHEMA_VERSION",
    "TRAJECTORY_KEY",
    "ResponseMetadata",
    "TokenStats",
    "TrajectoryGap",
    "TrajectoryModelCall",
    "TrajectoryRecord",
    "TrajectoryToolCall",
    "capture_fields",
    "project_trajectory",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION: Final = "1.0"
TRAJECTORY_KEY: Final = "ng_trajectory"
_TASK_ID_KEYS: Final = ("task_id", "id", "problem_id", "instance_id", "_ng_task_index")
_OUTPUT_ITEMS: Final = frozenset({"function_call_output", "custom_tool_call_output"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ResponseMetadata(_Strict):
    """What the server said about a call besides its payload."""

    response_id: str | None = None
    model_ref: ModelRef | None = None
    model: str | None = None
    dialect: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    error_category: str | None = None
    latency_ttft_ms: float | None = Field(default=None, ge=0)


class TokenStats(_Strict):
    """A call's token usage as reported; ``None`` means not reported."""

    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)


class TrajectoryModelCall(_Strict):
    """One model call: payloads (JSON, or the raw text), timing, metadata, tokens."""

    model_call_id: str | None = None
    call_index: int = Field(ge=0)
    started_at: datetime | None = None
    completed_at: datetime | None = None
    duration_ms: float | None = Field(default=None, ge=0)
    request: Any = None
    response: Any = None
    response_metadata: ResponseMetadata
    token_stats: TokenStats


class TrajectoryToolCall(_Strict):
    """A tool call the model asked for and, once a later request carried it, its output.

    ``status`` is ``completed`` when the output was seen, else ``requested``.
    """

    tool_call_id: str | None = None
    tool_name: str | None = None
    type: str | None = None
    arguments: Any = None
    arguments_raw: str | None = None
    model_call_id: str | None = None
    call_index: int = Field(ge=0)
    status: Literal["requested", "completed"] = "requested"
    output: Any = None
    output_model_call_id: str | None = None
    output_call_index: int | None = Field(default=None, ge=0)


class TrajectoryGap(_Strict):
    """Missing or doubtful evidence in the trajectory."""

    code: str
    detail: str | None = None


class TrajectoryRecord(_Strict):
    """The ``ng_trajectory`` of one rollout (schema ``"1.0"``)."""

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    task_id: str
    rollout_id: str
    model_calls: list[TrajectoryModelCall] = Field(default_factory=list)
    tool_calls: list[TrajectoryToolCall] = Field(default_factory=list)
    gaps: list[TrajectoryGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_call_ids(self) -> TrajectoryRecord:
        ids = [call.model_call_id for call in self.model_calls if call.model_call_id is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("model_call_id must be unique within a trajectory")
        return self


def project_trajectory(
    row: Mapping[str, Any], result: Mapping[str, Any], attachment: ModelCallCaptureAttachment
) -> dict[str, Any]:
    """The ``ng_trajectory`` of a rollout, from its capture attachment read with payloads.

    Args:
        row: the dispatched row (the task id comes from it).
        result: what the agent returned; reserved for agent-side evidence, not read yet.
        attachment: the rollout's attachment, its calls still carrying their payloads.

    Raises:
        ValueError: the calls do not make a valid trajectory (a negative duration, a repeated
            ``model_call_id``...); pydantic's ``ValidationError`` is a ``ValueError``.

    Example:
        >>> project_trajectory({"id": "q1"}, {}, attachment)["model_calls"][0]["call_index"]
        0
    """
    del result  # the capture is the only evidence projected for now
    calls = sorted(attachment.calls, key=lambda call: call.call_index)
    gaps = [TrajectoryGap(code=gap.code, detail=gap.detail) for gap in attachment.gaps]
    if not calls:
        gaps.append(TrajectoryGap(code="model_calls_unavailable"))
    record = TrajectoryRecord(
        task_id=_task_id(row),
        rollout_id=attachment.rollout_id,
        model_calls=[_model_call(call) for call in calls],
        tool_calls=_tool_calls(calls),
        gaps=gaps,
    )
    return record.model_dump(mode="json")


def capture_fields(
    row: Mapping[str, Any], result: Mapping[str, Any], attachment: ModelCallCaptureAttachment
) -> dict[str, Any]:
    """The fields a rollout record gains: ``ng_model_call_capture`` and, if it projects,
    ``ng_trajectory``.

    On success the attached calls carry no payloads; on failure they keep them and the
    attachment gains ``trajectory_projection_failed``. ``attachment`` itself is not modified.

    Example:
        >>> sorted(capture_fields(row, result, attachment))
        ['ng_model_call_capture', 'ng_trajectory']
    """
    try:
        trajectory = project_trajectory(row, result, attachment)
    except Exception as exc:  # any failure is reported as a gap, never raised
        logger.warning(
            "could not project the trajectory of rollout %s: %s: %s",
            attachment.rollout_id, type(exc).__name__, exc,
        )  # fmt: skip
        gap = Gap(code=GapCode.TRAJECTORY_PROJECTION_FAILED, detail=type(exc).__name__)
        failed = attachment.model_copy(update={"gaps": [*attachment.gaps, gap]})
        return {ATTACHMENT_KEY: failed.to_json_dict(include_payloads=True)}
    return {
        ATTACHMENT_KEY: attachment.to_json_dict(include_payloads=False),
        TRAJECTORY_KEY: trajectory,
    }


def _task_id(row: Mapping[str, Any]) -> str:
    for key in _TASK_ID_KEYS:
        value = row.get(key)
        if value is not None:
            return str(value)
    raise ValueError("the row has no task id and no _ng_task_index")


def _model_call(call: ModelCallRecord) -> TrajectoryModelCall:
    response_status = call.response_status
    if response_status is None and isinstance(call.response, dict):
        status = call.response.get("status")
        response_status = status if isinstance(status, str) else None
    return TrajectoryModelCall(
        model_call_id=call.model_call_id,
        call_index=call.call_index,
        started_at=call.started_at,
        completed_at=call.completed_at,
        duration_ms=call.latency_total_ms,
        request=call.request if call.request is not None else call.request_raw,
        response=call.response if call.response is not None else call.response_raw,
        response_metadata=ResponseMetadata(
            response_id=call.response_id,
            model_ref=call.model_ref,
            model=call.model,
            dialect=call.dialect,
            status_code=call.status_code,
            response_status=response_status,
            finish_reason=call.finish_reason,
            error_category=call.error_category,
            latency_ttft_ms=call.latency_ttft_ms,
        ),
        token_stats=TokenStats(
            prompt_tokens=call.tokens_in,
            completion_tokens=call.tokens_out,
            reasoning_tokens=call.tokens_reasoning,
            total_tokens=call.tokens_total,
            cached_tokens=call.cached_tokens,
        ),
    )


def _tool_calls(calls: list[ModelCallRecord]) -> list[TrajectoryToolCall]:
    """Tool calls in call order, each joined to the first later request carrying its result."""
    tools: list[TrajectoryToolCall] = []
    for call in calls:
        for tool in call.tool_calls:
            entry = TrajectoryToolCall(
                tool_call_id=tool.call_id,
                tool_name=tool.name,
                type=tool.type,
                arguments=tool.arguments,
                arguments_raw=tool.arguments_raw,
                model_call_id=call.model_call_id,
                call_index=call.call_index,
            )
            if tool.call_id is not None:
                _join_output(entry, tool.call_id, calls)
            tools.append(entry)
    return tools


def _join_output(entry: TrajectoryToolCall, call_id: str, calls: list[ModelCallRecord]) -> None:
    for later in calls:
        if later.call_index <= entry.call_index:
            continue
        for result_id, output in _tool_results(later.request):
            if result_id == call_id:
                entry.status = "completed"
                entry.output = output
                entry.output_model_call_id = later.model_call_id
                entry.output_call_index = later.call_index
                return


def _tool_results(request: object) -> Iterator[tuple[str, Any]]:
    """``(call id, output)`` of every tool result a request body sends back, in any dialect."""
    if not isinstance(request, dict):
        return
    items = request.get("input")
    for item in items if isinstance(items, list) else ():
        is_output = isinstance(item, dict) and item.get("type") in _OUTPUT_ITEMS
        if is_output and isinstance(item.get("call_id"), str):
            yield item["call_id"], item.get("output")
    messages = request.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        if message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
            yield message["tool_call_id"], message.get("content")
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            is_result = isinstance(block, dict) and block.get("type") == "tool_result"
            if is_result and isinstance(block.get("tool_use_id"), str):
                yield block["tool_use_id"], block.get("content")
