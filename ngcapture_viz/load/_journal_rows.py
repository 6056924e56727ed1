"""Rows of capture files read from the capture servers' facts journals (``_journal``).

``JournalRows.take`` serves the tasks whose files the journals account for — from the
beginning, or from an index's append point — with the same ``FactsRows`` code as lines read
from their facts, and the index state of each (no byte of the file read, so no hashes); it
returns the tasks left to the line readers of ``_scan``.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from stat import S_ISREG
from typing import cast

import polars as pl

from capture_core.facts_journal import JOURNAL_DIR
from ngcapture_viz.load._facts_rows import FactsRows
from ngcapture_viz.load._file_state import FileState, FileTask, is_racy
from ngcapture_viz.load._journal import Coverage, JournalChanged, JournalLine, Journals
from ngcapture_viz.load._line_types import FastLine
from ngcapture_viz.load.journal_segments import (
    NEVER_NULL,
    complete,
    read_entries,
    segment_frames,
)

__all__ = ["JournalRows"]


class JournalRows:
    """The rows, index states and count of lines taken from journals, as frames of at most
    ``chunk_rows`` rows."""

    def __init__(self, chunk_rows: int) -> None:
        self.chunk_rows = chunk_rows
        self.frames: list[tuple[pl.DataFrame, pl.DataFrame]] = []
        self.states: list[FileState] = []
        self.count = 0
        self.from_segments = 0  # of ``count``, rows read from columnar segments

    def take(
        self, tasks: list[FileTask], given: Mapping[str, Journals] | None = None
    ) -> list[FileTask]:
        """Rows of the files our servers' facts journals account for (the index's appends
        too, from the entry at the task's start); returns the tasks left to read line by
        line. ``given``: journals already read, by directory (the index's planner reads them
        to tell an append from a rewrite); the others are read here."""
        rest: list[FileTask] = []
        by_directory: dict[str, list[FileTask]] = defaultdict(list)
        for task in tasks:
            by_directory[os.path.dirname(task.path)].append(task)
        for directory, group in by_directory.items():
            journals = (given or {}).get(directory)
            if journals is None:
                if not os.path.isdir(os.path.join(directory, JOURNAL_DIR)):
                    rest += group
                    continue
                journals = Journals(directory, _stats(group))
            rows, taken = _journal_rows(journals, group)
            for number, task in enumerate(group):
                count = taken.get(number)
                if count is None:
                    rest.append(task)
                else:
                    coverage = journals.covered[task.name]
                    self.states.append(_journal_state(task, coverage, count))
            self._add_journal_rows(journals, group, rows, directory)
        return rest

    def _add_journal_rows(
        self, journals: Journals, group: list[FileTask], rows: pl.DataFrame, directory: str
    ) -> None:
        """Add ``rows`` (``_journal_rows``) to the journal's columnar rows, from the entries
        kept by the first pass, or else decoded again a chunk at a time."""
        tasks = _TaskColumns(group)
        if any(journals.chains):
            self._emit_segments(tasks, rows.filter("segment"), journals, directory)
            rows = rows.filter(~pl.col("segment"))
        if journals.kept is not None:
            self._emit(tasks, rows, journals.kept, rows["kept"])
            return
        taken = 0
        for journal, start, entries in journals.decoded_chunks():
            index = pl.col("index")
            part = rows.filter(
                (pl.col("journal") == journal) & index.is_between(start, start + len(entries) - 1)
            )
            if part.height:
                self._emit(tasks, part, entries, part["index"] - start)
                taken += part.height
        if taken != rows.height:
            raise JournalChanged(directory)

    def _emit_segments(
        self, group: _TaskColumns, rows: pl.DataFrame, journals: Journals, directory: str
    ) -> None:
        """Rows from the journals' columnar segments, one segment read at a time."""
        changed = JournalChanged(directory)
        taken = 0
        wanted = rows.select(
            "journal", "task", "index", "call_index", "line_number",
            pl.col("offset").alias("row_offset"),
        )  # fmt: skip
        names = pl.Series(group.names, dtype=pl.String())
        rollout_ids = pl.Series(group.rollout_ids, dtype=pl.String())
        paths = pl.Series(group.paths, dtype=pl.String())
        for journal, chain in enumerate(journals.chains):
            mine = wanted.filter(pl.col("journal") == journal)
            for segment in chain:
                part = mine.filter(
                    pl.col("index").is_between(segment.first_line, segment.end_line - 1)
                )
                if not part.height:
                    continue
                try:
                    found = (
                        read_entries([segment])
                        .join(part.lazy(), left_on="line", right_on="index")
                        .sort("task", "offset")
                        .collect()
                    )
                except (OSError, pl.exceptions.PolarsError) as exc:
                    raise changed from exc
                # The entry the first pass read for this file at this offset, or the segment
                # changed since (a row from another entry would be a wrong row).
                task = found["task"]
                if not complete(found, NEVER_NULL):  # not a segment ``write`` wrote
                    raise changed
                if found.height != part.height or not (
                    found["file"].equals(names.gather(task).alias("file"))
                    and found["offset"].equals(found["row_offset"].alias("offset"))
                ):
                    raise changed
                for start in range(0, found.height, self.chunk_rows):
                    piece = found.slice(start, self.chunk_rows)
                    at = piece["task"]
                    self.frames.append(
                        segment_frames(piece, rollout_ids.gather(at), paths.gather(at))
                    )
                taken += found.height
        if taken != rows.height:
            raise changed
        self.count += taken
        self.from_segments += taken

    def _emit(
        self,
        group: _TaskColumns,
        rows: pl.DataFrame,
        entries: Sequence[JournalLine | None],
        at: pl.Series,
    ) -> None:
        """Rows from ``entries`` (``at``: where each row's entry is in it), as frames."""
        # Per row, picked in C (``map`` of ``__getitem__``): rows are ~5 per file.
        picked = list(map(entries.__getitem__, at.to_list()))
        tasks = rows["task"].to_list()
        # Each decoded in the first pass, for this file at this offset: anything else means the
        # journal was rewritten since (a row from another entry would be a wrong row).
        changed = JournalChanged(os.path.dirname(group.paths[0]))
        if any(line is None for line in picked):
            raise changed
        lines = cast("list[JournalLine]", picked)
        if [line.file for line in lines] != list(map(group.names.__getitem__, tasks)):
            raise changed
        if [line.offset for line in lines] != rows["offset"].to_list():
            raise changed
        for start in range(0, rows.height, self.chunk_rows):
            part = rows.slice(start, self.chunk_rows)
            order = tasks[start : start + self.chunk_rows]
            journal = FactsRows(JournalLine)
            journal.extend_rows(
                cast("list[FastLine]", lines[start : start + self.chunk_rows]),
                list(map(group.rollout_ids.__getitem__, order)),
                part["call_index"].to_list(),
                part["line_number"].to_list(),
                part["offset"].to_list(),
                part["length"].to_list(),
                list(map(group.paths.__getitem__, order)),
            )
            self.frames.append(journal.frames())
        self.count += rows.height


