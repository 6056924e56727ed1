"""Reading capture servers' facts journals: rows for whole files without reading their lines.

Our capture server notes each line it appends in ``.facts/<writer>.jsonl``
(:mod:`capture_core.facts_journal`): where the line is, the file's size, mtime and inode as that
append left it, and the line's envelope and facts. A file is read from the journal only when
the journal accounts for every byte of it as it is now:

- the entries for its name and current inode, in offset order, start at 0 and follow each
  other line after line (offset + length + 1 is the next offset), with no offset twice;
- the last one ends where the file ends, and left the file's size, mtime and inode exactly as
  ``stat`` finds them now;
- its mtime is older than the racy window (``_scan.RACY_NS``): a file modified that recently
  could have been changed again without its mtime moving, so its lines are read.

Anything else (another writer's lines, a torn or damaged line, an entry lost in a crash, an
edit) leaves the file to ``_scan``'s readers, so a row from the journal is the row the file's
line would give (the same ``FactsRows`` code builds both). ``verify`` never uses the journal.
Journals are decoded in chunks. Up to ``KEEP_ENTRIES`` entries are kept from the pass that
decides which files they cover; beyond, the rows' entries are decoded again, one chunk at a
time, so a store of millions of calls never holds all its entries at once. An index refresh
that reads few files decodes most entries only as far as their file name.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from capture_core.facts import FACTS_VERSION
from capture_core.facts_journal import JOURNAL_DIR, JOURNAL_SUFFIX
from ngcapture_viz.load._line_types import FastLine

__all__ = ["Coverage", "JournalChanged", "JournalLine", "Journals"]

#: Bytes of a journal decoded at once.
CHUNK_BYTES: Final = 32 * 1024 * 1024


class JournalChanged(Exception):
    """A journal no longer held an entry the first pass had read (rewritten meanwhile)."""


class _Where(msgspec.Struct):
    """Where an entry's line is: all a sparse first pass decodes of most entries."""

    file: str
    inode: int


class JournalLine(FastLine, kw_only=True):
    """A journal entry: the fields ``FastLine`` reads of a capture line, and where it is."""

    file: str
    offset: int
    length: int
    size: int
    mtime_ns: int
    inode: int


_LINE = msgspec.json.Decoder(JournalLine)
_WHERE = msgspec.json.Decoder(_Where)


#: Entries kept from the pass that decides which files the journals cover (~1 KB each);
#: beyond, they are decoded again for the rows, one chunk at a time.
KEEP_ENTRIES: Final = 250_000


@dataclass(frozen=True, slots=True)
class Coverage:
    """A file the journals account for: its entries' positions (journal, index) in line order."""

    name: str
    size: int
    mtime_ns: int
    inode: int
    entries: tuple[tuple[int, int], ...]
    offsets: tuple[int, ...]  # where each entry's line starts

    def first_at(self, offset: int) -> int | None:
        """The number of the entry whose line starts at ``offset`` (``None``: no line does)."""
        for number, start in enumerate(self.offsets):
            if start == offset:
                return number
        return None


def _journal_paths(directory: str) -> list[str]:
    folder = os.path.join(directory, JOURNAL_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if n.endswith(JOURNAL_SUFFIX)]


