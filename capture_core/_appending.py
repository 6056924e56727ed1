"""Appends to capture files: lines written under the file's exclusive ``flock``, then fsynced.

The file is opened and locked as :func:`capture_core._locking.locked_fd` does it (checked, once
locked, to be the file at its path). If it ends without a newline (a writer died mid-line), a
newline is written first so the torn line is closed. :func:`write_lines` leaves the lines
unsynced in a :class:`PendingAppend`, which keeps the file locked until they are durable, so
several files' lines can share one journal commit of the file system (group commit).
:func:`append_line` does it all for one line; a file that was new or empty has its directory
fsynced too before the lock is released. If a write or an fsync fails, the file is cut back to its
previous length, so a failed append leaves no half line behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Sequence
from typing import NamedTuple

from capture_core._locking import LockedFd, _open_current, fsync_dir, write_all

__all__ = ["Appended", "PendingAppend", "append_line", "write_lines"]


class Appended(NamedTuple):
    """Where an appended line landed, and the file as the append left it."""

    written: int  # bytes appended (the line, and a newline closing a torn one before it)
    created: bool  # this append created the file
    offset: int  # where the line starts
    size: int  # the file's size, mtime and inode right after the append
    mtime_ns: int
    inode: int
    length: int = 0  # the line's length without its newline
    size_before: int = 0  # the file's size and mtime when the append took its lock
    mtime_before_ns: int = 0


class PendingAppend:
    """Lines written to one capture file, not yet durable: the file stays locked until
    :meth:`release` (or :meth:`abort`), so no other writer's line lands among them.

    Writing several files' lines first and syncing them after lets one journal commit of the
    file system carry them all: the first ``fsync`` pays for the others (group commit). A
    file's lock is kept until everything its lines need is durable (the directory too, for a
    new file), so nobody can report a line of it durable any earlier.
    """

    __slots__ = ("_held", "_lines", "_released")

    def __init__(self, held: LockedFd, lines: list[tuple[int, int, int, int]]) -> None:
        self._held = held
        # (line offset, length without newline, bytes written, file size before the write)
        self._lines = lines
        self._released = False

    @property
    def empty_before(self) -> bool:
        """The file was created by this append, or found empty (its creator may have died
        before its name was made durable)."""
        return self._held.created or self._held.size == 0

    def sync(self) -> list[Appended]:
        """``fsync`` the file (it stays locked); where each line landed, in order.

        Raises:
            OSError: the ``fsync`` failed; every line of this batch is cut off again (the file
                ends where it did before) and the file is released.
        """
        held = self._held
        try:
            os.fsync(held.fd)
            after = os.fstat(held.fd)
        except OSError:
            self.abort()
            raise
        # Each line's entry says how it left the file and how the file was when it began, so
        # a reader can chain them; the last one is the file as this lock leaves it. Offsets
        # are where the writes went (``O_APPEND``), so a writer that takes no lock and wrote
        # between two of them breaks the chain instead of going unseen.
        appended: list[Appended] = []
        mtime_before = held.mtime_ns
        last = len(self._lines) - 1
        for index, (offset, length, written, size_before) in enumerate(self._lines):
            size = after.st_size if index == last else offset + length + 1
            appended.append(Appended(
                written, held.created and index == 0, offset, size, after.st_mtime_ns,
                after.st_ino, length, size_before, mtime_before,
            ))  # fmt: skip
            mtime_before = after.st_mtime_ns
        return appended

    def commit(self) -> list[Appended]:
        """:meth:`sync`, then :meth:`release`.

        Raises:
            OSError: as :meth:`sync`.
        """
        appended = self.sync()
        self.release()
        return appended

    def abort(self) -> None:
        """Cut the lines off again and release the file (they are reported as not written)."""
        if self._released:
            return
        try:
            # We still hold the lock, so every byte past ``size`` is ours. If the cut fails
            # too, the original error is what matters; a torn line reads as damaged.
            with contextlib.suppress(OSError):
                os.ftruncate(self._held.fd, self._held.size)
        finally:
            self.release()

    def release(self) -> None:
        """Unlock and close the file (idempotent; never raises: what was synced stays so, and
        closing the descriptor drops the lock whatever ``LOCK_UN`` said)."""
        if self._released:
            return
        self._released = True
        try:  # unlock explicitly: a process forked meanwhile may share the descriptor
            with contextlib.suppress(OSError):
                fcntl.flock(self._held.fd, fcntl.LOCK_UN)
        finally:
            with contextlib.suppress(OSError):
                os.close(self._held.fd)


def write_lines(
    path: str | os.PathLike[str], lines: Sequence[bytes], *, wait: bool = True
) -> PendingAppend:
    """Append ``lines`` (each ending in a newline) to ``path`` under its exclusive lock,
    without ``fsync``: :meth:`PendingAppend.sync` makes them durable, and the file stays locked
    until :meth:`PendingAppend.release`.

    If the file ends without a newline (a writer died mid-line), a newline is written first so
    the torn line is closed and the new lines stay readable.

    Args:
        path: the capture file (created when missing).
        lines: the encoded lines.
        wait: wait for the lock; ``False`` raises ``BlockingIOError`` when another holds it.

    Raises:
        OSError: the file could not be opened, locked or written (nothing of ``lines`` stays).
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW  # read: the last byte
    held = _open_current(os.fspath(path), flags, exclusive=True, create=True, wait=wait)
    if held is None:  # cannot happen with create=True; keeps the type narrow
        raise FileNotFoundError(errno.ENOENT, "capture file vanished", os.fspath(path))
    written: list[tuple[int, int, int, int]] = []
    pending = PendingAppend(held, written)
    try:
        closes_torn = bool(held.size) and os.pread(held.fd, 1, held.size - 1) != b"\n"
        for line in lines:
            data = b"\n" + line if closes_torn else line
            closes_torn = False
            write_all(held.fd, data)
            end = os.lseek(held.fd, 0, os.SEEK_CUR)  # where O_APPEND put it
            before = end - len(data)
            written.append((end - len(line), len(line) - 1, len(data), before))
    except BaseException:
        pending.abort()
        raise
    return pending


def append_line(path: str | os.PathLike[str], line: bytes) -> Appended:
    """Append ``line`` to ``path`` under its exclusive lock and fsync it.

    If the file ends without a newline (a writer died mid-line), a newline is written first so
    the torn line is closed and ``line`` stays readable. A file that was new or empty has its
    directory fsynced too, before the lock is released. If the write or an fsync fails, the
    file is cut back to its previous length, so a failed append leaves no half line behind.

    Returns:
        The bytes appended, whether this call created the file, where the line starts, and
        the file's size, mtime and inode after the append (one ``fstat`` under the lock).

    Example:
        >>> append_line(Path("/tmp/x.capture.jsonl"), b'{"a": 1}\\n')[:3]  # doctest: +SKIP
        (9, True, 0)
    """
    pending = write_lines(path, (line,))
    (appended,) = pending.sync()
    if pending.empty_before:
        # A new file's name is made durable before its lock is released: nobody can append
        # to it and report that line durable first.
        try:
            fsync_dir(os.path.dirname(os.fspath(path)) or ".")
        except OSError:
            pending.abort()
            raise
    pending.release()
    return appended
