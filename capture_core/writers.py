"""A server process as the writer of one capture directory: its token, lock and failure log.

When a capture server starts it registers in the directory:

- ``.writers/<token>.lock``: created and held under an exclusive ``flock`` for the life of the
  process (with the pid, host and start time inside, for people). Readers take the lock to
  tell a live writer from a dead one (:func:`capture_core.pending.writer_alive`).
- ``.failures/<token>.jsonl``: the failure log, opened at start-up and kept open, with disk
  space reserved beyond its end. When a call's line cannot be written (no descriptors left, no
  inodes, no space), a :class:`~capture_core.records.CaptureFailure` line goes here: that needs
  no new descriptor, no new inode and, within the reservation, no new block. A restart opens a
  new log and never touches the old ones.
- ``.pending/<token>.slots``: the marks of its calls in flight, one fixed slot each (see
  :mod:`capture_core.pending`), written with one ``pwrite`` per mark and per unmark.
- ``.facts/<token>.jsonl``: the facts journal (:mod:`capture_core.facts_journal`), one entry
  per captured line, which lets readers build rows without reading the lines' bodies (written
  by the capture server's appender process, :mod:`capture_core.appender`).

One spare descriptor is kept open too: when an append fails for want of descriptors, it is
closed to make room for one more try.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

import orjson

from capture_core._appending import Appended
from capture_core._locking import directory_fd, fsync_dir, open_in, write_all
from capture_core._spare import OUT_OF_DESCRIPTORS, Spare
from capture_core.facts_journal import FactsJournal
from capture_core.pending.slots import (
    LOCK_SUFFIX,
    PENDING_DIR,
    SLOT_SIZE,
    SLOTS_SUFFIX,
    WRITERS_DIR,
    blank_slot,
    slot_bytes,
)
from capture_core.records import CaptureFailure

__all__ = ["FAILURES_DIR", "FAILURE_LOG_SUFFIX", "CaptureWriter"]

FAILURES_DIR: Final = ".failures"
FAILURE_LOG_SUFFIX: Final = ".jsonl"
RESERVED_BYTES: Final = 1 << 20  # ~4,000 failure lines
SLOTS_AT_START: Final = 64  # grown by as many again whenever all are in use
_FALLOC_FL_KEEP_SIZE: Final = 1
_NEW_FILE: Final = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW

T = TypeVar("T")


def _reserve(fd: int, size: int) -> bool:
    """Allocate ``size`` bytes past the end of ``fd`` without growing it (Linux; best effort)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError):
        return False
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    start = os.fstat(fd).st_size
    return bool(fallocate(fd, _FALLOC_FL_KEEP_SIZE, start, size) == 0)


