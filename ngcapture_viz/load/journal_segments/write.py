"""Writing segments (``ngcapture compact``): the stretches of a journal no usable segment holds
yet, decoded by the reader's own decoder, one stretch (``journal_chunks``' chunk, ~32 MB of
whole lines) at a time, each written to a temporary file, fsynced and renamed into place."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from collections.abc import Sequence
from typing import Final

import numpy as np
import polars as pl

from capture_core.facts_journal import JOURNAL_DIR, JOURNAL_SUFFIX
from ngcapture_viz.load._facts_rows import FACT_COLUMNS, TOOL_FIELDS, FlatTools, columns_of
from ngcapture_viz.load._journal_files import chunks_from, decode_each
from ngcapture_viz.load._line_types import JOURNAL_LINE, JournalLine, _Facts, _Tool
from ngcapture_viz.load.journal_segments.chain import (
    Segment,
    named_segments,
    segment_chain,
    tail_hash,
)
from ngcapture_viz.load.journal_segments.schema import (
    ENVELOPE_COLUMNS,
    SEGMENT_FORMAT,
    SEGMENT_SCHEMA,
    TOOL_TYPE,
)

__all__ = ["entry_frame", "journal_files", "write_segments"]

_TEMPORARY_PREFIX: Final = ".segment-"
_MAX_INODE: Final = 2**64 - 1
#: A temporary file this old is one a killed ``write_segments`` left behind.
_ABANDONED_S: Final = 3600.0


def journal_files(target: str) -> list[str]:
    """The facts journals of a capture directory (its ``.facts/*.jsonl``), or ``target``
    itself when it is one journal file (a ``.jsonl`` in a ``.facts`` folder: not a capture
    file, beside which a segment would be a foreign file of the store)."""
    folder = os.path.join(target, JOURNAL_DIR)
    if os.path.isdir(folder):
        return [os.path.join(folder, name) for name in sorted(os.listdir(folder))
                if name.endswith(JOURNAL_SUFFIX)]  # fmt: skip
    in_journal_dir = os.path.basename(os.path.dirname(os.path.abspath(target))) == JOURNAL_DIR
    is_journal = target.endswith(JOURNAL_SUFFIX) and in_journal_dir and os.path.isfile(target)
    return [target] if is_journal else []


def write_segments(journal_path: str) -> list[str]:
    """Write segments for the part of the journal no usable segment holds yet; returns their
    paths. Segments of the journal's name made for another inode (a journal replaced since)
    and temporary files a killed run left behind are removed. Each segment gets the
    journal's permissions.

    Raises:
        OSError: the journal or its folder could not be read or written (what was written
            before stands: each segment is whole).
    """
    folder, journal_name = os.path.split(journal_path)
    written: list[str] = []
    fd = os.open(journal_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        found = os.fstat(fd)
        names = os.listdir(folder)
        _remove_stale(folder, journal_name, names, found.st_ino)
        chain = segment_chain(journal_path, fd, names)
        start, line = (chain[-1].end, chain[-1].end_line) if chain else (0, 0)
        mode = stat.S_IMODE(found.st_mode) & 0o666
        # The same descriptor the chain was checked on: a journal replaced meanwhile is not
        # read from an offset that was another file's.
        for chunk in chunks_from(fd, [found.st_ino, start] if start else None):
            entries = decode_each(JOURNAL_LINE, chunk)
            end = start + len(chunk)
            segment = Segment("", found.st_ino, start, end, line, line + len(entries),
                              tail_hash(chunk))  # fmt: skip
            path = os.path.join(folder, segment.name_for(journal_name))
            _write(entry_frame(entries, line), path, mode)
            written.append(path)
            start, line = end, segment.end_line
    finally:
        os.close(fd)
    return written


def _remove_stale(folder: str, journal_name: str, names: Sequence[str], inode: int) -> None:
    """Remove segments named for ``journal_name`` as another inode (no journal will match
    them again) or in an older format (no reader of this version reads them; a newer
    version's are left alone), and abandoned temporary files."""
    stale = [s.path for s in named_segments(folder, journal_name, names, any_format=True)
             if s.inode != inode or s.format < SEGMENT_FORMAT]  # fmt: skip
    now = time.time()
    for name in names:
        if name.startswith(_TEMPORARY_PREFIX):
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                if now - os.stat(path).st_mtime > _ABANDONED_S:
                    stale.append(path)
    for path in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def entry_frame(entries: Sequence[JournalLine | None], first_line: int) -> pl.DataFrame:
    """The segment rows of decoded entries (``None``: a line that did not decode, left out),
    the first being line ``first_line`` of the journal."""
    # An inode past 64 bits decodes (msgspec's bounds stop at int64) but is no file's:
    # left out, as a line that does not decode.
    usable = [entry is not None and entry.inode <= _MAX_INODE for entry in entries]
    lines = [first_line + number for number, ok in enumerate(usable) if ok]
    kept = [entry for entry, ok in zip(entries, usable, strict=True) if entry is not None and ok]
    column = columns_of(kept, JournalLine)
    refs = column["model_ref"]
    facts = column["ngcapture_facts"]
    present = [fact for fact in facts if fact is not None]
    fact = columns_of(present, _Facts)
    where = np.flatnonzero(np.fromiter((f is not None for f in facts), bool, count=len(facts)))

    def typed(name: str, values: Sequence[object]) -> pl.Series:
        return pl.Series(name, values, dtype=SEGMENT_SCHEMA[name])

    def spread(name: str, values: Sequence[object]) -> pl.Series:
        """Facts of the entries that have them, null for the others."""
        full = typed(name, [None] * len(kept))
        return full.scatter(where, typed(name, values)) if len(where) else full

    series = [
        typed("line", lines),
        *(typed(name, column[name]) for name in ENVELOPE_COLUMNS),
        typed("model_ref_type", [None if ref is None else ref.type for ref in refs]),
        typed("model_ref_name", [None if ref is None else ref.name for ref in refs]),
        spread("v", fact["v"]),
        *(spread(name, fact[name]) for name in FACT_COLUMNS),
        _tool_lists([[] if f is None else f.tool_calls for f in facts]),
    ]
    return pl.DataFrame(series).select(list(SEGMENT_SCHEMA))


def _tool_lists(per_row: Sequence[list[_Tool]]) -> pl.Series:
    """The tool calls of each row as a ``List(Struct)`` column (an empty list for none): the
    flat tool calls, gathered back into their rows by Polars (a list per row built in Python
    is slow)."""
    tools = FlatTools(per_row)
    tool = tools.fields()
    fields = TOOL_TYPE.to_schema()
    structs = pl.DataFrame(
        {name: pl.Series(values=tool[name], dtype=fields[name]) for name in TOOL_FIELDS}
    ).select(pl.struct(*fields).alias("tool"))["tool"]
    return tools.per_row(structs).cast(pl.List(TOOL_TYPE)).alias("tool_calls")


def _write(frame: pl.DataFrame, path: str, mode: int) -> None:
    """Write ``frame`` to ``path`` whole or not at all (a temporary file, fsynced, renamed
    into place), with permissions ``mode``."""
    folder = os.path.dirname(path)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=_TEMPORARY_PREFIX, suffix=".tmp")
    try:
        os.fchmod(handle, mode)
        frame.write_parquet(temporary, statistics=False)
        os.fsync(handle)  # its bytes on disk before its name: a crash leaves no torn segment
        os.rename(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    finally:
        os.close(handle)
