"""Reading capture servers' facts journals: rows for whole files without reading their lines.

Our capture server notes each line it appends in ``.facts/<writer>.jsonl``
(:mod:`capture_core.facts_journal`): where the line is, the file's size, mtime and inode as that
append left it, and the line's envelope and facts. A file is read from the journal only when
the journal accounts for every byte of it as it is now:

- the entries for its name and current inode, in offset order, start at 0 and follow each
  other line after line (offset + length + 1 is the next offset), with no offset twice;
- each found the file as the one before left it (its ``size_before``/``mtime_before_ns`` are
  the previous entry's ``size``/``mtime_ns``), so an edit between two appends shows;
- the last one ends where the file ends, and left the file's size, mtime and inode exactly as
  ``stat`` finds them now;
- its mtime is older than the racy window (``_file_state.RACY_NS``): a file modified that
  recently could change again without its mtime moving, so its lines are read (the journal
  still tells the index whether what it read before is intact: ``Coverage.racy``).

An index refresh may start a file's chain where the index left it (``bases``: the size and
mtime it recorded, read or vouched for then) rather than at 0, and read each journal only from
where it ended before that refresh's ``stat`` of the files (``since``, from ``journal_marks``):
an entry is written after its line, so every line appended after that ``stat`` has its entry
there. A mark only saves reading; what is trusted is still the chain checked against ``stat``
(an entry missing from what was read leaves its file to the lines). Anything else (another
writer's lines, a torn or damaged line, an entry lost in a crash, an edit) leaves the file to
``_scan``'s readers, so a row from the journal is the row the file's line would give (the same
``FactsRows`` code builds both). ``verify`` never uses the journal.
Journals are decoded in chunks. Up to ``KEEP_ENTRIES`` entries are kept from the pass that
decides which files they cover; beyond, the rows' entries are decoded again, one chunk at a
time, so a store of millions of calls never holds all its entries at once. An index refresh
that reads few files decodes most entries only as far as their file name.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import polars as pl

from capture_core.facts import FACTS_VERSION
from ngcapture_viz.load._file_state import StatLike
from ngcapture_viz.load._journal_files import decode_each, journal_chunks, journal_paths
from ngcapture_viz.load._line_types import JOURNAL_LINE, JournalLine
from ngcapture_viz.load.journal_segments import (
    SEGMENT_SCHEMA,
    WHERE_COLUMNS,
    Segment,
    complete,
    read_where,
    segment_chain,
)

__all__ = ["Coverage", "JournalChanged", "JournalLine", "Journals"]


class JournalChanged(Exception):
    """A journal no longer held an entry the first pass had read (rewritten meanwhile)."""


class _Where(msgspec.Struct):
    """Where an entry's line is: all a sparse first pass decodes of most entries."""

    file: str
    inode: int


_WHERE = msgspec.json.Decoder(_Where)


#: Entries kept from the pass that decides which files the journals cover (~1 KB each);
#: beyond, they are decoded again for the rows, one chunk at a time.
KEEP_ENTRIES: Final = 250_000


@dataclass(frozen=True, slots=True)
class Coverage:
    """A file the journals account for entirely, as ``stat`` found it."""

    name: str
    size: int
    mtime_ns: int
    inode: int
    lines: int  # entries (lines) from its base
    #: Modified within the racy window of the scan: the journal vouches for what was read of
    #: it before (an append), but its rows are read from its lines.
    racy: bool = False


#: One row per entry of a covered file, in line order per file.
_ENTRY_SCHEMA: Final = {
    **{name: SEGMENT_SCHEMA[name] for name in WHERE_COLUMNS},  # where its line is
    "journal": pl.Int32(),
    "index": pl.Int64(),
    "kept": pl.Int64(),  # where the decoded entry is in ``Journals.kept`` (-1: not kept)
    "segment": pl.Boolean(),  # read from a columnar segment (``journal_segments``)
}


