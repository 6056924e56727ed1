"""Columnar segments of a facts journal: its entries decoded once and kept as Parquet.

A cold open decodes every entry of a directory's facts journals (``_journal``): for a store
of 250 MB that is about half of the open. A segment holds the entries of one stretch of a
journal (bytes ``start`` to ``end``, whole lines; lines ``first_line`` to ``end_line``) as
columns, decoded by the very decoder the reader uses (``JournalLine``), so a reader that finds
a chain of segments from the journal's first byte reads their columns instead of decoding
those lines, and decodes only the lines after the chain's end. Entries that do not decode
are not in a segment, as the reader would skip them; nothing else is left out.

A segment is a cache of a cache: the entries it gives are checked against the capture files
exactly like decoded ones (``_journal``'s chain of sizes, mtimes and inodes), and a segment is
used only when its name matches the journal as it is now::

    <journal stem>.s<format>.<journal inode>.<start>-<end>.<first line>-<end line>.<tail>.parquet

``tail``: a BLAKE2b-64 of the stretch's last (up to) 256 bytes, compared with the journal's
bytes there. A segment of another format, another inode, past the journal's end or whose tail
differs is ignored (the journal's lines are read); deleting segments loses nothing.

Segments are written by ``write_segments`` (``ngcapture compact``): a capture server runs that
in a separate process each time its journal has grown by ``journal_segment_bytes`` and when it
stops (``capture_core.facts_journal``), so the server never imports Polars and a segment is
built off the calls' path. **Bump SEGMENT_FORMAT whenever ``JournalLine`` (its fields, their types
or constraints) or the columns below change**: a test pins them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from capture_core.facts_journal import JOURNAL_DIR, JOURNAL_SUFFIX
from ngcapture_viz.load._facts_rows import FACT_COLUMNS, TOOL_FIELDS, columns_of, facts_frames
from ngcapture_viz.load._journal_files import decode_each, journal_chunks
from ngcapture_viz.load._line_types import JOURNAL_LINE, JournalLine, _Facts, _Tool

__all__ = [
    "SEGMENT_FORMAT",
    "SEGMENT_SCHEMA",
    "Segment",
    "journal_files",
    "segment_chain",
    "write_segments",
]

#: What a segment holds (its columns and what decoded them); part of its name.
SEGMENT_FORMAT: Final = 1
SEGMENT_SUFFIX: Final = ".parquet"
#: Bytes at the end of a segment's stretch whose hash is in its name.
TAIL_BYTES: Final = 256

_TOOL: Final = pl.Struct(
    {
        "choice_index": pl.Int64(),
        "call_id": pl.String(),
        "type": pl.String(),
        "name": pl.String(),
        "arguments": pl.String(),
        "arguments_raw": pl.String(),
        "arguments_parse_error": pl.Boolean(),
    }
)
_COUNTS = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens",
           "cache_creation_tokens")  # fmt: skip
_FACT_TYPES: Final = {
    "response_id": pl.String(),
    "model": pl.String(),
    "stream": pl.Boolean(),
    "response_status": pl.String(),
    "finish_reason": pl.String(),
    **dict.fromkeys(_COUNTS, pl.Int64()),
    "reasoning_content": pl.String(),
    "error_code": pl.String(),
    "error_message": pl.String(),
}
#: The columns of a segment: one row per entry that decodes, ``line`` its line in the journal
#: (from 0), ``v`` its facts' version (null: none), ``tool_calls`` never null.
SEGMENT_SCHEMA: Final = {
    "line": pl.Int64(),
    "file": pl.String(),
    "offset": pl.Int64(),
    "length": pl.Int64(),
    "size": pl.Int64(),
    "mtime_ns": pl.Int64(),
    "inode": pl.Int64(),
    "size_before": pl.Int64(),
    "mtime_before_ns": pl.Int64(),
    "model_call_id": pl.String(),
    "dialect": pl.String(),
    "model_ref_type": pl.String(),
    "model_ref_name": pl.String(),
    "started_at": pl.Float64(),
    "completed_at": pl.Float64(),
    "latency_ms": pl.Float64(),
    "latency_ttft_ms": pl.Float64(),
    "status_code": pl.Int64(),
    "error_category": pl.String(),
    "v": pl.Int64(),
    **_FACT_TYPES,
    "tool_calls": pl.List(_TOOL),
}
_WHERE = ("file", "offset", "length", "size", "mtime_ns", "inode", "size_before",
          "mtime_before_ns")  # fmt: skip
#: Columns taken as they are from the entries.
_ENVELOPE = (*_WHERE, "model_call_id", "dialect", "started_at", "completed_at", "latency_ms",
             "latency_ttft_ms", "status_code", "error_category")  # fmt: skip
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

    def name_for(self, journal_name: str) -> str:
        stem = journal_name.removesuffix(JOURNAL_SUFFIX)
        return (
            f"{stem}.s{SEGMENT_FORMAT}.{self.inode}.{self.start}-{self.end}"
            f".{self.first_line}-{self.end_line}.{self.tail}{SEGMENT_SUFFIX}"
        )


def _tail_hash(data: bytes) -> str:
    return hashlib.blake2b(data[-TAIL_BYTES:], digest_size=8).hexdigest()


def _named(folder: str, journal_name: str, names: Sequence[str], inode: int) -> list[Segment]:
    """The segments of the current format named for ``journal_name`` as inode ``inode``."""
    stem = journal_name.removesuffix(JOURNAL_SUFFIX)
    found: list[Segment] = []
    for name in names:
        match = _NAME.match(name)
        if (
            match is None
            or match["stem"] != stem
            or int(match["format"]) != SEGMENT_FORMAT
            or int(match["inode"]) != inode
        ):
            continue
        start, end = int(match["start"]), int(match["end"])
        first, last = int(match["first"]), int(match["last"])
        if start < end and first <= last:
            found.append(
                Segment(os.path.join(folder, name), inode, start, end, first, last, match["tail"])
            )
    return found


def segment_chain(journal_path: str, fd: int, names: Sequence[str] | None = None) -> list[Segment]:
    """The segments that hold the open journal ``fd`` from its first byte on, one after the
    other (each starts where the one before ended, byte and line), each within the journal
    and with its tail's hash matching the journal's bytes; at each step the longest that
    does. ``names``: the journal folder's listing, if at hand."""
    folder, journal_name = os.path.split(journal_path)
    try:
        stat = os.fstat(fd)
        if names is None:
            names = os.listdir(folder)
    except OSError:
        return []
    by_start: dict[int, list[Segment]] = {}
    for segment in _named(folder, journal_name, names, stat.st_ino):
        if segment.end <= stat.st_size:
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
    return len(data) == length and data.endswith(b"\n") and _tail_hash(data) == segment.tail


