"""Today's reader, kept as the oracle the fast scan is checked against (issue 19).

This is ``ngcapture_viz/load/_scan.py`` as it was before the typed decoders: every line parsed
whole with ``orjson`` and normalized by ``capture_core`` (``parse_capture`` + ``record_fields``).
Only the scanning is kept; the index bookkeeping lives in the product.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import polars as pl
import xxhash

from capture_core import (
    DamagedLine,
    InvalidRecordError,
    RawEntry,
    parse_capture,
    paused_gc,
)
from capture_core.normalize import record_fields, validate_raw_line
from ngcapture_viz.frames.calls import CallColumns
from ngcapture_viz.frames.gaps import AnalysisGap, GapRows
from ngcapture_viz.frames.tool_calls import ToolCallColumns, tool_choice_indices

__all__ = ["RACY_NS", "FileState", "FileTask", "ScanResult", "fingerprint", "is_racy", "scan_files"]

#: Bytes hashed at the head and at the end of the indexed prefix to notice rewrites.
_PROBE: Final = 4096


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
    head_hash: str
    tail_hash: str
    scanned_ns: int = 0
    full_hash: str | None = None


@dataclass(frozen=True, slots=True)
class FileTask:
    """Parse ``path`` from ``start`` (a line boundary) with the counters it had there."""

    path: str
    name: str
    rollout_id: str
    start: int = 0
    call_index: int = 0
    line: int = 1
    scan_ns: int = 0


@dataclass
class ScanResult:
    calls: pl.DataFrame
    tool_calls: pl.DataFrame
    damaged: pl.DataFrame
    states: list[FileState] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    bytes_parsed: int = 0
    processes: int = 1


def fingerprint(fd: int, start: int, end: int) -> str:
    """A short hash of bytes ``[start, end)`` of an open file."""
    data = os.pread(fd, max(0, end - start), start) if end > start else b""
    return _digest(data)


def _digest(data: bytes | memoryview) -> str:
    return str(xxhash.xxh3_128_hexdigest(data))  # as the index hashes (format 7)


def _fingerprint_read(fd: int, content: bytes, offset: int, start: int, end: int) -> str:
    """``fingerprint(fd, start, end)``, hashed from ``content`` (the file's bytes from
    ``offset``) when it holds the whole range, which saves a read."""
    if start < offset:
        return fingerprint(fd, start, end)
    return _digest(memoryview(content)[start - offset : max(start, end) - offset])


#: Modification times this close to a scan are not trusted to reveal a later rewrite.
RACY_NS: Final = 2_000_000_000


def is_racy(mtime_ns: int, scan_ns: int) -> bool:
    """Whether a file modified at ``mtime_ns`` could change again without its mtime moving."""
    return mtime_ns >= scan_ns - RACY_NS


def scan_files(tasks: list[FileTask]) -> ScanResult:
    """Parse every task's bytes; unreadable files are reported, never raised."""
    # The frames are built, and the rows they were built from freed, before the collector
    # resumes: its first pass then has a few frames to walk, not every row.
    with paused_gc():
        return _scan_all(tasks)


def _scan_all(tasks: list[FileTask]) -> ScanResult:
    calls, tools, damaged = CallColumns(), ToolCallColumns(), GapRows()
    states: list[FileState] = []
    unreadable: list[tuple[str, str]] = []
    parsed = 0
    for task in tasks:
        try:
            state, size = _scan_one(task, calls, tools, damaged)
        except OSError as exc:
            unreadable.append((task.name, f"{type(exc).__name__}: {exc.strerror or exc}"))
            continue
        states.append(state)
        parsed += size
    return ScanResult(
        calls.frame(),
        tools.frame(),
        damaged.frame(),
        states=states,
        unreadable=unreadable,
        bytes_parsed=parsed,
    )


def _scan_one(
    task: FileTask, calls: CallColumns, tools: ToolCallColumns, damaged: GapRows
) -> tuple[FileState, int]:
    start = task.start
    fd = os.open(task.path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        stat = os.fstat(fd)
        size = stat.st_size
        content = os.pread(fd, max(0, size - start), start) if size > start else b""
        end = start + len(content)
        last_newline = content.rfind(b"\n")
        consumed = start + last_newline + 1
        head = _fingerprint_read(fd, content, start, 0, min(_PROBE, consumed))
        # Up to _PROBE bytes, the head, the tail and the whole are one range: hashed once.
        small = consumed <= _PROBE
        tail = head if small else _fingerprint_read(fd, content, start, consumed - _PROBE, consumed)
        # A file modified close to the scan may be rewritten again within the same mtime tick
        # (same size, same mtime): keep a hash of all of it so the next refresh can tell.
        full = None
        if is_racy(stat.st_mtime_ns, task.scan_ns):
            full = head if small else _fingerprint_read(fd, content, start, 0, consumed)
    finally:
        os.close(fd)
    path = Path(task.path)
    entries, bad = parse_capture(content, path)
    next_call_index, next_line = task.call_index, task.line
    for entry in entries:
        offset = task.start + entry.byte_offset
        call_index = task.call_index + entry.call_index
        line_number = task.line + entry.line_number - 1
        if offset < consumed:
            next_call_index = max(next_call_index, call_index + 1)
        try:
            fields = record_fields(validate_raw_line(entry.data), call_index)
        except InvalidRecordError as exc:
            _add_damage(
                damaged, task, exc.reason, call_index=call_index, line=line_number, offset=offset
            )
            continue
        calls.add(
            fields,
            rollout_id=task.rollout_id,
            source="store",
            path=task.path,
            line_number=line_number,
            byte_offset=offset,
            line_bytes=entry.length,
        )
        if fields["tool_calls"]:
            choices = tool_choice_indices(fields["dialect"], entry.data.get("response"))
            tools.add(fields, rollout_id=task.rollout_id, source="store", choices=choices)
    for line in bad:
        offset = task.start + line.byte_offset
        call_index = task.call_index + line.call_index
        if offset < consumed:
            next_call_index = max(next_call_index, call_index + 1)
        number = task.line + line.line_number - 1
        _add_damage(damaged, task, line.reason, call_index=call_index, line=number, offset=offset)
    next_line = task.line + _newlines(content, entries, bad)
    state = FileState(
        name=task.name,
        rollout_id=task.rollout_id,
        size=end,
        mtime_ns=stat.st_mtime_ns,
        inode=stat.st_ino,
        consumed=consumed,
        next_call_index=next_call_index,
        next_line=next_line,
        head_hash=head,
        tail_hash=tail,
        scanned_ns=task.scan_ns,
        full_hash=full,
    )
    return state, len(content)


def _newlines(content: bytes, entries: list[RawEntry], bad: list[DamagedLine]) -> int:
    """How many newlines ``content`` holds, counted only after its last non-blank line: the
    number of that line tells how many come before it, and the line itself has none."""
    lasts: list[RawEntry | DamagedLine] = [*entries[-1:], *bad[-1:]]
    if not lasts:
        return content.count(b"\n")
    last = max(lasts, key=lambda line: line.byte_offset)
    return last.line_number - 1 + content.count(b"\n", last.byte_offset + last.length)


def _add_damage(
    damaged: GapRows, task: FileTask, reason: str, *, call_index: int, line: int, offset: int
) -> None:
    damaged.add(
        AnalysisGap.DAMAGED_LINE,
        source="store",
        rollout_id=task.rollout_id,
        call_index=call_index,
        detail=reason,
        path=task.path,
        line_number=line,
        byte_offset=offset,
    )
