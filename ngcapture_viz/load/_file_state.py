"""What the index records of each capture file, the work of reading one, and the racy window.

Shared by the line readers (``_scan``) and the facts-journal reader (``_journal_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple, Protocol

__all__ = ["RACY_NS", "FileStat", "FileState", "FileTask", "StatLike", "is_racy"]


class StatLike(Protocol):
    """What the planner and the journal reader use of a file's ``stat``: an ``os.stat_result``
    or a :class:`FileStat`."""

    @property
    def st_ino(self) -> int: ...
    @property
    def st_size(self) -> int: ...
    @property
    def st_mtime_ns(self) -> int: ...


class FileStat(NamedTuple):
    """A file's ``stat``, as much of it as the listing keeps (named as ``os.stat_result``'s)."""

    st_ino: int
    st_size: int
    st_mtime_ns: int


@dataclass(frozen=True, slots=True)
class FileState:
    """What the index knows about one capture file.

    ``consumed`` covers whole lines only (up to and including the last newline); the bytes after
    it (a line still being written, or a torn tail) are parsed again on every refresh.
    """

    name: str
    rollout_id: str
    size: int
    mtime_ns: int
    inode: int
    consumed: int
    next_call_index: int
    next_line: int
    head_hash: str | None  # None: read from a facts journal, no byte hashed
    tail_hash: str | None
    scanned_ns: int = 0
    full_hash: str | None = None


@dataclass(frozen=True, slots=True)
class FileTask:
    """Parse ``path`` from ``start`` (a line boundary) with the counters it had there."""

    path: str
    name: str  # the file's name in its directory: ``path``'s last part
    rollout_id: str
    start: int = 0
    call_index: int = 0
    line: int = 1
    scan_ns: int = 0
    size: int | None = None  # the file's size when it was listed (None: not stated)


#: Modification times this close to a scan are not trusted to reveal a later rewrite.
RACY_NS: Final = 2_000_000_000


def is_racy(mtime_ns: int, scan_ns: int) -> bool:
    """Whether a file modified at ``mtime_ns`` could change again without its mtime moving."""
    return mtime_ns >= scan_ns - RACY_NS