class _TaskColumns:
    """The name, rollout id and path of each task of a directory, as lists (rows pick theirs
    by task number)."""

    def __init__(self, group: list[FileTask]) -> None:
        self.names = [task.name for task in group]
        self.rollout_ids = [task.rollout_id for task in group]
        self.paths = [task.path for task in group]


def _stats(tasks: list[FileTask]) -> dict[str, os.stat_result]:
    """``stat`` of each task's file (by name) that a journal may vouch for: a regular file not
    modified within the racy window of its scan."""
    stats: dict[str, os.stat_result] = {}
    for task in tasks:
        try:
            stat = os.stat(task.path, follow_symlinks=False)
        except OSError:
            continue  # read line by line: that reports why it is unreadable
        if S_ISREG(stat.st_mode) and not is_racy(stat.st_mtime_ns, task.scan_ns):
            stats[task.name] = stat
    return stats


def _journal_rows(journals: Journals, group: list[FileTask]) -> tuple[pl.DataFrame, dict[int, int]]:
    """The rows the journals give for the tasks (``task``: its number in ``group``) — every
    entry of a covered file from the one starting at the task's ``start`` — and, per task they
    serve, how many; a task whose ``start`` is no entry's start is not served."""
    covered = {name for name, coverage in journals.covered.items() if not coverage.racy}
    numbers = [i for i, task in enumerate(group) if task.name in covered]
    wanted = pl.DataFrame(
        {
            "file": [group[i].name for i in numbers],
            "task": numbers,
            "start": [group[i].start for i in numbers],
            "first_index": [group[i].call_index for i in numbers],
            "first_line": [group[i].line for i in numbers],
        },
        schema={"file": pl.String(), "task": pl.Int64(), "start": pl.Int64(),
                "first_index": pl.Int64(), "first_line": pl.Int64()},
    )  # fmt: skip
    rows = (
        journals.entries.join(wanted, on="file")
        .filter(pl.col("offset") >= pl.col("start"))
        .sort("task", "offset")
        .with_columns(pl.int_range(pl.len()).over("task").alias("number"))
    )
    served = rows.group_by("task").agg(
        (pl.col("offset").first() == pl.col("start").first()).alias("aligned"), pl.len()
    )
    served = served.filter("aligned")
    rows = rows.join(served.select("task"), on="task", how="semi").select(
        "task",
        "journal",
        "index",
        "kept",
        "segment",
        "offset",
        "length",
        (pl.col("first_index") + pl.col("number")).alias("call_index"),
        (pl.col("first_line") + pl.col("number")).alias("line_number"),
    )
    return rows, dict(zip(served["task"].to_list(), served["len"].to_list(), strict=True))


def _journal_state(task: FileTask, coverage: Coverage, count: int) -> FileState:
    """The index's state of a file read from the journal (``count`` lines from the task's
    start). No byte of it was read, so no hashes: a later change is judged by the journal
    again (an append it vouches for), else the file is read anew."""
    return FileState(
        name=task.name,
        rollout_id=task.rollout_id,
        size=coverage.size,
        mtime_ns=coverage.mtime_ns,
        inode=coverage.inode,
        consumed=coverage.size,
        next_call_index=task.call_index + count,
        next_line=task.line + count,
        head_hash=None,
        tail_hash=None,
        scanned_ns=task.scan_ns,
    )
