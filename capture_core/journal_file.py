"""A facts journal's file: one writer's entries, appended whole, and its compaction.

The entries' meaning is in :mod:`capture_core.facts_journal`. This module is the part that
writes them, kept free of the models and dialects so the capture server's appender process
(:mod:`capture_core.appender`) starts in a few tens of milliseconds.

Each time the journal has grown by ``segment_bytes``, and when it is closed with entries written
since the last run began and a size of at least :data:`CLOSE_SEGMENT_BYTES` (or
``segment_bytes``, if smaller), it starts ``ngcapture compact`` on itself in a separate process
(its own session, output discarded): that writes columnar segments of the entries
(``ngcapture_viz.load.journal_segments``), which a cold open reads instead of decoding them.
The writer never waits for it and never imports Polars; while it runs, the journal starts no
other (but the last, at close, starts regardless); if it fails, readers decode the lines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Final

import orjson

from capture_core._appending import Appended
from capture_core._locking import open_in, os_reason, write_all

__all__ = [
    "CLOSE_SEGMENT_BYTES",
    "JOURNAL_DIR",
    "JOURNAL_SUFFIX",
    "SEGMENT_BYTES",
    "JournalFile",
    "join_entry",
]

logger = logging.getLogger(__name__)
_write = os.write  # by name, so a test can make it fail without touching ``os``

#: Journal bytes between two runs of ``ngcapture compact`` while the server runs.
SEGMENT_BYTES: Final = 32 * 1024 * 1024
#: A journal this large (or ``segment_bytes``, if smaller) is compacted when it is closed.
CLOSE_SEGMENT_BYTES: Final = 1024 * 1024
#: Compaction processes started and not yet seen to end (kept so they are reaped, not
#: reported as leaked when their ``Popen`` is collected).
_COMPACTORS: list[subprocess.Popen[bytes]] = []
_COMPACTORS_LOCK = threading.Lock()

JOURNAL_DIR: Final = ".facts"
JOURNAL_SUFFIX: Final = ".jsonl"


def join_entry(file_name: str, appended: Appended, fields: bytes) -> bytes | None:
    """The journal line for a line just appended to ``file_name``: where it landed, then
    ``fields`` (the line's envelope and facts, a JSON object encoded by
    :func:`capture_core.facts_journal.journal_fields`); ``None`` when another writer's bytes
    came between (a writer that takes no lock appended meanwhile: the file reads its lines)."""
    if appended.size != appended.offset + appended.length + 1:
        return None
    where = orjson.dumps({
        "file": file_name,
        "offset": appended.offset,
        "length": appended.length,
        "size": appended.size,
        "mtime_ns": appended.mtime_ns,
        "inode": appended.inode,
        # The file as the append found it: a reader chains each entry to the one before,
        # so a change made between two appends (which the second one's mtime hides) shows.
        "size_before": appended.size_before,
        "mtime_before_ns": appended.mtime_before_ns,
    })  # fmt: skip
    rest = fields[1:].rstrip(b"\n")
    return where[:-1] + (b"," + rest if rest != b"}" else b"}") + b"\n"


class JournalFile:
    """A writer's facts journal file, opened once and appended to (by threads or the capture
    server's appender process).

    Writing entries never raises: a failure is counted (``failures``) and the entries are lost,
    which only means their files are read from their lines.
    """

    def __init__(self, root: Path, token: str, *, segment_bytes: int = 0) -> None:
        directory = Path(root) / JOURNAL_DIR
        self.path = directory / f"{token}{JOURNAL_SUFFIX}"
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        self._fd: int | None = None
        self._lock = threading.Lock()
        self.failures = 0
        #: Journal bytes between runs of ``ngcapture compact`` (0, the default outside the
        #: server, whose setting is :data:`SEGMENT_BYTES`: never run it).
        self.segment_bytes = segment_bytes
        # Bytes written since a run last started, and the count that makes ``note`` look for
        # whether to start one (read and added without a lock: this runs per call; a lost
        # update only delays the next run).
        self._unsegmented = 0
        self._next_check = segment_bytes
        self._compactor: subprocess.Popen[bytes] | None = None
        #: How many times ``ngcapture compact`` was started (or tried) for this journal.
        self.compactions = 0
        try:
            directory.mkdir(exist_ok=True)
            self._fd = _open_in(directory, self.path.name, flags)
        except OSError as exc:  # a cache: the server runs without it, readers read the lines
            logger.warning("no facts journal in %s (%s): readers will read every line",
                           directory, os_reason(exc))  # fmt: skip

    def write(self, entries: bytes) -> None:
        """Append ``entries`` (whole journal lines) in one ``write`` (never raises)."""
        fd = self._fd
        if fd is None or not entries:
            return
        try:
            written = _write(fd, entries)  # one write: O_APPEND keeps it whole
        except OSError as exc:
            self._failed(os_reason(exc))
            return
        if written != len(entries):  # short (disk full): end it so the next entry stays whole
            with contextlib.suppress(OSError):
                write_all(fd, b"\n")
            self._failed(f"short write ({written} of {len(entries)} bytes)")
        self._unsegmented += written
        if self.segment_bytes and self._unsegmented >= self._next_check:
            self._compact()

    def _compact(self, *, last: bool = False) -> None:
        """Start ``ngcapture compact`` on the journal unless one is still running for it
        (``last``: the server stops; start it anyway, so the entries written since the
        running one began are covered too: two runs may cut different stretches, each
        segment is renamed into place whole, and a reader chains the longest)."""
        with self._lock:
            running = self._compactor
            if not last and running is not None and running.poll() is None:
                # Looked at again after another eighth of the interval, not at every call.
                self._next_check = self._unsegmented + max(1, self.segment_bytes // 8)
                return
            self._unsegmented = 0
            self._next_check = self.segment_bytes
            self.compactions += 1
            try:
                self._compactor = _start_compactor(self.path)
            except OSError as exc:  # no process to spare: readers decode the lines
                self._compactor = None
                logger.warning("could not start ngcapture compact on %s (%s)", self.path,
                               os_reason(exc))  # fmt: skip

    def _failed(self, reason: str) -> None:
        """Count a lost entry; the first is logged (its file is only read more slowly)."""
        with self._lock:
            self.failures += 1
            first = self.failures == 1
        if first:
            logger.warning("a facts journal entry was lost (%s); later losses are counted "
                           "in FactsJournal.failures", reason)  # fmt: skip

    def close(self) -> None:
        """Close the journal (idempotent); it stays on disk for readers. Call it once no
        thread is in ``write`` (the server joins its writer threads first)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        size = 0
        with contextlib.suppress(OSError):
            size = os.fstat(fd).st_size
        with contextlib.suppress(OSError):
            os.close(fd)
        # Large enough to be worth a process, and written to since the last run began.
        if (
            self.segment_bytes
            and self._unsegmented
            and size >= min(self.segment_bytes, CLOSE_SEGMENT_BYTES)
        ):
            self._compact(last=True)


def _open_in(directory: Path, name: str, flags: int) -> int:
    """Open ``name`` in ``directory``, neither of them a symlink (a planted ``.facts`` link
    must not send entries elsewhere); an earlier writer's torn last entry (it died mid-write)
    is closed with a newline, so the first entry written now reads whole."""
    fd = open_in(directory, name, flags)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            write_all(fd, b"\n")
    except OSError:
        os.close(fd)
        raise
    return fd


def _start_compactor(journal: Path) -> subprocess.Popen[bytes]:
    """``ngcapture compact --quiet --low-priority JOURNAL`` in a process of its own session
    (it outlives a server that stops), output discarded; earlier ones that ended are reaped."""
    with _COMPACTORS_LOCK:
        _COMPACTORS[:] = [process for process in _COMPACTORS if process.poll() is None]
        process = subprocess.Popen(
            # -P: nothing imported from the working directory (whoever can write there).
            [
                sys.executable,
                "-P",
                "-m",
                "capture_core.cli",
                "compact",
                "--quiet",
                "--low-priority",
                str(journal),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _COMPACTORS.append(process)
    return process
