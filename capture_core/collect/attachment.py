"""Build the ``ng_model_call_capture`` attachment of one finished rollout.

Waits (bounded) for the rollout's capture writes still in flight, reads its calls with the
tolerant reader and says plainly what evidence is missing: no records, damaged lines (with a
count), a failed write (the incomplete marker), a write still pending after the drain timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from capture_core.exceptions import CaptureStoreError
from capture_core.ids import validate_rollout_id
from capture_core.metrics import aggregate_model_call_records
from capture_core.pending import wait_for_pending
from capture_core.records import Gap, GapCode, ModelCallCaptureAttachment, ModelCallRecord
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
) -> ModelCallCaptureAttachment:
    """The attachment of one rollout, read from the first directory that has its capture.

    Args:
        dirs: capture directories, in order of preference.
        rollout_id: the rollout-attempt id.
        drain_timeout_s: how long to wait for capture writes still in flight.

    Example:
        >>> capture_attachment(["/abs/model-calls"], "0-0").to_json_dict()  # doctest: +SKIP
        {'rollout_id': '0-0', 'metrics': {...}, 'calls': [...]}
    """
    validate_rollout_id(rollout_id)
    gaps: list[Gap] = []
    pending: list[str] = []
    for directory in dirs:
        pending += wait_for_pending(Path(directory), rollout_id, timeout_s=drain_timeout_s)
    if pending:
        gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_PENDING, detail=f"count={len(pending)}"))
    calls: list[ModelCallRecord] = []
    store = _pick_store(dirs, rollout_id)
    if store is None:
        if not pending:
            gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_NO_RECORDS))
    else:
        try:
            result = store.read_records(rollout_id)
        except CaptureStoreError as exc:
            logger.warning("could not read the capture of %s: %s", rollout_id, exc)
            gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_UNREADABLE, detail=str(exc)))
        else:
            calls = result.records
            if result.damaged:
                gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_RECORDS_UNREADABLE,
                                detail=f"count={len(result.damaged)}"))  # fmt: skip
            if result.incomplete:
                gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_INCOMPLETE))
            elif not calls and not result.damaged and not pending:
                gaps.append(Gap(code=GapCode.MODEL_CALL_CAPTURE_NO_RECORDS))
    return ModelCallCaptureAttachment(
        rollout_id=rollout_id,
        metrics=aggregate_model_call_records(calls),
        calls=calls,
        gaps=gaps,
    )
