"""Capture writes in flight, visible to every process that shares the capture directory.

A server marks each captured call as pending when it starts and unmarks it once its line is
durable (or its failure recorded): an empty file ``<dir>/.pending/<rollout_id>@<model_call_id>@
<writer>``, where ``<writer>`` is the token of the server process (see
:mod:`capture_core.writers`). ``@`` cannot occur in a rollout id, so one rollout's markers never
match another's. Markers written by older versions have no ``@<writer>`` part.

A reader tells a live write from a lost one by the writer's lock: every server holds an
exclusive ``flock`` on ``<dir>/.writers/<writer>.lock`` for as long as it runs, so a lock that
can be taken (or a lock file that is gone) means the writer died and its marked calls will never
land (:attr:`PendingCall.lost`). A marker of an older version cannot be judged and counts as
live. A marker whose line did land (the writer died between the two) is not evidence of a loss:
:func:`sweep_markers` removes it, and readers that have the capture file skip it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from capture_core.ids import is_valid_rollout_id, validate_rollout_id

__all__ = [
    "PENDING_DIR",
    "WRITERS_DIR",
    "PendingCall",
    "SweepReport",
    "all_pending_writes",
    "mark_pending",
    "marker_name",
    "pending_calls",
    "pending_marker",
    "pending_writes",
    "sweep_markers",
    "unmark_pending",
    "wait_for_pending",
    "writer_alive",
]

PENDING_DIR: Final = ".pending"
WRITERS_DIR: Final = ".writers"
LOCK_SUFFIX: Final = ".lock"
_SEPARATOR: Final = "@"
_CALL_ID: Final = re.compile(r"^[A-Za-z0-9._-]+$")

WriterState = Literal["live", "dead", "unknown"]


def _check_token(value: str, what: str) -> str:
    if not value or not value.isascii() or not value.isalnum():
        raise ValueError(f"{what} must be ASCII letters and digits, got {value!r}")
    return value


def marker_name(rollout_id: str, model_call_id: str, writer: str | None = None) -> str:
    """The file name of one call's pending marker (validated: never a path).

    Example:
        >>> marker_name("3-2", "c0ffee", "w1")
        '3-2@c0ffee@w1'
    """
    parts = [validate_rollout_id(rollout_id), _check_token(model_call_id, "model_call_id")]
    if writer is not None:
        parts.append(_check_token(writer, "writer token"))
    return _SEPARATOR.join(parts)


def pending_marker(
    root: Path, rollout_id: str, model_call_id: str, writer: str | None = None
) -> Path:
    """Where the pending marker of one call lives (it may or may not exist)."""
    return Path(root) / PENDING_DIR / marker_name(rollout_id, model_call_id, writer)


@dataclass(frozen=True, slots=True)
class PendingCall:
    """One pending marker and what is known of its writer.

    Attributes:
        rollout_id: the rollout.
        model_call_id: the call.
        writer: the writing process's token, or ``None`` for a marker of an older version.
        state: ``live`` (its writer runs), ``dead`` (its writer died: the write never lands),
            or ``unknown`` (an older marker; treated as live).
        path: the marker file.
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


def _parse(name: str) -> tuple[str, str, str | None] | None:
    rollout_id, sep, rest = name.partition(_SEPARATOR)
    if not sep or not is_valid_rollout_id(rollout_id):
        return None
    call_id, _, writer = rest.partition(_SEPARATOR)
    # Read tolerantly (other writers' call ids may carry '-', '_' or '.'); written strictly.
    if not call_id or not _CALL_ID.match(call_id) or (writer and not writer.isalnum()):
        return None
    return rollout_id, call_id, writer or None


def _names(root: Path) -> list[str]:
    try:
        return sorted(os.listdir(Path(root) / PENDING_DIR))
    except FileNotFoundError:
        return []


def pending_calls(root: Path, rollout_id: str | None = None) -> list[PendingCall]:
    """Every pending marker in ``root`` (or of one rollout), with its writer's state, sorted.

    Each distinct writer is checked once.

    Example:
        >>> [(p.model_call_id, p.state) for p in pending_calls(Path("/abs/mc"), "0-0")]
        ... # doctest: +SKIP
        [('c0ffee', 'dead')]
    """
    if rollout_id is not None:
        validate_rollout_id(rollout_id)
    states: dict[str, WriterState] = {}
    found: list[PendingCall] = []
    for name in _names(root):
        parsed = _parse(name)
        if parsed is None or (rollout_id is not None and parsed[0] != rollout_id):
            continue
        rid, call_id, writer = parsed
        if writer is None:
            state: WriterState = "unknown"
        else:
            if writer not in states:
                states[writer] = "live" if writer_alive(root, writer) else "dead"
            state = states[writer]
        found.append(PendingCall(rid, call_id, writer, state, Path(root) / PENDING_DIR / name))
    return found


def all_pending_writes(root: Path) -> list[tuple[str, str]]:
    """``(rollout_id, model_call_id)`` of every marker, live or lost, sorted.

    Example:
        >>> all_pending_writes(Path("/abs/results/model-calls"))  # doctest: +SKIP
        [('3-0', 'c0ffee')]
    """
    return [(p.rollout_id, p.model_call_id) for p in pending_calls(root)]


def mark_pending(
    root: Path, rollout_id: str, model_call_id: str, writer: str | None = None
) -> None:
    """Record that the capture of one call has started (``writer``: the server's token)."""
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
    """Record that the capture of one call has finished (landed or failed)."""
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


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What :func:`sweep_markers` did.

    Attributes:
        removed: markers of dead writers that were removed, each with whether its line had
            landed after all (``True``: a stale marker) or not (the call's capture is lost).
        live: markers of running writers (left alone).
        unknown: markers of an older version whose writer cannot be judged (left alone).
        writers_removed: lock files of dead writers removed (their failure logs are kept).
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
    """Remove the pending markers of dead writers (and the lock files of dead writers).

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
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(call.path)
        removed.append((call, (call.rollout_id, call.model_call_id) in landed_set))
    writers_removed: list[str] = []
    still_marked = {call.writer for call in calls if not call.lost}
    try:
        lock_names = sorted(os.listdir(root / WRITERS_DIR))
    except FileNotFoundError:
        lock_names = []
    for name in lock_names:
        token = name.removesuffix(LOCK_SUFFIX)
        if token == name or not token.isalnum() or token in still_marked:
            continue
        if writer_alive(root, token):
            continue
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(root / WRITERS_DIR / name)
        writers_removed.append(token)
    return SweepReport(
        removed=removed,
        live=sum(call.state == "live" for call in calls),
        unknown=sum(call.state == "unknown" for call in calls),
        writers_removed=writers_removed,
    )
