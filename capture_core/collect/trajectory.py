"""What a finished rollout's record gains: its capture, joined observations, trajectory, perf.

:func:`capture_fields` follows the collector sequence for one rollout:

1. the capture attachment (``ng_model_call_capture``), with payloads unless the agent's
   trajectory or observations carry ``multimodal_history_redacted`` (then no payload copy is
   made anywhere in the row; the capture store keeps the raw lines);
2. the agent's ``ng_agent_observations``, validated and joined to the captured calls; any
   failure adds ``agent_observation_join_failed`` to the capture's gaps and leaves them as the
   agent returned them;
3. the ``ng_trajectory`` projection (:func:`~capture_core.observations.build_trajectory`); on
   success the attached calls drop their payloads (the trajectory and the store hold them), on
   failure there is no trajectory, payloads stay and ``trajectory_projection_failed`` (detail:
   the exception class) goes to the capture's gaps, else to the observations' gaps, else into
   a minimal trajectory;
4. ``ng_perf`` (:func:`~capture_core.observations.derive_perf`) over the rollout's window, or,
   when the evidence does not suffice, the trajectory gap ``perf_unavailable`` saying why.

None of it touches the rollout's own fields (``response``, ``reward``...).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from capture_core.observations import (
    OBSERVATIONS_KEY,
    PERF_KEY,
    SCHEMA_VERSION,
    TRAJECTORY_KEY,
    AgentObservationBundle,
    ObservationGap,
    TrajectoryRecord,
    build_trajectory,
    derive_perf,
    history_redacted,
    join_model_call_observations,
    trajectory_rollout_id,
    trajectory_task_id,
)
from capture_core.observations.projection import why
from capture_core.records import (
    ATTACHMENT_KEY,
    PAYLOAD_FIELDS,
    Gap,
    GapCode,
    ModelCallCaptureAttachment,
)

__all__ = [
    "EVIDENCE_KEYS",
    "SCHEMA_VERSION",
    "TRAJECTORY_KEY",
    "TrajectoryRecord",
    "attach_evidence",
    "capture_fields",
    "project_trajectory",
]

logger = logging.getLogger(__name__)

#: The record fields :func:`capture_fields` decides (present, rewritten, or removed).
EVIDENCE_KEYS: Final = (ATTACHMENT_KEY, OBSERVATIONS_KEY, TRAJECTORY_KEY, PERF_KEY)
Window = tuple[float, float]


def project_trajectory(
    row: Mapping[str, Any],
    result: Mapping[str, Any],
    attachment: ModelCallCaptureAttachment | None,
) -> dict[str, Any]:
    """The ``ng_trajectory`` of a rollout as JSON, the attachment's calls with payloads.

    Raises:
        ValueError: the evidence does not make a valid trajectory.

    Example:
        >>> project_trajectory({"task_id": "q1", "_ng_task_index": 0, "_ng_rollout_index": 0},
        ...                    {}, None)["gaps"][0]["code"]
        'model_calls_unavailable'
    """
    source = dict(result)
    if attachment is not None:
        source[ATTACHMENT_KEY] = attachment.to_json_dict(include_payloads=True)
    return build_trajectory(row, source).model_dump(mode="json")


def capture_fields(
    row: Mapping[str, Any],
    result: Mapping[str, Any],
    attachment: ModelCallCaptureAttachment | None,
    *,
    window: Window | None = None,
) -> dict[str, Any]:
    """The evidence fields of a rollout record (a key missing here must not be in the record).

    Args:
        row: the dispatched row (its identity names the trajectory).
        result: what the agent returned (its ``ng_agent_observations`` / ``ng_trajectory``).
        attachment: the rollout's capture, read with payloads (None: capture is off).
        window: the rollout's start and end, Unix seconds, as the collector timed the agent.

    Example:
        >>> sorted(capture_fields(row, result, attachment, window=(t0, t1)))  # doctest: +SKIP
        ['ng_agent_observations', 'ng_model_call_capture', 'ng_perf', 'ng_trajectory']
    """
    capture_gaps = list(attachment.gaps) if attachment is not None else []
    observations = result.get(OBSERVATIONS_KEY)
    if observations is not None and attachment is not None:
        try:
            bundle = AgentObservationBundle.model_validate(observations)
            joined = join_model_call_observations(bundle, attachment.calls)
            observations = joined.model_dump(mode="json")
        except Exception as exc:  # any failure is this rollout's gap, never raised
            capture_gaps.append(Gap(code=GapCode.AGENT_OBSERVATION_JOIN_FAILED, detail=why(exc)))
    fields: dict[str, Any] = {}
    capture = None
    if attachment is not None:
        capture = attachment.model_copy(update={"gaps": capture_gaps}).to_json_dict(
            include_payloads=not history_redacted(result)
        )
        fields[ATTACHMENT_KEY] = capture
    if observations is not None:
        fields[OBSERVATIONS_KEY] = observations
    if capture is None and observations is None and result.get(TRAJECTORY_KEY) is None:
        return fields
    try:
        trajectory = build_trajectory(row, {**result, **fields})
    except Exception as exc:  # any failure is reported as a gap, never raised
        _projection_failed(row, fields, exc)
        return fields
    if capture is not None:
        capture["calls"] = [_without_payloads(call) for call in capture["calls"]]
    fields[TRAJECTORY_KEY] = trajectory.model_dump(mode="json")
    started, completed = window if window is not None else (None, None)
    derived = derive_perf(trajectory, started_at=started, completed_at=completed)
    if derived.perf is not None:
        fields[PERF_KEY] = derived.perf.model_dump(mode="json")
    else:
        gap = ObservationGap(code=GapCode.PERF_UNAVAILABLE, detail=derived.reason)
        fields[TRAJECTORY_KEY]["gaps"].append(gap.model_dump(mode="json"))
    return fields


def attach_evidence(
    record: Mapping[str, Any],
    row: Mapping[str, Any],
    result: Mapping[str, Any],
    attachment: ModelCallCaptureAttachment | None,
    *,
    window: Window | None = None,
) -> dict[str, Any]:
    """``record`` with its evidence fields replaced by :func:`capture_fields`' (a new dict)."""
    fields = capture_fields(row, result, attachment, window=window)
    kept = {key: value for key, value in record.items() if key not in EVIDENCE_KEYS}
    return {**kept, **fields}


