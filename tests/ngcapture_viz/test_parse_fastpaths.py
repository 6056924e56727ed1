"""The shortcuts of the cold parse give exactly what the plain way gives.

``parse_capture`` parses slices of the file instead of split copies, the scan counts newlines
after the last non-blank line only and hashes the bytes it already read, and ``CallColumns``
keeps rows as tuples. Each is checked here against the plain computation, on the shapes where
a shortcut could slip: blank and whitespace lines, torn tails, small and large files, and
scans that start in the middle of a file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest

from capture_core import DamagedLine, RawEntry, parse_capture
from capture_core.normalize import record_fields
from capture_core.testing import CaptureLineFactory
from ngcapture_viz.frames.calls import CALLS, CallColumns
from ngcapture_viz.load._scan import FileTask, fingerprint, scan_files

_LINE = CaptureLineFactory(seed=3).line("chat").to_jsonl().rstrip(b"\n")
_BIG = CaptureLineFactory(seed=4).line("responses").to_jsonl().rstrip(b"\n")


def _padded(size: int) -> bytes:
    """One capture line of exactly ``size`` bytes, newline included."""
    head = b'{"model_call_id":"pad","dialect":"chat","pad":"'
    return head + b"x" * (size - len(head) - 3) + b'"}\n'


#: File contents where the blank-line test, the line count or the hash ranges could slip.
SHAPES: dict[str, bytes] = {
    "empty": b"",
    "newlines only": b"\n\n\n",
    "json whitespace only": b" \t\r\n\r\n  \t",
    "one line": _LINE + b"\n",
    "crlf lines": _LINE + b"\r\n" + _LINE + b"\r\n",
    "leading whitespace": b" " + _LINE + b"\n\t" + _LINE + b"\n\r" + _LINE + b"\n",
    "trailing blank lines": _LINE + b"\n\n \n\t\r\n",
    "blank lines first": b"\n \n" + _LINE + b"\n",
    "torn tail": _LINE + b"\n" + _LINE[:40],
    "torn blank tail": _LINE + b"\n  ",
    "no newline at all": _LINE,
    "damaged lines": b"[1]\n{oops\n" + _LINE + b"\nnull\n\xff\xfe\n",
    "form feed is not blank": b"\x0c\n" + _LINE + b"\n",
    "just over the hash probe": _padded(4100),
    "exactly the hash probe": _padded(4096),
    "large": b"\n".join([_BIG] * 6 + [b"", b"{bad", _LINE]) + b"\n\n",
}


def _plain_parse(content: bytes) -> list[tuple[int, int, int, int, object]]:
    """What ``parse_capture`` must find: the file split on newlines, blank lines skipped."""
    found: list[tuple[int, int, int, int, object]] = []
    lines = content.split(b"\n")
    offset = call_index = 0
    for number, line in enumerate(lines, start=1):
        start, offset = offset, offset + len(line) + 1
        if not line.strip(b" \t\r"):
            continue
        try:
            value: object = orjson.loads(line)
        except orjson.JSONDecodeError:
            value = None
        found.append((call_index, number, start, len(line), value))
        call_index += 1
    return found


def _found(entries: list[RawEntry], damaged: list[DamagedLine]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = [
        (e.call_index, e.line_number, e.byte_offset, e.length, e.data) for e in entries
    ]
    rows += [(d.call_index, d.line_number, d.byte_offset, d.length, None) for d in damaged]
    return sorted(rows, key=lambda row: str(row[0]).zfill(9))


@pytest.mark.parametrize("name", SHAPES)
def test_parse_capture_finds_what_a_plain_split_finds(name: str) -> None:
    content = SHAPES[name]
    entries, damaged = parse_capture(content, Path("x.capture.jsonl"))
    expected = [
        row if isinstance(row[4], dict) else (*row[:4], None) for row in _plain_parse(content)
    ]
    assert _found(entries, damaged) == expected


def test_a_torn_tail_is_told_apart_from_a_bad_line() -> None:
    _, damaged = parse_capture(SHAPES["torn tail"], Path("x.capture.jsonl"))
    assert [d.reason for d in damaged] == ["torn line at end of file (no newline)"]
    _, damaged = parse_capture(b"{oops\n", Path("x.capture.jsonl"))
    assert damaged[0].reason.startswith("not valid JSON: ")


def _write_all(root: Path) -> dict[str, Path]:
    paths = {}
    for number, (name, content) in enumerate(SHAPES.items()):
        path = root / f"{number}-0.capture.jsonl"
        path.write_bytes(content)
        paths[name] = path
    return paths


def _line_start_near_middle(content: bytes) -> int:
    newline = content.find(b"\n", len(content) // 2)
    return 0 if newline < 0 else newline + 1


@pytest.mark.parametrize("racy", [False, True])
@pytest.mark.parametrize("from_middle", [False, True])
def test_file_states_equal_the_plain_counts_and_hashes(
    tmp_path: Path, racy: bool, from_middle: bool
) -> None:
    paths = _write_all(tmp_path)
    # A scan right after the writes is racy; one far in the future is not.
    scan_ns = time.time_ns() if racy else 2**62
    tasks = []
    for path in paths.values():
        content = path.read_bytes()
        start = _line_start_near_middle(content) if from_middle else 0
        line = content.count(b"\n", 0, start) + 1
        tasks.append(FileTask(str(path), path.name, path.name[:-15], start, 5, line, scan_ns))
    result = scan_files(tasks)
    assert len(result.states) == len(SHAPES)
    assert {4096, 4100} <= {state.consumed for state in result.states}
    for task, state in zip(tasks, result.states, strict=True):
        content = Path(task.path).read_bytes()
        consumed = content.rfind(b"\n") + 1 if b"\n" in content[task.start :] else task.start
        assert state.consumed == consumed, task.name
        assert state.next_line == content.count(b"\n") + 1, task.name
        fd = os.open(task.path, os.O_RDONLY)
        try:
            assert state.head_hash == fingerprint(fd, 0, min(4096, consumed)), task.name
            assert state.tail_hash == fingerprint(fd, max(0, consumed - 4096), consumed)
            assert state.full_hash == (fingerprint(fd, 0, consumed) if racy else None)
        finally:
            os.close(fd)


def test_call_rows_fill_every_column_of_the_calls_frame() -> None:
    assert sorted(CallColumns.ROW) == sorted(set(CALLS.names) - {"run", "tool_names"})
    assert len(set(CallColumns.ROW)) == len(CallColumns.ROW)


def test_call_rows_land_in_their_own_columns() -> None:
    lines = list(CaptureLineFactory(seed=8).lines(40))
    acc = CallColumns()
    for number, line in enumerate(lines):
        acc.add(
            record_fields(line, number),
            rollout_id=f"r{number}",
            source="store",
            path=f"p{number}",
            line_number=number + 1,
            byte_offset=number * 10,
            line_bytes=number * 3,
        )
    frame = acc.frame("run")
    assert frame.columns == CALLS.names
    assert frame["rollout_id"].to_list() == [f"r{n}" for n in range(40)]
    assert frame["path"].to_list() == [f"p{n}" for n in range(40)]
    assert frame["line_number"].to_list() == list(range(1, 41))
    assert frame["byte_offset"].to_list() == [n * 10 for n in range(40)]
    assert frame["line_bytes"].to_list() == [n * 3 for n in range(40)]
    assert frame["model_call_id"].to_list() == [ln.model_call_id for ln in lines]
    assert frame["call_index"].to_list() == list(range(40))
    assert frame["status_code"].to_list() == [ln.status_code for ln in lines]
    assert frame["latency_total_ms"].to_list() == [ln.latency_ms for ln in lines]
    assert CallColumns().frame("run").schema == frame.schema