class Journals:
    """The facts journals of one directory, and the files among ``stats`` (name → its
    ``stat`` now) that they account for entirely (``covered``; their entries in ``entries``).

    ``racy``: names among ``stats`` modified within the racy window (``Coverage.racy``).
    ``sparse``: ``stats`` names few of the files the journals cover (an index refresh): each
    entry is first decoded only as far as its file, and only entries of those files whole.
    Decoded entries of covered files are kept (``kept``) up to ``keep_entries``; beyond,
    ``decoded_chunks`` decodes them again, a chunk at a time.
    ``since``: journal name → ``[inode, offset]`` (``journal_marks`` before an index's
    ``stat`` of the files): each such journal is read from there. ``bases``: file name →
    ``(size, mtime_ns)`` the index holds for it (its bytes up to ``size`` read or vouched
    for, and ``stat`` found that mtime then): its chain starts there rather than at 0.
    A journal read from its start whose first lines a chain of columnar segments holds
    (``journal_segments``; ``chains``) is read from them, and decoded only after them.
    """

    def __init__(
        self,
        directory: str,
        stats: Mapping[str, StatLike],
        *,
        sparse: bool = False,
        keep_entries: int | None = None,
        racy: Container[str] = (),
        since: Mapping[str, Sequence[int]] | None = None,
        bases: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        self.paths = journal_paths(directory) if stats else []
        self._stats = stats
        self._since = [(since or {}).get(os.path.basename(path)) for path in self.paths]
        self._sparse = sparse
        #: Per journal, the segments its first lines are read from (none: decoded whole).
        self.chains: list[list[Segment]] = [[] for _ in self.paths]
        #: Per journal, the line its decoded lines start at (where its chain ends).
        self._first = [0] * len(self.paths)
        from_segments = self._from_segments()
        limit = KEEP_ENTRIES if keep_entries is None else keep_entries
        kept: list[JournalLine] | None = []
        columns: dict[str, list[Any]] = {name: [] for name in _ENTRY_SCHEMA}
        for journal, found in self._found():
            entries = [entry for _, entry in found]
            columns["file"] += [e.file for e in entries]
            columns["offset"] += [e.offset for e in entries]
            columns["length"] += [e.length for e in entries]
            columns["size"] += [e.size for e in entries]
            columns["mtime_ns"] += [e.mtime_ns for e in entries]
            columns["inode"] += [e.inode for e in entries]
            columns["size_before"] += [e.size_before for e in entries]
            columns["mtime_before_ns"] += [e.mtime_before_ns for e in entries]
            columns["journal"] += [journal] * len(found)
            columns["index"] += [index for index, _ in found]
            if kept is not None:
                columns["kept"] += range(len(kept), len(kept) + len(entries))
                kept += entries
                if len(kept) > limit:
                    kept = None  # decoded again, a chunk at a time, by ``lines``
            if kept is None:
                columns["kept"] += [-1] * (len(columns["file"]) - len(columns["kept"]))
        columns["segment"] = [False] * len(columns["file"])
        self.kept = kept
        decoded = pl.DataFrame(columns, schema=_ENTRY_SCHEMA)
        self.entries, self.covered = _cover(
            pl.concat([*from_segments, decoded]), stats, racy, bases or {}
        )
        if kept is None:
            self.entries = self.entries.with_columns(pl.lit(-1, pl.Int64()).alias("kept"))
        self._offsets: dict[str, list[int]] | None = None

    def first_at(self, name: str, offset: int) -> int | None:
        """The number (from 0) of the covered file's entry whose line starts at ``offset``."""
        if self._offsets is None:
            grouped = self.entries.group_by("file").agg("offset")
            self._offsets = dict(zip(grouped["file"], grouped["offset"].to_list(), strict=True))
        offsets = self._offsets.get(name, [])
        return offsets.index(offset) if offset in offsets else None

    def _found(self) -> Iterator[tuple[int, list[tuple[int, JournalLine]]]]:
        """Per chunk of each journal, its entries decoded whole (so one ``lines`` could not
        decode never leaves a file without a row) that concern a file of ``stats`` as it is
        now (same inode), with facts of the current version; each with its line index."""
        stats = self._stats
        for journal, path in enumerate(self.paths):
            start = self._first[journal]
            for chunk in journal_chunks(path, self._since[journal]):
                found: list[tuple[int, JournalLine]] = []
                if self._sparse:
                    lines: list[bytes] | None = None
                    wheres: Sequence[_Where | None] = decode_each(_WHERE, chunk)
                    for number, where in enumerate(wheres):
                        if where is None:
                            continue
                        stat = stats.get(where.file)
                        if stat is None or where.inode != stat.st_ino:
                            continue
                        lines = lines if lines is not None else chunk.split(b"\n")
                        try:
                            line = JOURNAL_LINE.decode(lines[number])
                        except (msgspec.DecodeError, RecursionError):
                            continue
                        if _current(line):
                            found.append((start + number, line))
                else:
                    entries: Sequence[JournalLine | None] = decode_each(JOURNAL_LINE, chunk)
                    found = [
                        (start + number, entry)
                        for number, entry in enumerate(entries)
                        if entry is not None
                        and entry.ngcapture_facts is not None
                        and entry.ngcapture_facts.v == FACTS_VERSION
                        and (stat := stats.get(entry.file)) is not None
                        and entry.inode == stat.st_ino
                    ]
                yield journal, found
                start += chunk.count(b"\n")

    def _from_segments(self) -> list[pl.DataFrame]:
        """The entries of the journals read from their start that segments hold (as
        ``_found`` would keep them: facts of the current version, a file of ``stats`` as it
        is now). Sets each such journal's ``chains`` entry and where its decoding starts
        (``_first``, ``_since``), so it runs before ``_found``. A segment that cannot be read
        leaves its journal to be decoded whole."""
        frames: list[pl.DataFrame] = []
        names: list[str] | None = None  # the journals' folder, listed once
        now: pl.LazyFrame | None = None  # the files as they are, once a chain needs them
        for journal, path in enumerate(self.paths):
            if self._since[journal] is not None:
                continue  # an index refresh reads from its mark
            if names is None:
                try:
                    names = os.listdir(os.path.dirname(path))
                except OSError:
                    return frames
            chain = _chain(path, names)
            if not chain:
                continue
            if now is None:
                files = list(self._stats)
                now = pl.LazyFrame(
                    {"file": files, "inode": [self._stats[name].st_ino for name in files]},
                    schema={"file": pl.String(), "inode": pl.UInt64()},
                )
            try:
                frame = (
                    read_where(chain, FACTS_VERSION)
                    .join(now, on=["file", "inode"], how="semi")
                    .with_columns(
                        pl.lit(journal, pl.Int32()).alias("journal"),
                        pl.lit(-1, pl.Int64()).alias("kept"),
                        pl.lit(True).alias("segment"),
                    )
                    .select(list(_ENTRY_SCHEMA))
                    .collect()
                )
            except (OSError, pl.exceptions.PolarsError):
                continue
            if not complete(frame, (*WHERE_COLUMNS, "index")):
                continue  # not a segment ``write`` wrote: its lines are decoded
            frames.append(frame)
            self.chains[journal] = chain
            self._first[journal] = chain[-1].end_line
            self._since[journal] = [chain[-1].inode, chain[-1].end]
        return frames

    def decoded_chunks(self) -> Iterator[tuple[int, int, Sequence[JournalLine | None]]]:
        """The journals decoded again, a chunk at a time (for journals too large to keep):
        ``(journal, index of the chunk's first line, one entry or None per line)``."""
        for journal, path in enumerate(self.paths):
            start = self._first[journal]
            for chunk in journal_chunks(path, self._since[journal]):
                entries: Sequence[JournalLine | None] = decode_each(JOURNAL_LINE, chunk)
                yield journal, start, entries
                start += len(entries)


def _cover(
    entries: pl.DataFrame,
    stats: Mapping[str, StatLike],
    racy: Container[str],
    bases: Mapping[str, tuple[int, int]],
) -> tuple[pl.DataFrame, dict[str, Coverage]]:
    """The entries of the files they account for entirely (in line order, from the file's
    base on), and those files."""
    names = list(stats)
    now = pl.DataFrame(
        {
            "file": names,
            "now_size": [stats[n].st_size for n in names],
            "now_mtime": [stats[n].st_mtime_ns for n in names],
        },
        schema={"file": pl.String(), "now_size": pl.Int64(), "now_mtime": pl.Int64()},
    )
    based = list(bases)
    base = pl.DataFrame(
        {
            "file": based,
            "base_size": [bases[n][0] for n in based],
            "base_mtime": [bases[n][1] for n in based],
        },
        schema={"file": pl.String(), "base_size": pl.Int64(), "base_mtime": pl.Int64()},
    )
    end = pl.col("offset") + pl.col("length") + 1
    ordered = (
        entries.join(base, on="file", how="left")
        .with_columns(pl.col("base_size").fill_null(0))
        # Lines before the base were read or vouched for when the index recorded it.
        .filter(pl.col("offset") >= pl.col("base_size"))
        .sort("file", "offset")
    )
    files = (
        ordered.group_by("file", maintain_order=True)
        .agg(
            # Line after line from the base, no offset twice: each starts where the one before
            # ended, and found the file as the one before left it (size and mtime; the first,
            # as the index recorded it): a change made in between, whose mtime the later
            # append hid, breaks the chain. A file without a base starts at 0.
            (
                (pl.col("offset") == end.shift(1).fill_null(pl.col("base_size")))
                & (pl.col("size_before") == pl.col("size").shift(1).fill_null(pl.col("base_size")))
                & (
                    pl.col("mtime_before_ns")
                    == pl.col("mtime_ns")
                    .shift(1)
                    .fill_null(pl.col("base_mtime"))
                    .fill_null(pl.col("mtime_before_ns"))
                )
            )
            .all()
            .alias("contiguous"),
            end.last().alias("end"),
            pl.col("size").last(),
            pl.col("mtime_ns").last(),
            pl.col("inode").first(),
            pl.len().alias("lines"),
        )
        .join(now, on="file")
        .filter(
            pl.col("contiguous")
            & (pl.col("end") == pl.col("now_size"))
            & (pl.col("size") == pl.col("now_size"))
            & (pl.col("mtime_ns") == pl.col("now_mtime"))
        )
    )
    covered = {
        name: Coverage(name, size, mtime, inode, lines, name in racy)
        for name, size, mtime, inode, lines in files.select(
            "file", "size", "mtime_ns", "inode", "lines"
        ).iter_rows()
    }
    kept = (
        ordered.join(files.select("file"), on="file", how="semi")
        .drop("base_size", "base_mtime")
        .sort("file", "offset")
    )
    return kept, covered


def _chain(path: str, names: Sequence[str]) -> list[Segment]:
    """The chain of segments of the journal at ``path`` (none when it cannot be opened);
    ``names``: its folder's listing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        return segment_chain(path, fd, names)
    finally:
        os.close(fd)


def _current(line: JournalLine) -> bool:
    facts = line.ngcapture_facts
    return facts is not None and facts.v == FACTS_VERSION
