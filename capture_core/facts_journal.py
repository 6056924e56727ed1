"""The facts journal: where each captured line landed, with the facts a reader needs of it.

A capture server appends one entry per captured call to ``.facts/<writer token>.jsonl`` in the
capture directory, right after the call's line is durable: the file, the line's offset and
length, the file's size and mtime as the append found it and its size, mtime and inode as the
append left it, the line's envelope fields (``model_call_id``, ``dialect``, timestamps,
latencies, status, error category, model ref) and its ``ngcapture_facts``. A reader that finds
a capture file exactly as the journal's last entry for it left it (same size, mtime and inode;
every byte covered by the entries, line after line, each append finding the file as the one
before left it) builds that file's rows from the journal and never reads the capture file;
any other file (written by another writer, appended to since, damaged, torn) is read from its
own lines as before. The journal is a cache, not evidence: it is not fsynced, a crash can lose
its last entries (their files are then read the slow way), and deleting it loses nothing.

Only lines a reader would read from their facts get an entry: lines carrying facts of the
current :data:`~capture_core.facts.FACTS_VERSION`. One ``write`` per entry on a descriptor
opened at start-up (``O_APPEND``: entries of concurrent writer threads never interleave).

Each time the journal has grown by ``segment_bytes``, and when the server stops with entries
written since the last run began and a journal of at least :data:`CLOSE_SEGMENT_BYTES` (or
``segment_bytes``, if smaller), the journal starts ``ngcapture compact``
on it in a separate process (its own session, output discarded): that writes columnar
segments of the entries (``ngcapture_viz.load.journal_segments``), which a cold open reads
instead of decoding them. The server never waits for it and never imports Polars; while it
runs, the journal starts no other (but the last, when the server stops, starts regardless);
if it fails, readers decode the lines as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import orjson
from pydantic import BaseModel, ConfigDict, Field

from capture_core._locking import Appended, os_reason, write_all
from capture_core.facts import FACTS_KEY, FACTS_VERSION
from capture_core.records import ModelRef

__all__ = [
    "CLOSE_SEGMENT_BYTES",
    "ENVELOPE_KEYS",
    "JOURNAL_DIR",
    "JOURNAL_SUFFIX",
    "SEGMENT_BYTES",
    "FactsJournal",
    "FactsJournalEntry",
    "journal_entry",
]

logger = logging.getLogger(__name__)
_write = os.write  # by name, so a test can make it fail without touching ``os``

#: Journal bytes between two runs of ``ngcapture compact`` while the server runs.
SEGMENT_BYTES: Final = 32 * 1024 * 1024
#: A journal this large (or ``segment_bytes``, if smaller) is compacted when its server stops.
CLOSE_SEGMENT_BYTES: Final = 1024 * 1024
#: Compaction processes started and not yet seen to end (kept so they are reaped, not
#: reported as leaked when their ``Popen`` is collected).
_COMPACTORS: list[subprocess.Popen[bytes]] = []
_COMPACTORS_LOCK = threading.Lock()

JOURNAL_DIR: Final = ".facts"
JOURNAL_SUFFIX: Final = ".jsonl"
#: The capture line's fields an entry repeats (besides its facts).
ENVELOPE_KEYS: Final = (
    "model_call_id",
    "dialect",
    "model_ref",
    "started_at",
    "completed_at",
    "latency_ms",
    "latency_ttft_ms",
    "status_code",
    "error_category",
)


class FactsJournalEntry(BaseModel):
    """One line of a facts journal (the server writes it with ``orjson``; this model is its
    documented shape, and what tests validate entries against)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    file: str = Field(description="The capture file's name, in the same directory.")
    offset: int = Field(ge=0, description="Byte offset of the line in the file.")
    length: int = Field(ge=0, description="The line's length in bytes, without its newline.")
    size: int = Field(ge=0, description="The file's size right after this append.")
    mtime_ns: int = Field(description="The file's mtime (ns) right after this append.")
    inode: int = Field(ge=0, description="The file's inode.")
    size_before: int = Field(ge=0, description="The file's size when this append took its lock.")
    mtime_before_ns: int = Field(description="The file's mtime (ns) at that moment.")
    model_call_id: str
    dialect: str
    model_ref: ModelRef | None = None
    started_at: float | None = None
    completed_at: float | None = None
    latency_ms: float | None = None
    latency_ttft_ms: float | None = None
    status_code: int | None = None
    error_category: str | None = None
    ngcapture_facts: dict[str, Any] = Field(description="The line's facts, as in the line.")


def journal_entry(file_name: str, appended: Appended, line: Mapping[str, Any]) -> bytes | None:
    """The journal line for ``line`` (a capture line as a mapping) just appended to
    ``file_name``; ``None`` when the line carries no facts of the current version (a reader
    reads such a line from its bodies, so the journal has nothing to save it)."""
    facts = line.get(FACTS_KEY)
    if not isinstance(facts, Mapping) or facts.get("v") != FACTS_VERSION:
        return None
    if appended.size != appended.offset + appended.length + 1:
        return None  # a writer that takes no lock appended meanwhile: the file reads its lines
    entry: dict[str, Any] = {
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
    }
    for key in ENVELOPE_KEYS:
        if key in line:
            entry[key] = line[key]
    entry[FACTS_KEY] = facts
    return orjson.dumps(entry, default=str, option=orjson.OPT_APPEND_NEWLINE)


class FactsJournal:
    """A server's journal, opened once and appended to by its writer threads.

    Writing an entry never raises: a failure is counted (``failures``) and the entry is lost,
    which only means its file is read from its lines.
    """

    def __init__(self, root: Path, token: str, *, segment_bytes: int = 0) -> None:
        directory = Path(root) / JOURNAL_DIR
        self.path = directory / f"{token}{JOURNAL_SUFFIX}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
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
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as exc:  # a cache: the server runs without it, readers read the lines
            logger.warning("no facts journal in %s (%s): readers will read every line",
                           directory, os_reason(exc))  # fmt: skip

    def note(self, rollout_file: str, appended: Appended, line: Mapping[str, Any]) -> None:
        """Journal ``line``, just appended to ``rollout_file`` (a name in the directory)."""
        fd = self._fd
        if fd is None:
            return
        try:
            entry = journal_entry(rollout_file, appended, line)
        except (TypeError, ValueError) as exc:
            self._failed(str(exc))
            return
        if entry is None:
            return
        try:
            written = _write(fd, entry)  # one write: O_APPEND keeps it whole
        except OSError as exc:
            self._failed(os_reason(exc))
            return
        if written != len(entry):  # short (disk full): end it so the next entry stays whole
            with contextlib.suppress(OSError):
                write_all(fd, b"\n")
            self._failed(f"short write ({written} of {len(entry)} bytes)")
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
        thread is in ``note`` (the server joins its writer threads first)."""
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
