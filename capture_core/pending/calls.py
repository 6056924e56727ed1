"""The marked calls as a reader sees them, each with its writer's state; waiting for them.

A call is live while its writer holds its lock and lost (:attr:`PendingCall.lost`) once the
writer died. :func:`mark_pending` / :func:`unmark_pending` mark a call with a file of its own,
for writers without a :class:`~capture_core.writers.CaptureWriter`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from capture_core.ids import validate_rollout_id
from capture_core.pending.slots import (
    _SEPARATOR,
    LOCK_SUFFIX,
    PENDING_DIR,
    SLOTS_SUFFIX,
    WRITERS_DIR,
    _check_token,
    _parse_marker,
    _slot_marks,
    pending_marker,
)

__all__ = [
    "PendingCall",
    "all_pending_writes",
    "mark_pending",
    "pending_calls",
    "pending_writes",
    "unmark_pending",
    "wait_for_pending",
    "writer_alive",
]

WriterState = Literal["live", "dead", "unknown"]


@dataclass(frozen=True, slots=True)
class PendingCall:
    """One marked call and what is known of its writer.

    Attributes:
        rollout_id: the rollout.
        model_call_id: the call.
        writer: the writing process's token, or ``None`` for a marker of an older version.
        state: ``live`` (its writer runs), ``dead`` (its writer died: the write never lands),
            or ``unknown`` (an older marker; treated as live).
        path: the file holding the marker (a writer's slots file, or an older marker file).
    """

    rollout_id: str
    model_call_id: str
    writer: str | None
    state: WriterState
    path: Path

    @property
    def lost(self) -> bool:
        """Whether the write can no longer land (its writer died)."""
        return self.state == "dead"


def writer_alive(root: Path, writer: str) -> bool:
    """Whether the server process with token ``writer`` still holds its lock in ``root``.

    Example:
        >>> writer_alive(Path("/abs/model-calls"), "0f3c")  # doctest: +SKIP
        False
    """
    lock = Path(root) / WRITERS_DIR / f"{_check_token(writer, 'writer token')}{LOCK_SUFFIX}"
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)  # closing drops a lock we may have taken
    return False


def pending_calls(root: Path, rollout_id: str | None = None) -> list[PendingCall]:
    """Every marked call in ``root`` (or of one rollout), with its writer's state, sorted.

    Each distinct writer is checked once.

    Example:
        >>> [(p.model_call_id, p.state) for p in pending_calls(Path("/abs/mc"), "0-0")]
        ... # doctest: +SKIP
        [('c0ffee', 'dead')]
    """
    if rollout_id is not None:
        validate_rollout_id(rollout_id)
    needle = (rollout_id + _SEPARATOR).encode() if rollout_id is not None else None
    directory = Path(root) / PENDING_DIR
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    states: dict[str, WriterState] = {}

    def state_of(writer: str | None) -> WriterState:
        if writer is None:
            return "unknown"
        if writer not in states:
            states[writer] = "live" if writer_alive(root, writer) else "dead"
        return states[writer]

    found: list[PendingCall] = []
    for name in names:
        path = directory / name
        token = name.removesuffix(SLOTS_SUFFIX)
        if token != name:
            if not token.isalnum():
                continue
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue  # swept meanwhile
            for _, rid, call_id in _slot_marks(data, needle):
                if rollout_id is None or rid == rollout_id:
                    found.append(PendingCall(rid, call_id, token, state_of(token), path))
            continue
        parsed = _parse_marker(name)
        if parsed is None or (rollout_id is not None and parsed[0] != rollout_id):
            continue
        rid, call_id, writer = parsed
        found.append(PendingCall(rid, call_id, writer, state_of(writer), path))
    found.sort(key=lambda p: (p.rollout_id, p.model_call_id))
    return found


def all_pending_writes(root: Path) -> list[tuple[str, str]]:
    """``(rollout_id, model_call_id)`` of every marked call, live or lost, sorted.

    Example:
        >>> all_pending_writes(Path("/abs/results/model-calls"))  # doctest: +SKIP
        [('3-0', 'c0ffee')]
    """
    return [(p.rollout_id, p.model_call_id) for p in pending_calls(root)]


def mark_pending(
    root: Path, rollout_id: str, model_call_id: str, writer: str | None = None
) -> None:
    """Mark a call pending with a marker file of its own (for writers without a
    :class:`~capture_core.writers.CaptureWriter`; servers use their slots file)."""
    marker = pending_marker(root, rollout_id, model_call_id, writer)
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except FileNotFoundError:
        marker.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    os.close(fd)


def unmark_pending(
    root: Path, rollout_id: str, model_call_id: str, writer: str | None = None
) -> None:
    """Remove a marker made by :func:`mark_pending`."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pending_marker(root, rollout_id, model_call_id, writer))


def pending_writes(root: Path, rollout_id: str) -> list[str]:
    """The ``model_call_id`` of every marked write of ``rollout_id``, live or lost."""
    return [p.model_call_id for p in pending_calls(root, rollout_id)]


def wait_for_pending(
    root: Path, rollout_id: str, *, timeout_s: float, poll_s: float = 0.02
) -> list[str]:
    """Wait up to ``timeout_s`` for a rollout's live writes to land; returns the marked ones left.

    Writes whose writer died are not waited for (they never land); they are in the result
    with the live ones still pending. :func:`pending_calls` tells them apart.

    Example:
        >>> wait_for_pending(Path("/abs/model-calls"), "0-0", timeout_s=5.0)  # doctest: +SKIP
        []
    """
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = pending_calls(root, rollout_id)
        if all(p.lost for p in remaining) or time.monotonic() >= deadline:
            return [p.model_call_id for p in remaining]
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
