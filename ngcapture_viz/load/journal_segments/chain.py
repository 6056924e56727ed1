"""Segment names, and the chain a journal's segments make: which of them a reader may use.

A segment is used only when its name matches the journal as it is now: the current format,
the journal's inode, a stretch ending within the journal, each starting where the one before
ended (byte and line, from byte 0), a ``tail`` (BLAKE2b-64 of the stretch's last 256 bytes)
equal to the journal's bytes there, and a Parquet footer with exactly the segment's columns.
Anything else is ignored and the journal's lines are decoded; deleting segments loses nothing.
The tail check catches a journal cut and written again; an edit in place of an earlier line
(same inode, same length) it does not, and the reader still checks every entry against its
capture file's ``stat`` chain, as it does decoded ones.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import polars as pl

from capture_core.facts_journal import JOURNAL_SUFFIX
from ngcapture_viz.load.journal_segments.schema import (
    SEGMENT_FORMAT,
    SEGMENT_SCHEMA,
    SEGMENT_SUFFIX,
    TAIL_BYTES,
)

__all__ = ["Segment", "named_segments", "segment_chain", "tail_hash"]

_NAME: Final = re.compile(
    r"^(?P<stem>.+)\.s(?P<format>\d+)\.(?P<inode>\d+)\.(?P<start>\d+)-(?P<end>\d+)"
    r"\.(?P<first>\d+)-(?P<last>\d+)\.(?P<tail>[0-9a-f]{16})" + re.escape(SEGMENT_SUFFIX) + "$"
)


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment file: the journal stretch it holds (bytes and lines) and its tail hash."""

    path: str
    inode: int
    start: int
    end: int
    first_line: int
    end_line: int
    tail: str
    format: int = SEGMENT_FORMAT  # the format its name says (``named_segments(any_format=True)``)

    def name_for(self, journal_name: str) -> str:
        """The file name of this segment of the journal named ``journal_name``."""
        stem = journal_name.removesuffix(JOURNAL_SUFFIX)
        return (
            f"{stem}.s{SEGMENT_FORMAT}.{self.inode}.{self.start}-{self.end}"
            f".{self.first_line}-{self.end_line}.{self.tail}{SEGMENT_SUFFIX}"
        )


def tail_hash(data: bytes) -> str:
    """The hash a segment's name holds of the bytes of its stretch (their last ``TAIL_BYTES``)."""
    return hashlib.blake2b(data[-TAIL_BYTES:], digest_size=8).hexdigest()


def named_segments(
    folder: str, journal_name: str, names: Sequence[str], *, any_format: bool = False
) -> list[Segment]:
    """The segments among ``names`` (of ``folder``) named for ``journal_name``, of the current
    format (``any_format``: of every format), whatever their inode."""
    stem = journal_name.removesuffix(JOURNAL_SUFFIX)
    found: list[Segment] = []
    for name in names:
        match = _NAME.match(name)
        if match is None or match["stem"] != stem:
            continue
        if not any_format and int(match["format"]) != SEGMENT_FORMAT:
            continue
        start, end = int(match["start"]), int(match["end"])
        first, last = int(match["first"]), int(match["last"])
        if start < end and first <= last:
            inode = int(match["inode"])
            path, kind = os.path.join(folder, name), int(match["format"])
            found.append(Segment(path, inode, start, end, first, last, match["tail"], kind))
    return found


def segment_chain(journal_path: str, fd: int, names: Sequence[str] | None = None) -> list[Segment]:
    """The segments that hold the open journal ``fd`` from its first byte on, one after the
    other, each usable (see the module); at each step the longest that is. ``names``: the
    journal folder's listing, if at hand (a directory of many journals is listed once)."""
    folder, journal_name = os.path.split(journal_path)
    try:
        stat = os.fstat(fd)
        if names is None:
            names = os.listdir(folder)
    except OSError:
        return []
    by_start: dict[int, list[Segment]] = {}
    for segment in named_segments(folder, journal_name, names):
        if segment.inode == stat.st_ino and segment.end <= stat.st_size:
            by_start.setdefault(segment.start, []).append(segment)
    chain: list[Segment] = []
    start, line = 0, 0
    while candidates := by_start.get(start):
        step = next(
            (
                segment
                for segment in sorted(candidates, key=lambda s: s.end, reverse=True)
                if segment.first_line == line and _tail_matches(fd, segment) and _readable(segment)
            ),
            None,
        )
        if step is None:
            break
        chain.append(step)
        start, line = step.end, step.end_line
    return chain


def _tail_matches(fd: int, segment: Segment) -> bool:
    length = min(TAIL_BYTES, segment.end - segment.start)
    try:
        data = os.pread(fd, length, segment.end - length)
    except OSError:
        return False
    return len(data) == length and data.endswith(b"\n") and tail_hash(data) == segment.tail


def _readable(segment: Segment) -> bool:
    """Whether the segment's Parquet footer names exactly the columns of ``SEGMENT_SCHEMA``
    (a file cut short or of other columns is not part of a chain, and ``write_segments``
    writes it again)."""
    try:
        return pl.read_parquet_schema(segment.path) == SEGMENT_SCHEMA
    except (OSError, pl.exceptions.PolarsError, ValueError):
        return False
