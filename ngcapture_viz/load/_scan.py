"""Parse capture files (or the bytes appended to them) into call, tool-call and damage rows.

This is the one place the analysis side turns capture lines into rows. Each line is read by
``_decode.LineDecoder``: from the facts our server writes into it when it has them, else from
its bodies with ``capture_core``'s dialect code, and through ``capture_core``'s own reader
(``orjson`` + the pydantic model) whenever the fast decoders could judge it differently; so a
row always equals the record ``read_model_call_records`` returns for the same line (for lines
with facts: the record the writer computed, which ``verify`` checks). Rows are turned into
typed frames every ``CHUNK_ROWS`` calls, so a large store never holds them all as Python
objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import msgspec
import orjson
import polars as pl

from capture_core import InvalidRecordError, paused_gc
from capture_core._lines import TORN_REASON
from ngcapture_viz.frames.calls import CallColumns
from ngcapture_viz.frames.gaps import AnalysisGap, GapRows
from ngcapture_viz.frames.tool_calls import ToolCallColumns
from ngcapture_viz.load._call_values import CallValues
from ngcapture_viz.load._decode import FactsMismatch, LineDecoder, NotAnObject
from ngcapture_viz.load._facts_rows import FactsRows
from ngcapture_viz.load._file_bytes import FileBytes, fingerprint, read_file
from ngcapture_viz.load._file_state import RACY_NS, FileState, FileTask, is_racy
from ngcapture_viz.load._journal import JournalChanged, Journals
from ngcapture_viz.load._journal_rows import JournalRows
from ngcapture_viz.load._line_types import (
    FastLine,
    decode_fast,
    keep_for_facts,
)

__all__ = ["RACY_NS", "FileState", "FileTask", "ScanResult", "fingerprint", "is_racy", "scan_files"]

#: Call rows held as Python tuples before they become a typed frame.
CHUNK_ROWS: Final = 65_536
_BLANK: Final = b" \t\r"


@dataclass
class ScanResult:
    calls: pl.DataFrame
    tool_calls: pl.DataFrame
    damaged: pl.DataFrame
    states: list[FileState] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    bytes_parsed: int = 0
    processes: int = 1
    #: Lines read from their facts, from their bodies, and by the exact reader.
    decoded: dict[str, int] = field(default_factory=dict)


def scan_files(
    tasks: list[FileTask], *, verify: bool = False, journals: Mapping[str, Journals] | None = None
) -> ScanResult:
    """Parse every task's bytes; unreadable files are reported, never raised.

    ``verify``: recompute the facts of lines that carry them from their bodies, use the
    recomputed values and report each line whose facts differ (gap ``capture_facts_differ``).
    ``journals``: the facts journals already read, by directory (others are read here).
    """
    # The frames are built, and the rows they were built from freed, before the collector
    # resumes: its first pass then has a few frames to walk, not every row.
    with paused_gc():
        scanner = _Scanner(verify=verify)
        rest = tasks
        if not verify:  # ``verify`` recomputes every line's facts from its bodies
            taken = JournalRows(CHUNK_ROWS)
            try:
                rest = taken.take(tasks, journals)
            except JournalChanged:  # rewritten under us (entries only get appended): read all
                rest = tasks
            else:
                scanner.frames += taken.frames
                scanner.states += taken.states
                scanner.from_journal = taken.count
                scanner.from_segments = taken.from_segments
        for task in rest:
            scanner.scan(task)
        return scanner.result()


class _Scanner:
    def __init__(self, *, verify: bool) -> None:
        self.decoder = LineDecoder(verify=verify)
        self.verify = verify
        self.fast = FactsRows()
        self.calls = CallColumns()
        self.tools = ToolCallColumns()
        self.damaged = GapRows()
        self.frames: list[tuple[pl.DataFrame, pl.DataFrame]] = []
        self.states: list[FileState] = []
        self.unreadable: list[tuple[str, str]] = []
        self.parsed = 0
        self.from_journal = 0
        self.from_segments = 0  # of those, rows read from the journals' columnar segments

    def scan(self, task: FileTask) -> None:
        try:
            state, size = self._scan_one(task, read_file(task))
        except OSError as exc:
            self.unreadable.append((task.name, f"{type(exc).__name__}: {exc.strerror or exc}"))
            return
        self.states.append(state)
        self.parsed += size
        if len(self.calls) + len(self.fast) >= CHUNK_ROWS:
            self._flush()

    def _flush(self) -> None:
        if len(self.fast):
            self.frames.append(self.fast.frames())
            self.fast = FactsRows()
        if len(self.calls) or not self.frames:
            self.frames.append((self.calls.frame(), self.tools.frame()))
            self.calls, self.tools = CallColumns(), ToolCallColumns()

    def result(self) -> ScanResult:
        self._flush()
        decoded = dict(self.decoder.counts)
        if self.from_journal:
            decoded["journal"] = self.from_journal
        if self.from_segments:
            decoded["segments"] = self.from_segments
        calls = pl.concat([c for c, _ in self.frames], rechunk=len(self.frames) > 1)
        tools = pl.concat([t for _, t in self.frames], rechunk=len(self.frames) > 1)
        return ScanResult(
            calls,
            tools,
            self.damaged.frame(),
            states=self.states,
            unreadable=self.unreadable,
            bytes_parsed=self.parsed,
            decoded=decoded,
        )

    def _scan_one(self, task: FileTask, read: FileBytes) -> tuple[FileState, int]:
        content = read.content
        next_call_index, next_line = self._lines(task, content, read.consumed)
        state = FileState(
            name=task.name,
            rollout_id=task.rollout_id,
            size=task.start + len(content),
            mtime_ns=read.mtime_ns,
            inode=read.inode,
            consumed=read.consumed,
            next_call_index=next_call_index,
            next_line=next_line,
            head_hash=read.head,
            tail_hash=read.tail,
            scanned_ns=task.scan_ns,
            full_hash=read.full,
        )
        return state, len(content)

    def _lines(self, task: FileTask, content: bytes, consumed: int) -> tuple[int, int]:
        """Read every line of ``content`` (the file's bytes from ``task.start``); returns the
        next ``call_index`` and line number after the consumed part."""
        # The fast decoders skip text that is not UTF-8, which the reference decoder refuses:
        # the lines of a file holding such bytes are checked one by one.
        suspect = not content.isascii() and not _utf8(content)
        if not suspect and self.decoder.expect_facts:
            done = self._whole_lines(task, content, consumed - task.start)
            if done is not None:
                return done
        return self._each_line(task, content, consumed, suspect=suspect)

    def _whole_lines(self, task: FileTask, content: bytes, complete: int) -> tuple[int, int] | None:
        """The whole lines of a file our server wrote, each decoded by ``decode_fast`` and all
        added at once; ``None`` (nothing added) when one of them is blank or would not be read
        from its facts: then they are read one by one."""
        find = content.find
        ends = []
        end = find(b"\n")
        while 0 <= end < complete:
            ends.append(end)
            end = find(b"\n", end + 1)
        if not ends:
            return None
        starts = [0, *(end + 1 for end in ends[:-1])]
        view = memoryview(content)
        try:
            # The first line alone first: a file of another writer (no facts) is then given
            # to the line-by-line reader after one decode, not after all of its lines.
            first = decode_fast(view[: ends[0]])
            if not keep_for_facts(first):
                return None
            rest = zip(starts[1:], ends[1:], strict=True)
            lines = [first, *(decode_fast(view[start:end]) for start, end in rest)]
        except (msgspec.DecodeError, RecursionError):
            return None
        if not all(map(keep_for_facts, lines[1:])):
            return None
        base, index0, line0 = task.start, task.call_index, task.line
        self.fast.extend(
            lines,
            task.rollout_id,
            index0,
            line0,
            [base + start for start in starts],
            [end - start for start, end in zip(starts, ends, strict=True)],
            task.path,
        )
        self.decoder.counts["facts"] += len(lines)
        count = len(lines)
        tail = view[complete:]
        if tail and bytes(tail).strip(_BLANK):  # a torn line or one still being written
            self._read(task, tail, index0 + count, line0 + count, base + complete,
                       unterminated=True)  # fmt: skip
        return index0 + count, line0 + count

    def _each_line(
        self, task: FileTask, content: bytes, consumed: int, *, suspect: bool
    ) -> tuple[int, int]:
        """``_lines``, one line at a time."""
        view = memoryview(content)
        find = content.find
        base, index0, line0 = task.start, task.call_index, task.line
        pos = 0
        number = 0
        call_index = 0
        next_call_index = index0
        while True:
            number += 1
            end = find(b"\n", pos)
            unterminated = end < 0
            if unterminated:
                end = len(content)
            # A line is blank only if its first byte is: test that before copying it to strip it.
            if end > pos and (content[pos] not in _BLANK or content[pos:end].strip(_BLANK)):
                offset = base + pos
                index = index0 + call_index
                if offset < consumed:
                    next_call_index = index + 1
                line = view[pos:end]
                exact = suspect and not _utf8(line)
                self._read(task, line, index, line0 + number - 1, offset,
                           unterminated=unterminated, exact=exact)  # fmt: skip
                call_index += 1
            if unterminated:
                break
            pos = end + 1
        # The loop ran once per newline, and once more for what follows the last one.
        return max(next_call_index, index0), line0 + number - 1

    def _read(
        self,
        task: FileTask,
        line: memoryview,
        index: int,
        number: int,
        offset: int,
        *,
        unterminated: bool,
        exact: bool = False,
    ) -> None:
        """Read one non-blank line: from its facts into the columnar rows when it can be, else
        with ``LineDecoder`` (a row, a damaged line, or both)."""
        fast = _fast(line) if not exact and self.decoder.expect_facts else None
        if fast is not None:
            self.fast.add(fast, task.rollout_id, index, number, offset, len(line), task.path)
            self.decoder.counts["facts"] += 1
            return
        mismatch: FactsMismatch | None = None
        try:
            values = self.decoder.decode(line, exact=exact)
        except FactsMismatch as found:
            values, mismatch = found.values, found
        except orjson.JSONDecodeError as exc:
            reason = TORN_REASON if unterminated else f"not valid JSON: {exc}"
            self._damage(task, reason, index, number, offset)
        except NotAnObject as exc:
            self._damage(task, str(exc), index, number, offset)
        except InvalidRecordError as exc:
            self._damage(task, exc.reason, index, number, offset)
        else:
            self._add(task, values, call_index=index, line_number=number, offset=offset,
                      length=len(line))  # fmt: skip
        if mismatch is not None:
            self._add(task, mismatch.values, call_index=index, line_number=number,
                      offset=offset, length=len(line))  # fmt: skip
            self.damaged.add(
                AnalysisGap.FACTS_DIFFER,
                source="store",
                rollout_id=task.rollout_id,
                model_call_id=mismatch.values.model_call_id,
                call_index=index,
                detail="stored facts differ from the bodies in: " + ", ".join(mismatch.names),
                path=task.path,
                line_number=number,
                byte_offset=offset,
            )

    def _add(
        self,
        task: FileTask,
        values: CallValues,
        *,
        call_index: int,
        line_number: int,
        offset: int,
        length: int,
    ) -> None:
        self.calls.add_values(
            values,
            rollout_id=task.rollout_id,
            call_index=call_index,
            path=task.path,
            line_number=line_number,
            byte_offset=offset,
            line_bytes=length,
        )
        if values.tools:
            self.tools.add_values(values, rollout_id=task.rollout_id, call_index=call_index)

    def _damage(self, task: FileTask, reason: str, call_index: int, line: int, offset: int) -> None:
        self.damaged.add(
            AnalysisGap.DAMAGED_LINE,
            source="store",
            rollout_id=task.rollout_id,
            call_index=call_index,
            detail=reason,
            path=task.path,
            line_number=line,
            byte_offset=offset,
        )


def _fast(line: memoryview) -> FastLine | None:
    """The line for the columnar facts path, or ``None`` (then ``LineDecoder`` reads it)."""
    try:
        fast = decode_fast(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    return fast if keep_for_facts(fast) else None


def _utf8(data: bytes | memoryview) -> bool:
    try:
        str(data, "utf-8")
    except UnicodeDecodeError:
        return False
    return True
