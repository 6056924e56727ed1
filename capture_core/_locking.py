"""File-descriptor helpers for the capture store: locked opens, whole writes, directory fsync.

Every capture file is guarded by a BSD ``flock`` on the file itself. Because ``clear`` unlinks a
file while holding its exclusive lock, whoever waits for a lock must check, once it holds it,
that its descriptor still names the file at the path; otherwise it would read a removed file or
append to an unlinked inode where the line is lost. :func:`locked_fd` does that check and
reopens (a bounded number of times) when the file was replaced. Appending lines under that
lock is :mod:`capture_core._appending`.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "LockedFd",
    "directory_fd",
    "fsync_dir",
    "locked_fd",
    "open_in",
    "os_reason",
    "read_locked",
    "unlink_if_present",
    "write_all",
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