def _chunks(path: str) -> list[bytes]:
    """The journal's whole lines (a last one still being written is left out), in chunks of
    about ``CHUNK_BYTES`` cut at newlines."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return []
    end = data.rfind(b"\n") + 1
    chunks: list[bytes] = []
    start = 0
    while start < end:
        cut = data.rfind(b"\n", start, min(end, start + CHUNK_BYTES)) + 1
        if cut <= start:  # one line longer than a chunk
            cut = data.find(b"\n", start) + 1
        chunks.append(data[start:cut])
        start = cut
    return chunks


def _decode_each(decoder: msgspec.json.Decoder[Any], chunk: bytes) -> Sequence[Any]:
    """One value per line of ``chunk`` (``decode_lines``); when a line is bad (a torn entry)
    or blank (which ``decode_lines`` would skip), line by line, ``None`` for such lines."""
    try:
        found = decoder.decode_lines(chunk)
    except (msgspec.DecodeError, RecursionError):
        pass
    else:
        if len(found) == chunk.count(b"\n"):
            return found
    each: list[Any] = []
    for line in chunk.split(b"\n")[:-1]:
        try:
            each.append(decoder.decode(line) if line.strip() else None)
        except (msgspec.DecodeError, RecursionError):
            each.append(None)
    return each


class Journals:
    """The facts journals of one directory, and the files among ``stats`` (name → its
    ``stat`` now) that they account for entirely (``covered``).

    ``sparse``: ``stats`` names few of the files the journals cover (an index refresh): each
    entry is first decoded only as far as where it is, and only entries of those files whole.
    Entries are kept from the first pass up to ``keep_entries``; beyond, ``lines`` decodes
    them again, a chunk at a time.
    """

    def __init__(
        self,
        directory: str,
        stats: Mapping[str, os.stat_result],
        *,
        sparse: bool = False,
        keep_entries: int | None = None,
    ) -> None:
        self.paths = _journal_paths(directory) if stats else []
        self._stats = stats
        self._sparse = sparse
        limit = KEEP_ENTRIES if keep_entries is None else keep_entries
        self._kept: dict[tuple[int, int], JournalLine] | None = {}
        by_file: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
        last: dict[str, JournalLine] = {}
        for position, line in self._entries():
            by_file[line.file].append((line.offset, line.length, *position))
            final = last.get(line.file)
            if final is None or line.offset > final.offset:
                last[line.file] = line
            if self._kept is not None:
                self._kept[position] = line
                if len(self._kept) > limit:
                    self._kept = None  # decoded again, a chunk at a time, by ``lines``
        self.covered: dict[str, Coverage] = {}
        for name, entries in by_file.items():
            stat, final = stats[name], last[name]
            if (final.size, final.mtime_ns) != (stat.st_size, stat.st_mtime_ns):
                continue
            entries.sort()
            expected = 0
            for offset, length, _, _ in entries:
                if offset != expected:
                    break
                expected = offset + length + 1
            else:
                if expected == stat.st_size:
                    self.covered[name] = Coverage(
                        name, stat.st_size, stat.st_mtime_ns, stat.st_ino,
                        tuple((journal, index) for _, _, journal, index in entries),
                        tuple(offset for offset, _, _, _ in entries),
                    )  # fmt: skip

    def _entries(self) -> Iterator[tuple[tuple[int, int], JournalLine]]:
        """Every entry, decoded whole (so one ``lines`` could not decode never leaves a file
        without a row), that concerns a file of ``stats`` as it is now (same inode), with
        facts of the current version; with its position (journal, line)."""
        stats = self._stats
        for journal, path in enumerate(self.paths):
            start = 0
            for chunk in _chunks(path):
                if self._sparse:
                    lines: list[bytes] | None = None
                    wheres: Sequence[_Where | None] = _decode_each(_WHERE, chunk)
                    for number, where in enumerate(wheres):
                        if where is None:
                            continue
                        stat = stats.get(where.file)
                        if stat is None or where.inode != stat.st_ino:
                            continue
                        lines = lines if lines is not None else chunk.split(b"\n")
                        try:
                            line = _LINE.decode(lines[number])
                        except (msgspec.DecodeError, RecursionError):
                            continue
                        if _current(line):
                            yield (journal, start + number), line
                else:
                    entries: Sequence[JournalLine | None] = _decode_each(_LINE, chunk)
                    for number, entry in enumerate(entries):
                        if entry is None or not _current(entry):
                            continue  # facts of another version: the file is read from its lines
                        stat = stats.get(entry.file)
                        if stat is not None and entry.inode == stat.st_ino:
                            yield (journal, start + number), entry
                start += chunk.count(b"\n")

    def lines(
        self, wanted: Container[tuple[int, int]]
    ) -> Iterator[tuple[tuple[int, int], JournalLine]]:
        """The entries at the positions ``wanted`` (journal, index), in journal order."""
        if self._kept is not None:
            kept = self._kept
            self._kept = None  # freed as the rows are taken
            for position, entry in kept.items():
                if position in wanted:
                    yield position, entry
            return
        for position, entry in self._entries():
            if position in wanted:
                yield position, entry


def _current(line: JournalLine) -> bool:
    facts = line.ngcapture_facts
    return facts is not None and facts.v == FACTS_VERSION
