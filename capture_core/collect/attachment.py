"""Build the ``ng_model_call_capture`` attachment of one finished rollout.

Waits (bounded) for the rollout's capture writes still in flight, reads its calls with the
tolerant reader and says plainly what evidence is missing: no records, damaged lines (with a
count), a call whose write failed (per call, from the servers' failure logs; the incomplete
marker when the log has nothing), a call whose server died mid-write (per call), a write still
pending after the drain timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from capture_core.exceptions import CaptureStoreError
from capture_core.failures import read_capture_failures
from capture_core.ids import validate_rollout_id
from capture_core.metrics import aggregate_model_call_records
from capture_core.pending import PendingCall, pending_calls, wait_for_pending
from capture_core.records import (
    CaptureFailure,
    Gap,
    GapCode,
    ModelCallCaptureAttachment,
    ModelCallRecord,
)
from capture_core.store import CaptureStore

__all__ = ["DEFAULT_DRAIN_TIMEOUT_S", "capture_attachment"]

logger = logging.getLogger(__name__)

DEFAULT_DRAIN_TIMEOUT_S = 10.0


def _pick_store(dirs: Sequence[str | Path], rollout_id: str) -> CaptureStore | None:
    """The first directory holding this rollout's capture file or marker."""
    for directory in dirs:
        if not Path(directory).is_dir():
            continue
        store = CaptureStore(directory)
        if store.exists(rollout_id):
            return store
    return None


def capture_attachment(
    dirs: Sequence[str | Path],
    rollout_id: str,
    *,
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    since: float | None = None,
) -> ModelCallCaptureAttachment:
    """The attachment of one rollout, read from the first directory that has its capture.

    Missing evidence is named per call where it is known per call: a call whose line could not
    be written (from the servers' failure logs: ``model_call_capture_failed``), a call whose
    server died before its line landed (``model_call_capture_lost``); writes still running after
    the drain timeout are counted (``model_call_capture_pending``).

    Args:
        dirs: capture directories, in order of preference.
        rollout_id: the rollout-attempt id.
        drain_timeout_s: how long to wait for capture writes still in flight.
        since: when this attempt was dispatched (Unix seconds): failures logged for calls that
            started earlier belong to an earlier run of the same id and are left out.

    Example:
        >>> capture_attachment(["/abs/model-calls"], "0-0").to_json_dict()  # doctest: +SKIP
        {'rollout_id': '0-0', 'metrics': {...}, 'calls': [...]}
    """
    validate_rollout_id(rollout_id)
    gaps: list[Gap] = []
    markers: list[PendingCall] = []
    failures: list[CaptureFailure] = []
    for directory in dirs:
        if not Path(directory).is_dir():
            continue
        wait_for_pending(Path(directory), rollout_id, timeout_s=drain_timeout_s)
        markers += pending_calls(Path(directory), rollout_id)
        failures += read_capture_failures(directory).for_rollout(rollout_id, since=since)
    calls: list[ModelCallRecord] = []
    incomplete = False
    store = _pick_store(dirs, rollout_id)
    if store is not None:
        try:
            result = store.read_records(rollout_id)
        except CaptureStoreError as exc:
            logger.warning("could not read the capture of %s: %s", rollout_id, exc)
            gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_UNREADABLE, detail=str(exc)))
        else:
            calls = result.records
            incomplete = result.incomplete
            if result.damaged:
                gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_RECORDS_UNREADABLE,
                                detail=f"count={len(result.damaged)}"))  # fmt: skip
    landed = {call.model_call_id for call in calls}
    live = [m for m in markers if not m.lost and m.model_call_id not in landed]
    lost = [m for m in markers if m.lost and m.model_call_id not in landed]
    if live:
        gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_PENDING, detail=f"count={len(live)}"))
    for marker in lost:
        detail = f"call {marker.model_call_id}: its server (writer {marker.writer}) died first"
        gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_LOST, detail=detail))
    failed = [f for f in failures if f.model_call_id not in landed]
    for failure in failed:
        detail = f"call {failure.model_call_id}: {failure.reason}"
        gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_FAILED, detail=detail))
    if incomplete and not failed:
        gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_INCOMPLETE))
    if not calls and not gaps:
        gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_NO_RECORDS))
    return ModelCallCaptureAttachment(
        rollout_id=rollout_id,
        metrics=aggregate_model_call_records(calls),
        calls=calls,
        gaps=gaps,
    )