def _readable(segment: Segment) -> bool:
    """Whether the segment's Parquet footer names exactly the columns of ``SEGMENT_SCHEMA``
    (a file cut short or of other columns is not part of a chain, and ``write_segments``
    writes it again)."""
    try:
        return pl.read_parquet_schema(segment.path) == SEGMENT_SCHEMA
    except (OSError, pl.exceptions.PolarsError, ValueError):
        return False


def read_where(chain: Sequence[Segment], facts_version: int) -> pl.LazyFrame:
    """The entries of ``chain`` with facts of ``facts_version``: where each line is, and its
    line number as ``index``."""
    return (
        pl.scan_parquet([segment.path for segment in chain], schema=SEGMENT_SCHEMA)
        .filter(pl.col("v") == facts_version)
        .select(*_WHERE, pl.col("line").alias("index"))
    )


def read_entries(chain: Sequence[Segment]) -> pl.LazyFrame:
    """Every column of the entries of ``chain``."""
    return pl.scan_parquet([segment.path for segment in chain], schema=SEGMENT_SCHEMA)


class ListTools:
    """``ToolColumns`` of a ``tool_calls`` column of lists (a segment's)."""

    def __init__(self, tool_calls: pl.Series) -> None:
        counts = tool_calls.list.len().cast(pl.Int64).to_numpy()
        self._lists = tool_calls
        self.rows = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        firsts = np.repeat(np.cumsum(counts) - counts, counts)
        self.positions = np.arange(len(self.rows), dtype=np.int64) - firsts

    def names(self) -> pl.Series:
        return (
            self._lists.list.eval(pl.element().struct.field("name"))
            .cast(pl.List(pl.String()))
            .alias("tool_names")
        )

    def fields(self) -> dict[str, pl.Series]:
        flat = self._lists.explode(empty_as_null=False).drop_nulls()
        return {name: flat.struct.field(name) for name in TOOL_FIELDS}


