"""Removing marks that will never clear: a dead writer's, or a rerun rollout's lost ones.

:func:`sweep_markers` removes dead writers' marks (reporting whether each call's line landed
after all) and their lock and slots files; :func:`forget_lost` removes one rollout's lost marks
before a collector reruns it under the same id.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from capture_core.pending.calls import PendingCall, pending_calls, writer_alive
from capture_core.pending.slots import (
    _BLANK,
    _SEPARATOR,
    LOCK_SUFFIX,
    PENDING_DIR,
    SLOTS_SUFFIX,
    WRITERS_DIR,
    _slot_marks,
)

__all__ = ["SweepReport", "forget_lost", "sweep_markers"]


def forget_lost(root: Path, rollout_id: str) -> list[PendingCall]:
    """Remove the marks of ``rollout_id``'s calls whose writer died; return what was removed.

    For a collector about to rerun the rollout under the same id: those calls belonged to the
    attempt it archives, and left in place they would read as lost calls of the rerun. Marks of
    running writers are left alone (a dead writer never writes its slots file again).

    Example:
        >>> [p.model_call_id for p in forget_lost(Path("/abs/model-calls"), "0-0")]
        ... # doctest: +SKIP
        ['c0ffee']
    """
    lost = [call for call in pending_calls(root, rollout_id) if call.lost]
    by_file: dict[Path, set[str]] = {}
    for call in lost:
        by_file.setdefault(call.path, set()).add(call.model_call_id)
    needle = (rollout_id + _SEPARATOR).encode()
    for path, call_ids in by_file.items():
        if not path.name.endswith(SLOTS_SUFFIX):  # an older version's marker file
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue  # swept meanwhile
        try:
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            for offset, rid, call_id in _slot_marks(data, needle):
                if rid == rollout_id and call_id in call_ids:
                    os.pwrite(fd, _BLANK, offset)
        finally:
            os.close(fd)
    return lost


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What :func:`sweep_markers` did.

    Attributes:
        removed: markers of dead writers that were removed, each with whether its line had
            landed after all (``True``: a stale marker) or not (the call's capture is lost).
        live: markers of running writers (left alone).
        unknown: markers of an older version whose writer cannot be judged (left alone).
        writers_removed: dead writers whose lock and slots files were removed (their failure
            logs are kept).
    """

    removed: list[tuple[PendingCall, bool]]
    live: int
    unknown: int
    writers_removed: list[str]

    @property
    def lost(self) -> list[PendingCall]:
        """The removed markers whose line never landed."""
        return [call for call, landed in self.removed if not landed]


def sweep_markers(
    root: Path, *, landed: Iterable[tuple[str, str]] = (), dry_run: bool = False
) -> SweepReport:
    """Remove the markers of dead writers (and the lock and slots files of dead writers).

    Args:
        root: the capture directory.
        landed: ``(rollout_id, model_call_id)`` of calls whose lines are in the store; a
            removed marker is reported as stale rather than lost when its call is among them.
        dry_run: report what would be removed, remove nothing.

    Example:
        >>> sweep_markers(Path("/abs/model-calls")).lost  # doctest: +SKIP
        []
    """
    root = Path(root)
    landed_set = set(landed)
    calls = pending_calls(root)
    removed: list[tuple[PendingCall, bool]] = []
    for call in calls:
        if not call.lost:
            continue
        if not dry_run and not call.path.name.endswith(SLOTS_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(call.path)
        removed.append((call, (call.rollout_id, call.model_call_id) in landed_set))
    writers: set[str] = set()
    for directory, suffix in ((WRITERS_DIR, LOCK_SUFFIX), (PENDING_DIR, SLOTS_SUFFIX)):
        with contextlib.suppress(FileNotFoundError):
            writers.update(
                name.removesuffix(suffix)
                for name in os.listdir(root / directory)
                if name.endswith(suffix) and name.removesuffix(suffix).isalnum()
            )
    writers_removed: list[str] = []
    for token in sorted(writers):
        if writer_alive(root, token):
            continue
        if not dry_run:
            for path in (root / PENDING_DIR / f"{token}{SLOTS_SUFFIX}",
                         root / WRITERS_DIR / f"{token}{LOCK_SUFFIX}"):  # fmt: skip
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        writers_removed.append(token)
    return SweepReport(
        removed=removed,
        live=sum(call.state == "live" for call in calls),
        unknown=sum(call.state == "unknown" for call in calls),
        writers_removed=writers_removed,
    )
