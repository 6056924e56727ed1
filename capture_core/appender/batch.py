"""Appending a batch of lines: every file's lines written first, then each file made durable.

``fsync`` on ext4 and XFS commits the file system's journal, which carries the metadata of
every file written since the last commit: when 60 calls' lines are written to 60 files first
and then fsynced one file after another, the first ``fsync`` pays for most of the others.
Each file is still fsynced before any of its lines is reported written, so a line reported
written is durable whatever the file system. A file's lines are written under its exclusive
lock, one ``write`` each, and the lock is held until the file is durable.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final, TypeVar

from capture_core._locking import Appended, PendingAppend, fsync_dir, write_lines
from capture_core.appender.frames import Request
from capture_core.ids import is_capture_file_name

__all__ = ["FILES_PER_COMMIT", "Outcome", "Spare", "append_batch"]

#: Files held open and locked at once by one batch (a larger batch is cut into several).
FILES_PER_COMMIT: Final = 64
_OUT_OF_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE})

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one request ended: where its line landed, or why it did not."""

    request: Request
    appended: Appended | None
    error: OSError | None = None


class Spare:
    """One descriptor kept open, closed to make room for one more try when an open fails for
    want of descriptors (then opened again)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._reopen()

    def _reopen(self) -> None:
        try:
            self._fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def retrying(self, action: Callable[[], T]) -> T:
        try:
            return action()
        except OSError as exc:
            if exc.errno not in _OUT_OF_DESCRIPTORS:
                raise
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            try:
                return action()
            finally:
                self._reopen()


def append_batch(
    root: str, requests: Sequence[Request], *, wait: bool, spare: Spare
) -> tuple[list[Outcome], list[list[Request]]]:
    """Append every request's line to its file in ``root``.

    Args:
        root: the capture directory.
        requests: in the order their lines go into each file.
        wait: wait for a file's lock; ``False`` leaves the requests of a file another process
            holds locked to the caller (returned as one group per file, untouched).
        spare: the descriptor given up to retry an open that found none left.

    Returns:
        The outcome of every request not left over, and the groups left over.
    """
    groups: dict[str, list[Request]] = {}
    for request in requests:
        groups.setdefault(request.name, []).append(request)
    outcomes: list[Outcome] = []
    blocked: list[list[Request]] = []
    names = list(groups)
    for start in range(0, len(names), FILES_PER_COMMIT):
        chunk = [groups[name] for name in names[start : start + FILES_PER_COMMIT]]
        outcomes += _commit_chunk(root, chunk, wait=wait, spare=spare, blocked=blocked)
    return outcomes, blocked


def _commit_chunk(
    root: str,
    groups: list[list[Request]],
    *,
    wait: bool,
    spare: Spare,
    blocked: list[list[Request]],
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    written: list[tuple[list[Request], PendingAppend]] = []
    for group in groups:
        name = group[0].name
        if not is_capture_file_name(name):  # nothing else, and nowhere else
            refused = OSError(errno.EINVAL, f"not a capture file name: {name!r}")
            outcomes += [Outcome(request, None, refused) for request in group]
            continue
        lines = [request.line for request in group]
        path = f"{root}/{name}"
        try:
            written.append((group, spare.retrying(partial(write_lines, path, lines, wait=wait))))
        except BlockingIOError:
            blocked.append(group)
        except OSError as exc:
            outcomes += [Outcome(request, None, exc) for request in group]
    created: list[tuple[int, int]] = []  # where a new file's outcomes start, how many
    for group, pending in written:
        try:
            appended = pending.commit()
        except OSError as exc:
            outcomes += [Outcome(request, None, exc) for request in group]
            continue
        if appended[0].created:
            created.append((len(outcomes), len(group)))
        outcomes += [Outcome(r, a) for r, a in zip(group, appended, strict=True)]
    if created:
        # A new file's name must be durable too before its line is reported written.
        try:
            fsync_dir(root)
        except OSError as exc:
            for start, count in created:
                for at in range(start, start + count):
                    outcomes[at] = Outcome(outcomes[at].request, None, exc)
    return outcomes
