"""Capture writes in flight, visible to every process that shares the capture directory.

A server marks each captured call as pending when it starts and unmarks it once its line is
durable (or its failure recorded). Its marks live in one file of its own,
``<dir>/.pending/<writer>.slots``: fixed slots of :data:`SLOT_SIZE` bytes, each blank or
holding ``<rollout_id>@<model_call_id>`` (space-padded, newline-terminated, so ``cat`` shows
them). Marking is one ``pwrite`` into a file opened at start-up: no file is created per call,
and marking works when the process has no descriptor left. ``<writer>`` is the server's token
(see :mod:`capture_core.writers`).

A reader tells a live write from a lost one by the writer's lock: every server holds an
exclusive ``flock`` on ``<dir>/.writers/<writer>.lock`` for as long as it runs, so a lock that
can be taken (or a lock file that is gone) means the writer died and its marked calls will never
land (:attr:`PendingCall.lost`). A marker whose line did land (the writer died between the two)
is not evidence of a loss: :func:`sweep_markers` removes it, and readers that have the capture
file skip it. A collector about to rerun a rollout under the same id removes that rollout's
lost marks (:func:`forget_lost`): they belong to the attempt it archives, not to the rerun.

Markers of older versions, one empty file per call named ``<rollout_id>@<model_call_id>``
(optionally ``@<writer>``), are still read; without a writer they count as live.
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
    "SLOTS_SUFFIX",
    "SLOT_SIZE",
    "WRITERS_DIR",
    "PendingCall",
    "SweepReport",
    "all_pending_writes",
    "blank_slot",
    "forget_lost",
    "mark_pending",
    "marker_name",
    "pending_calls",
    "pending_marker",
    "pending_writes",
    "slot_bytes",
    "sweep_markers",
    "unmark_pending",
    "wait_for_pending",
    "writer_alive",
]

PENDING_DIR: Final = ".pending"
WRITERS_DIR: Final = ".writers"
LOCK_SUFFIX: Final = ".lock"
SLOTS_SUFFIX: Final = ".slots"
SLOT_SIZE: Final = 256  # a 200-character id, '@', a call id, padding and '\n'
_SEPARATOR: Final = "@"
_CALL_ID: Final = re.compile(r"^[A-Za-z0-9._-]+$")
_BLANK: Final = b" " * (SLOT_SIZE - 1) + b"\n"

WriterState = Literal["live", "dead", "unknown"]


def _check_token(value: str, what: str) -> str:
    if not value or not value.isascii() or not value.isalnum():
        raise ValueError(f"{what} must be ASCII letters and digits, got {value!r}")
    return value


def marker_name(rollout_id: str, model_call_id: str, writer: str | None = None) -> str:
    """The text of one call's marker (validated: never a path).

    Example:
        >>> marker_name("3-2", "c0ffee", "w1")
        '3-2@c0ffee@w1'
    """
    parts = [validate_rollout_id(rollout_id), _check_token(model_call_id, "model_call_id")]
    if writer is not None:
        parts.append(_check_token(writer, "writer token"))
    return _SEPARATOR.join(parts)


def slot_bytes(rollout_id: str, model_call_id: str) -> bytes:
    """The bytes of one slot marking a call (validated).

    Example:
        >>> slot_bytes("3-2", "c0ffee").rstrip()
        b'3-2@c0ffee'
    """
    text = marker_name(rollout_id, model_call_id).encode("ascii")
    if len(text) >= SLOT_SIZE:
        raise ValueError(f"a marker of {len(text)} bytes does not fit a slot")
    return text.ljust(SLOT_SIZE - 1) + b"\n"


def blank_slot() -> bytes:
    """The bytes of a free slot."""
    return _BLANK


def pending_marker(
    root: Path, rollout_id: str, model_call_id: str, writer: str | None = None
) -> Path:
    """Where an older version's per-call marker file lives (it may or may not exist)."""
    return Path(root) / PENDING_DIR / marker_name(rollout_id, model_call_id, writer)


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


def _parse_marker(text: str) -> tuple[str, str, str | None] | None:
    rollout_id, sep, rest = text.partition(_SEPARATOR)
    if not sep or not is_valid_rollout_id(rollout_id):
        return None
    call_id, _, writer = rest.partition(_SEPARATOR)
    # Read tolerantly (other writers' call ids may carry '-', '_' or '.'); written strictly.
    if not call_id or not _CALL_ID.match(call_id) or (writer and not writer.isalnum()):
        return None
    return rollout_id, call_id, writer or None


def _slot_marks(data: bytes, needle: bytes | None) -> list[tuple[int, str, str]]:
    """The ``(offset, rollout_id, model_call_id)`` marked in a slots file's bytes."""
    if needle is not None and needle not in data:
        return []  # the common case for a rollout: nothing of it here
    found = []
    for start in range(0, len(data) - SLOT_SIZE + 1, SLOT_SIZE):
        slot = data[start : start + SLOT_SIZE]
        if slot == _BLANK or not slot.strip(b" \n\0"):
            continue
        parsed = _parse_marker(slot.rstrip(b" \n\0").decode("ascii", "replace"))
        # A slot read while its writer rewrites it may be torn: one that does not parse is
        # skipped; one that does may name a shortened id. Either belongs to a live writer (a
        # dead one writes nothing more), so it only changes what one poll of a wait sees.
        if parsed is not None and parsed[2] is None:
            found.append((start, parsed[0], parsed[1]))
    return found


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