def out_of_descriptors(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is an ``EMFILE``/``ENFILE`` error."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in OUT_OF_DESCRIPTORS:
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


class CaptureWriter:
    """This process, registered as a writer of the capture directory ``root``.

    Args:
        root: the capture directory (it must exist).
        reserve_bytes: disk space reserved for the failure log.
        segment_bytes: facts journal bytes between runs of ``ngcapture compact`` (0: never).
        journal: keep the facts journal here; ``False`` when another process writes it (the
            capture server's appender, which journals the lines it appends under this token).

    Raises:
        OSError: the registration files cannot be created.

    Example:
        >>> writer = CaptureWriter(Path("/tmp/model-calls"))  # doctest: +SKIP
        >>> writer.mark("0-0", "c0ffee"); writer.unmark("0-0", "c0ffee")  # doctest: +SKIP
    """

    def __init__(
        self,
        root: Path,
        *,
        reserve_bytes: int = RESERVED_BYTES,
        segment_bytes: int = 0,
        journal: bool = True,
    ) -> None:
        self.root = Path(root)
        self.token = uuid.uuid4().hex
        for name in (PENDING_DIR, WRITERS_DIR, FAILURES_DIR):
            (self.root / name).mkdir(exist_ok=True)
        lock_name = f"{self.token}{LOCK_SUFFIX}"
        # Locked under a name no reader looks at, then renamed into place: a lock file that a
        # reader (or a sweep) can see is always held, so a starting server never looks dead.
        # Every file is opened in its folder, neither of them a symlink.
        with directory_fd(self.root / WRITERS_DIR) as writers:
            self._lock_fd = os.open(f"{lock_name}.new", _NEW_FILE, 0o644, dir_fd=writers)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            about = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
            write_all(self._lock_fd, orjson.dumps(about) + b"\n")
            os.rename(f"{lock_name}.new", lock_name, src_dir_fd=writers, dst_dir_fd=writers)
        self.failure_log = self.root / FAILURES_DIR / f"{self.token}{FAILURE_LOG_SUFFIX}"
        self._failures = open_in(
            self.failure_log.parent, self.failure_log.name, os.O_WRONLY | os.O_CREAT | os.O_APPEND
        )
        self.reserved = reserve_bytes > 0 and _reserve(self._failures, reserve_bytes)
        os.fsync(self._failures)
        for name in (FAILURES_DIR, WRITERS_DIR):
            fsync_dir(self.root / name)
        self.slots_path = self.root / PENDING_DIR / f"{self.token}{SLOTS_SUFFIX}"
        self._slots = open_in(self.slots_path.parent, self.slots_path.name, _NEW_FILE)
        self._slot_lock = threading.Lock()
        self._free: list[int] = []
        self._in_use: dict[tuple[str, str], int] = {}
        self._grow()
        fsync_dir(self.root / PENDING_DIR)
        self._spare = Spare()
        self._failure_lock = threading.Lock()
        self.journal = (
            FactsJournal(self.root, self.token, segment_bytes=segment_bytes) if journal else None
        )

    def _grow(self) -> None:
        """Add as many blank slots as there are (at least :data:`SLOTS_AT_START`)."""
        count = max(SLOTS_AT_START, len(self._free) + len(self._in_use))
        start = os.fstat(self._slots).st_size // SLOT_SIZE
        os.pwrite(self._slots, blank_slot() * count, start * SLOT_SIZE)
        self._free.extend(range(start + count - 1, start - 1, -1))

    def mark(self, rollout_id: str, model_call_id: str) -> bool:
        """Mark the call pending (one ``pwrite``); ``False`` (never raises OSError) if that
        failed. Raises ``ValueError`` for an id that could not be a marker."""
        data = slot_bytes(rollout_id, model_call_id)
        with self._slot_lock:
            try:
                if not self._free:
                    self._grow()
                index = self._free.pop()
                os.pwrite(self._slots, data, index * SLOT_SIZE)
            except OSError:
                return False
            self._in_use[(rollout_id, model_call_id)] = index
        return True

    def unmark(self, rollout_id: str, model_call_id: str) -> None:
        """Clear the call's mark (an unmarked call is fine).

        Raises:
            OSError: the slot could not be cleared (it stays marked; the caller logs it).
        """
        with self._slot_lock:
            index = self._in_use.pop((rollout_id, model_call_id), None)
            if index is None:
                return
            try:
                os.pwrite(self._slots, blank_slot(), index * SLOT_SIZE)
            except OSError:
                self._in_use[(rollout_id, model_call_id)] = index
                raise
            self._free.append(index)

    def with_spare_descriptor(self, action: Callable[[], T]) -> T:
        """Run ``action`` with the spare descriptor freed (one more can be opened meanwhile)."""
        return self._spare.freed(action)

    def note_facts(self, rollout_file: str, appended: Appended, line: Mapping[str, Any]) -> None:
        """Journal a line just appended to ``rollout_file`` (never raises; nothing without a
        journal)."""
        if self.journal is not None:
            self.journal.note(rollout_file, appended, line)

    def record_failure(self, failure: CaptureFailure) -> None:
        """Append one failure to the log and make it durable.

        Raises:
            OSError: the log itself could not be written (the caller logs it).
        """
        line = orjson.dumps(failure.model_dump(mode="json")) + b"\n"
        with self._failure_lock:
            write_all(self._failures, line)
            os.fdatasync(self._failures)

    def close(self) -> None:
        """Close the registration. Idempotent. With no call left marked, its lock and slots
        files go too; otherwise they stay, since the marked calls' writes never landed
        (:func:`~capture_core.pending.sweep_markers` reports and removes them). The failure log
        always stays; the space reserved beyond its end is given back."""
        tidy = getattr(self, "_slots", None) is not None and not self._in_use
        journal = getattr(self, "journal", None)
        if journal is not None:
            journal.close()
        if getattr(self, "_failures", None) is not None:
            with contextlib.suppress(OSError):  # cut at its own size: frees the reservation
                os.ftruncate(self._failures, os.fstat(self._failures).st_size)
        spare = getattr(self, "_spare", None)
        if spare is not None:
            spare.close()
        for name in ("_failures", "_slots", "_lock_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                setattr(self, name, None)
                with contextlib.suppress(OSError):
                    os.close(fd)
        if tidy:
            for path in (self.slots_path, self.root / WRITERS_DIR / f"{self.token}{LOCK_SUFFIX}"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
