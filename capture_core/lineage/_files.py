"""Ledger file operations, each run while the caller holds the rollout's lock."""

from __future__ import annotations

import logging
import os
from contextlib import suppress
from pathlib import Path
from typing import Final

from capture_core._locking import fsync_dir, write_all
from capture_core.lineage._rows import LedgerRows, parse_ledger

__all__ = ["append_row_line", "read_ledger", "touch_synced"]

_log = logging.getLogger("capture_core.lineage")

_FILE_MODE: Final = 0o644
_OPEN: Final = os.O_CLOEXEC | os.O_NOFOLLOW


def read_ledger(path: Path) -> LedgerRows:
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
    except FileNotFoundError:
        return LedgerRows()
    with os.fdopen(fd, "rb") as file:
        return parse_ledger(file.read(), path)


def append_row_line(path: Path, line: bytes, torn_bytes: int) -> None:
    """Append one line and fsync; cut a torn tail first; sync the directory on creation."""
    try:
        fd, created = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, _FILE_MODE), True
    except FileExistsError:
        fd, created = os.open(path, os.O_WRONLY | _OPEN), False
    try:
        size = os.fstat(fd).st_size
        if torn_bytes:
            size -= torn_bytes
            os.ftruncate(fd, size)
            _log.warning("cut a torn last line (%d bytes) from %s", torn_bytes, path)
        try:
            os.lseek(fd, size, os.SEEK_SET)
            write_all(fd, line)
            os.fsync(fd)
        except OSError:
            with suppress(OSError):
                os.ftruncate(fd, size)  # we hold the lock: every byte past size is ours
            raise
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


def touch_synced(path: Path) -> None:
    """Create ``path`` if missing and fsync it (an existing fence may not be synced yet)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | _OPEN, _FILE_MODE)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