def _projection_failed(row: Mapping[str, Any], fields: dict[str, Any], exc: Exception) -> None:
    rollout_id = _safely(trajectory_rollout_id, row)
    logger.warning("could not project the trajectory of rollout %s: %s: %s",
                   rollout_id or "(unknown)", type(exc).__name__, exc)  # fmt: skip
    gap = Gap(code=GapCode.TRAJECTORY_PROJECTION_FAILED, detail=type(exc).__name__)
    capture, observations = fields.get(ATTACHMENT_KEY), fields.get(OBSERVATIONS_KEY)
    if isinstance(capture, dict):
        capture["gaps"] = [*capture.get("gaps", ()), gap.to_json_dict()]
    elif isinstance(observations, Mapping):
        earlier = observations.get("gaps")
        gaps = earlier if isinstance(earlier, list) else []
        fields[OBSERVATIONS_KEY] = {**observations, "gaps": [*gaps, gap.to_json_dict()]}
    else:
        minimal = TrajectoryRecord(
            task_id=_safely(trajectory_task_id, row) or "",
            rollout_id=rollout_id or "",
            gaps=[ObservationGap(code=gap.code, detail=gap.detail)],
        )
        fields[TRAJECTORY_KEY] = minimal.model_dump(mode="json")


def _safely(derive: Any, row: Mapping[str, Any]) -> str | None:
    try:
        return str(derive(row))
    except ValueError:
        return None


def _without_payloads(call: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in call.items() if key not in PAYLOAD_FIELDS}
