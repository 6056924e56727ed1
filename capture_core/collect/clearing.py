"""Clearing a rollout's capture before it is dispatched again.

A collector killed mid-run records no failure for the rows it was running, so their retry reuses
the same id. That is why, before dispatch, the capture of exactly the ids about to run is
cleared: first their in-flight writes are waited for (bounded), then any capture file or
incomplete marker is moved, under the file's exclusive lock, to
``<dir>/.cleared/<id>.<unix-ns>.capture.jsonl`` (never deleted). A writer that was waiting for
the lock notices the move and appends to the new file instead, so no line vanishes; what was
moved and what was still pending is logged and counted.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from capture_core._locking import fsync_dir, locked_fd, os_reason
from capture_core.exceptions import CaptureStoreError
from capture_core.ids import validate_rollout_id
from capture_core.pending import forget_lost, wait_for_pending
from capture_core.store import DATA_SUFFIX, MARKER_SUFFIX, CaptureStore

__all__ = ["CLEARED_DIR", "ClearReport", "clear_rollouts"]

logger = logging.getLogger(__name__)

CLEARED_DIR: Final = ".cleared"


@dataclass(slots=True)
class ClearReport:
    """What clearing did: the archived files (their new paths), the writes still pending (of
    running servers), and the calls of the archived attempts whose server died before their
    line landed (their marks are removed: the rerun does not inherit them)."""

    moved: list[Path] = field(default_factory=list)
    still_pending: dict[str, list[str]] = field(default_factory=dict)
    lost: dict[str, list[str]] = field(default_factory=dict)

    @property
    def pending_count(self) -> int:
        return sum(len(calls) for calls in self.still_pending.values())


def clear_rollouts(
    dirs: Sequence[str | os.PathLike[str]],
    ids: Sequence[str],
    *,
    wait_s: float,
    into: str = CLEARED_DIR,
) -> ClearReport:
    """Archive the existing capture of exactly ``ids`` in every directory, after their writes.

    Waits at most ``wait_s`` in all for the ids' in-flight writes, then moves each existing
    ``<id>.capture.jsonl`` and ``<id>.capture.incomplete`` to
    ``<dir>/<into>/<id>.<unix-ns>.<suffix>`` (``into`` is a folder name: ``.cleared`` for a
    resumed run's leftovers, a dated ``overwritten-...`` folder for ``--overwrite``). Writes
    still pending are reported (their markers stay, so the new attempt's attachment reports
    them too). Nothing else is touched.

    Raises:
        InvalidRolloutIdError: an id is invalid (checked before anything is touched).
        CaptureStoreError: a file exists but cannot be moved.

    Example:
        >>> clear_rollouts(["/abs/model-calls"], ["0-0", "0-1-a1"], wait_s=5).moved
        [PosixPath('/abs/model-calls/.cleared/0-0.1786032154120000000.capture.jsonl')]
    """
    for rollout_id in ids:
        validate_rollout_id(rollout_id)
    stores = [CaptureStore(directory) for directory in dirs if Path(directory).is_dir()]
    report = ClearReport()
    deadline = time.monotonic() + max(0.0, wait_s)
    for store in stores:
        for rollout_id in ids:
            left = max(0.0, deadline - time.monotonic())
            pending = wait_for_pending(store.root, rollout_id, timeout_s=left)
            if pending:
                lost = sorted(c.model_call_id for c in forget_lost(store.root, rollout_id))
                if lost:
                    report.lost.setdefault(rollout_id, []).extend(lost)
                if live := [call_id for call_id in pending if call_id not in lost]:
                    report.still_pending.setdefault(rollout_id, []).extend(live)
            report.moved += _archive(store, rollout_id, into)
    if report.moved:
        where = ", ".join(sorted({str(path.parent) for path in report.moved}))
        logger.info("archived %d earlier capture file(s) of the rollouts about to run into %s",
                    len(report.moved), where)  # fmt: skip
    if report.lost:
        named = sorted(report.lost.items())[:10]
        logger.warning(
            "%d call(s) of earlier attempts of %d rollout(s) about to run were lost when their "
            "capture server died: %s; their marks are removed, the rerun starts without them",
            sum(map(len, report.lost.values())), len(report.lost),
            ", ".join(f"{rid}: {' '.join(calls)}" for rid, calls in named),
        )  # fmt: skip
    if report.still_pending:
        logger.warning(
            "%d capture write(s) of %d rollout(s) about to run were still pending after %.1f s: "
            "%s; if they land, they land in the new attempt's file and its attachment says so",
            report.pending_count, len(report.still_pending), wait_s,
            ", ".join(sorted(report.still_pending)[:10]),
        )  # fmt: skip
    return report


def _archive(store: CaptureStore, rollout_id: str, into: str) -> list[Path]:
    """Move a rollout's capture file (under its lock) and marker into ``<root>/<into>/``."""
    moved: list[Path] = []
    data, marker = store.path_for(rollout_id), store.marker_path(rollout_id)
    cleared = store.root / into
    try:
        # Write access: on NFS an exclusive flock is emulated by a POSIX lock, which needs it.
        with locked_fd(data, os.O_WRONLY, exclusive=True, create=False) as held:
            if held is not None:
                moved.append(_move(data, cleared, rollout_id, DATA_SUFFIX))
        if marker.exists():
            moved.append(_move(marker, cleared, rollout_id, MARKER_SUFFIX))
        if moved:
            fsync_dir(cleared)
            fsync_dir(store.root)
    except OSError as exc:
        raise CaptureStoreError(
            f"could not archive the capture of rollout {rollout_id!r}: {os_reason(exc)}",
            path=Path(exc.filename) if isinstance(exc.filename, str) else data,
        ) from exc
    return moved


def _move(path: Path, cleared: Path, rollout_id: str, suffix: str) -> Path:
    cleared.mkdir(exist_ok=True)
    stamp = time.time_ns()
    while True:
        target = cleared / f"{rollout_id}.{stamp}{suffix}"
        if not target.exists():
            break
        stamp += 1
    os.rename(path, target)
    return target