def segment_frames(
    entries: pl.DataFrame, rollout_ids: pl.Series, paths: pl.Series
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The ``calls`` and ``tool_calls`` rows of segment ``entries`` (their columns, with each
    row's ``call_index`` and ``line_number``), as ``FactsRows.frames`` builds them from the
    decoded entries (``rollout_ids``, ``paths``: each row's)."""
    data: dict[str, pl.Series] = {
        "rollout_id": rollout_ids,
        **{name: entries[name] for name in _ROW_COLUMNS},
        "latency_total_ms": entries["latency_ms"],
        **{name: entries[name] for name in FACT_COLUMNS},
        "num_tool_calls": entries["tool_calls"].list.len(),
        "byte_offset": entries["offset"],
        "line_bytes": entries["length"],
        "path": paths,
    }
    return facts_frames(data, ListTools(entries["tool_calls"]))


_ROW_COLUMNS = ("call_index", "model_call_id", "model_ref_type", "model_ref_name", "dialect",
                "status_code", "started_at", "completed_at", "latency_ttft_ms",
                "error_category", "line_number")  # fmt: skip


def entry_frame(entries: Sequence[JournalLine | None], first_line: int) -> pl.DataFrame:
    """The segment rows of decoded entries (``None``: a line that did not decode, left out),
    the first being line ``first_line`` of the journal."""
    lines = [first_line + number for number, entry in enumerate(entries) if entry is not None]
    kept = [entry for entry in entries if entry is not None]
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
        *(typed(name, column[name]) for name in _ENVELOPE),
        typed("model_ref_type", [None if ref is None else ref.type for ref in refs]),
        typed("model_ref_name", [None if ref is None else ref.name for ref in refs]),
        spread("v", fact["v"]),
        *(spread(name, fact[name]) for name in FACT_COLUMNS),
        _tool_lists([[] if f is None else f.tool_calls for f in facts]),
    ]
    return pl.DataFrame(series).select(list(SEGMENT_SCHEMA))


def _tool_lists(per_row: Sequence[list[_Tool]]) -> pl.Series:
    """The tool calls of each row as a ``List(Struct)`` column (an empty list for none)."""
    counts = np.fromiter(map(len, per_row), dtype=np.int64, count=len(per_row))
    flat = [tool for tools in per_row for tool in tools]
    tool = columns_of(flat, _Tool)
    structs = pl.DataFrame(
        {name: pl.Series(values=tool[name], dtype=_TOOL.to_schema()[name]) for name in TOOL_FIELDS}
    ).select(pl.struct(*TOOL_FIELDS).alias("tool"))["tool"]
    rows = np.repeat(np.arange(len(per_row), dtype=np.int64), counts)
    grouped = (
        pl.DataFrame({"row": rows}, schema={"row": pl.Int64()})
        .with_columns(structs)
        .group_by("row", maintain_order=True)
        .agg("tool")
    )
    every = pl.DataFrame({"row": pl.int_range(len(per_row), eager=True, dtype=pl.Int64)})
    joined = every.join(grouped, on="row", how="left", maintain_order="left")
    return joined["tool"].fill_null([]).cast(pl.List(_TOOL)).alias("tool_calls")


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
    """Write segments for the part of the journal no segment holds yet (one per chunk of
    whole lines ``journal_chunks`` gives); returns their paths. A failure (disk full, a
    journal replaced meanwhile) stops it: what was written stands, the rest is read as
    lines."""
    folder, journal_name = os.path.split(journal_path)
    written: list[str] = []
    try:
        fd = os.open(journal_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return written
    try:
        inode = os.fstat(fd).st_ino
        chain = segment_chain(journal_path, fd)
        start, line = (chain[-1].end, chain[-1].end_line) if chain else (0, 0)
        since = [inode, start] if start else None
        for chunk in journal_chunks(journal_path, since):
            entries = decode_each(JOURNAL_LINE, chunk)
            end = start + len(chunk)
            segment = Segment("", inode, start, end, line, line + len(entries), _tail_hash(chunk))
            path = os.path.join(folder, segment.name_for(journal_name))
            _write(entry_frame(entries, line), path)
            written.append(path)
            start, line = end, segment.end_line
    except (OSError, pl.exceptions.PolarsError, ValueError, TypeError, OverflowError):
        pass
    finally:
        os.close(fd)
    return written


def _write(frame: pl.DataFrame, path: str) -> None:
    """Write ``frame`` to ``path`` whole or not at all (a temporary file renamed into place)."""
    folder = os.path.dirname(path)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".segment-", suffix=".tmp")
    try:
        os.fchmod(handle, 0o644)  # as the journal: readable by whoever reads the store
        frame.write_parquet(temporary, statistics=False)
        os.fsync(handle)  # its bytes on disk before its name: a crash leaves no torn segment
        os.rename(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    finally:
        os.close(handle)
