"""File-descriptor helpers for the capture store: locked opens, whole writes, directory fsync.

Every capture file is guarded by a BSD ``flock`` on the file itself. Because ``clear`` unlinks a
file while holding its exclusive lock, whoever waits for a lock must check, once it holds it,
that its descriptor still names the file at the path; otherwise it would read a removed file or
append to an unlinked inode where the line is lost. :func:`locked_fd` does that check and
reopens (a bounded number of times) when the file was replaced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple

__all__ = [
    "Appended",
    "LockedFd",
    "PendingAppend",
    "append_line",
    "directory_fd",
    "fsync_dir",
    "locked_fd",
    "open_in",
    "os_reason",
    "read_locked",
    "unlink_if_present",
    "write_all",
    "write_lines",
]

_MAX_REOPENS: Final = 64
_FILE_MODE: Final = 0o644


@dataclass(frozen=True, slots=True)
class LockedFd:
    """An open descriptor holding a lock on the file currently at its path.

    Attributes:
        fd: the descriptor.
        created: whether this open created the file.
        size: the file's size when the lock was taken.
        mtime_ns: its mtime then.
    """

    fd: int
    created: bool
    size: int
    mtime_ns: int = 0


@contextmanager
def locked_fd(
    path: str | os.PathLike[str], flags: int, *, exclusive: bool, create: bool
) -> Iterator[LockedFd | None]:
    """Open ``path``, lock it, and yield it; unlock and close on exit.

    Args:
        path: the file to open.
        flags: ``os.open`` access flags (``O_CLOEXEC`` is added; ``O_CREAT`` when ``create``).
        exclusive: take ``LOCK_EX`` rather than ``LOCK_SH``.
        create: create the file when missing; otherwise yield ``None`` for a missing file.

    Raises:
        OSError: from the system calls, or ``EAGAIN`` when the file kept being replaced.

    Example:
        >>> with locked_fd(Path("/tmp/x.capture.jsonl"), os.O_RDONLY,
        ...                exclusive=False, create=False) as held:
        ...     pass
    """
    # O_NOFOLLOW: a symlink planted at a capture path must not redirect writes elsewhere.
    held = _open_current(
        os.fspath(path), flags | os.O_CLOEXEC | os.O_NOFOLLOW, exclusive=exclusive, create=create
    )
    if held is None:
        yield None
        return
    try:
        yield held
    finally:
        try:  # unlock explicitly: a process forked meanwhile may share the descriptor
            fcntl.flock(held.fd, fcntl.LOCK_UN)
        finally:
            os.close(held.fd)


def _open_current(
    path: str, flags: int, *, exclusive: bool, create: bool, wait: bool = True
) -> LockedFd | None:
    lock = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
    for _ in range(_MAX_REOPENS):
        opened = _open(path, flags, create=create)
        if opened is None:
            if create:
                continue  # created and removed by others between our opens: try again
            return None
        fd, created = opened
        try:
            fcntl.flock(fd, lock)
            held = _current_stat(fd, path)
            if held is not None:
                return LockedFd(fd, created, held.st_size, held.st_mtime_ns)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # replaced or removed while we waited: closing drops the lock
    raise OSError(errno.EAGAIN, f"file replaced {_MAX_REOPENS} times while waiting for its lock")


def _open(path: str, flags: int, *, create: bool) -> tuple[int, bool] | None:
    """Open an existing file (the common case: one system call), else create it."""
    try:
        return os.open(path, flags), False
    except FileNotFoundError:
        if not create:
            return None
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, _FILE_MODE), True
    except FileExistsError:
        return None  # another writer created it first: open it on the next round


def _current_stat(fd: int, path: str) -> os.stat_result | None:
    """``fstat`` of the file ``fd`` holds, or ``None`` when it is no longer the one at ``path``."""
    held = os.fstat(fd)
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return None
    if (held.st_ino, held.st_dev) != (current.st_ino, current.st_dev):
        return None
    return held


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


def read_locked(path: str | os.PathLike[str]) -> bytes | None:
    """All bytes of ``path``, read under a shared lock; ``None`` when it does not exist.

    Example:
        >>> read_locked(Path("/tmp/missing.capture.jsonl")) is None
        True
    """
    with locked_fd(path, os.O_RDONLY, exclusive=False, create=False) as held:
        if held is None:
            return None
        chunks: list[bytes] = []
        while chunk := os.read(held.fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)


def unlink_if_present(path: Path) -> bool:
    """Remove ``path``; a missing file is fine. Tells whether something was removed.

    Example:
        >>> unlink_if_present(Path("/tmp/missing.capture.incomplete"))
        False
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``, looping on short writes.

    Example:
        >>> write_all(fd, b'{"a": 1}\\n')  # doctest: +SKIP
    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write returned no progress")
        view = view[written:]


@contextmanager
def directory_fd(directory: str | os.PathLike[str]) -> Iterator[int]:
    """A descriptor of ``directory``, which must not be a symlink (a planted link must not send
    the files opened through it elsewhere); closed on exit.

    Raises:
        OSError: ``ELOOP``/``ENOTDIR`` for a symlink or a non-directory, or the OS's reason.
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def open_in(directory: str | os.PathLike[str], name: str, flags: int, mode: int = 0o644) -> int:
    """Open ``name`` in ``directory``, neither of them a symlink (see :func:`directory_fd`).

    Example:
        >>> fd = open_in(Path("/tmp"), "x.jsonl", os.O_WRONLY | os.O_CREAT)  # doctest: +SKIP
    """
    with directory_fd(directory) as folder:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make the entries of ``directory`` (created or removed files) durable.

    Example:
        >>> fsync_dir(Path("/tmp"))
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def os_reason(exc: OSError) -> str:
    """Name an OS error briefly, e.g. ``"ENOSPC: No space left on device"``.

    Example:
        >>> os_reason(OSError(errno.ENOSPC, "No space left on device"))
        'ENOSPC: No space left on device'
    """
    if exc.errno is None:
        return str(exc)
    name = errno.errorcode.get(exc.errno, f"errno {exc.errno}")
    return f"{name}: {exc.strerror or os.strerror(exc.errno)}"
