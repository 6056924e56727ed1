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
Journals are decoded in chunks; up to ``KEEP_BYTES`` in all the entries are kept from the pass
that decides which files they cover; beyond, the rows' entries are decoded again, one chunk at
a time, so a store of millions of calls never holds all its entries at once.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import msgspec

from capture_core.facts import FACTS_VERSION
from capture_core.facts_journal import JOURNAL_DIR, JOURNAL_SUFFIX
from ngcapture_viz.load._line_types import FastLine

__all__ = ["Coverage", "JournalChanged", "JournalLine", "Journals"]

#: Bytes of a journal decoded at once.
CHUNK_BYTES: Final = 32 * 1024 * 1024


class JournalChanged(Exception):
    """A journal no longer held an entry the first pass had read (rewritten meanwhile)."""


class JournalLine(FastLine, kw_only=True):
    """A journal entry: the fields ``FastLine`` reads of a capture line, and where it is."""

    file: str
    offset: int
    length: int
    size: int
    mtime_ns: int
    inode: int


T = TypeVar("T")
_LINE = msgspec.json.Decoder(JournalLine)


#: Journals up to this many bytes in all are decoded once, their entries kept between the two
#: passes; larger ones are decoded again in the second pass, one chunk at a time.
KEEP_BYTES: Final = 128 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Coverage:
    """A file the journals account for: its entries' positions (journal, index) in line order."""

    name: str
    size: int
    mtime_ns: int
    inode: int
    entries: tuple[tuple[int, int], ...]


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


def _decode_each(decoder: msgspec.json.Decoder[T], chunk: bytes) -> Sequence[T | None]:
    """``decode_lines`` of ``chunk``; when one line is bad (a torn entry), line by line, with
    ``None`` for each line that does not decode."""
    try:
        return decoder.decode_lines(chunk)
    except (msgspec.DecodeError, RecursionError):
        pass
    found: list[T | None] = []
    for line in chunk.split(b"\n")[:-1]:
        try:
            found.append(decoder.decode(line) if line.strip() else None)
        except (msgspec.DecodeError, RecursionError):
            found.append(None)
    return found


class Journals:
    """The facts journals of one directory, and the files among ``stats`` (name → its
    ``stat`` now) that they account for entirely (``covered``)."""

    def __init__(
        self, directory: str, stats: dict[str, os.stat_result], *, keep_bytes: int = KEEP_BYTES
    ) -> None:
        self.paths = _journal_paths(directory)
        sizes = [_size(path) for path in self.paths]
        self._kept: dict[tuple[int, int], JournalLine] | None = (
            {} if sum(sizes) <= keep_bytes else None
        )
        by_file: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
        last: dict[str, JournalLine] = {}
        for journal, path in enumerate(self.paths):
            index = 0
            for chunk in _chunks(path):
                # Whole entries in this pass too: an entry the second pass could not decode
                # must leave its file to the line readers, not without a row.
                for line in _decode_each(_LINE, chunk):
                    position = (journal, index)
                    index += 1
                    # Facts of another version: the file is read from its lines.
                    if line is None or not _current(line):
                        continue
                    stat = stats.get(line.file)
                    if stat is None or line.inode != stat.st_ino:
                        continue
                    by_file[line.file].append((line.offset, line.length, *position))
                    final = last.get(line.file)
                    if final is None or line.offset > final.offset:
                        last[line.file] = line
                    if self._kept is not None:
                        self._kept[position] = line
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
                    )  # fmt: skip

    def lines(
        self, wanted: Container[tuple[int, int]]
    ) -> Iterator[tuple[tuple[int, int], JournalLine]]:
        """The entries at the positions ``wanted`` (journal, index), in journal order; when
        the journals are large, decoded again one chunk at a time."""
        if self._kept is not None:
            kept = self._kept
            self._kept = None  # freed as the rows are taken
            for position, entry in kept.items():
                if position in wanted:
                    yield position, entry
            return
        for journal, path in enumerate(self.paths):
            index = 0
            for chunk in _chunks(path):
                for line in _decode_each(_LINE, chunk):
                    position = (journal, index)
                    index += 1
                    if line is not None and position in wanted:
                        yield position, line


def _current(line: JournalLine) -> bool:
    facts = line.ngcapture_facts
    return facts is not None and facts.v == FACTS_VERSION


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
