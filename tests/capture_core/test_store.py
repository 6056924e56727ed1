"""CaptureStore: writing, tolerant and strict reading, clearing, markers, listing, failures."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture_core.exceptions import CaptureDirNotFoundError, CaptureStoreError, DamagedLineError
from capture_core.records import ModelRef, RawCaptureLine
from capture_core.store import CaptureStore

RID = "task-1_a.2"


def _line(**overrides: Any) -> dict[str, Any]:
    """A minimal valid raw capture line."""
    line: dict[str, Any] = {
        "model_call_id": uuid.uuid4().hex,
        "dialect": "chat",
        "started_at": 1.0,
        "completed_at": 2.0,
        "latency_ms": 1000.0,
        "latency_ttft_ms": None,
        "status_code": 200,
        "error_category": None,
        "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        "response": {"model": "m", "choices": [], "usage": {"prompt_tokens": 3}},
    }
    line.update(overrides)
    return line


def _jl(obj: object) -> bytes:
    return orjson.dumps(obj)


@pytest.fixture
def store(tmp_path: Path) -> CaptureStore:
    return CaptureStore(tmp_path / "captures", create=True)


# --- construction and paths ---------------------------------------------------------------


def test_root_is_made_absolute_and_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    made = CaptureStore(Path("a") / "b", create=True)
    assert made.root.is_absolute()
    assert made.root == tmp_path / "a" / "b"
    assert made.root.is_dir()


def test_a_reader_never_creates_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for opened in (lambda: CaptureStore("results/missing"),
                   lambda: CaptureStore(Path("results") / "missing", create=False)):  # fmt: skip
        with pytest.raises(CaptureDirNotFoundError) as info:
            opened()
        assert info.value.path == tmp_path / "results" / "missing"  # resolved, as printed
        assert str(tmp_path / "results" / "missing") in str(info.value)
        assert "does not exist" in str(info.value)
        assert isinstance(info.value, FileNotFoundError)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_root_reads_as_empty(tmp_path: Path) -> None:
    made = CaptureStore(tmp_path)
    assert made.rollout_ids() == []
    assert made.read(RID).file_exists is False
    assert os.listdir(tmp_path) == []


def test_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_bytes(b"not a directory")
    with pytest.raises(CaptureStoreError) as info:
        CaptureStore(afile)
    assert info.value.path == afile
    assert str(afile) in str(info.value)
    with pytest.raises(CaptureStoreError) as info:
        CaptureStore(afile / "sub")
    assert str(afile / "sub") in str(info.value)
    assert afile.read_bytes() == b"not a directory"


def test_file_names(store: CaptureStore) -> None:
    assert store.path_for(RID) == store.root / "task-1_a.2.capture.jsonl"
    assert store.marker_path(RID) == store.root / "task-1_a.2.capture.incomplete"
    store.record(RID, _line())
    store.mark_incomplete(RID)
    assert sorted(os.listdir(store.root)) == [
        "task-1_a.2.capture.incomplete",
        "task-1_a.2.capture.jsonl",
    ]


# --- round trips --------------------------------------------------------------------------


def test_round_trip_raw_capture_line(store: CaptureStore) -> None:
    raw = RawCaptureLine.model_validate(
        _line(
            model_ref=ModelRef(name="policy"),
            request={"messages": [{"role": "user", "content": "héllo 日本 🎉 \u2028 \n end"}]},
        )
    )
    written = store.record(RID, raw)
    content = store.path_for(RID).read_bytes()
    assert written == len(content)
    assert content.count(b"\n") == 1
    assert content.endswith(b"\n")
    assert "日本 🎉".encode() in content  # unicode is stored as UTF-8, not escaped
    read = store.read(RID)
    assert read.file_exists
    assert read.damaged == []
    assert [entry.data for entry in read.entries] == [raw.to_json_dict()]
    records = store.read_records(RID)
    assert [r.model_call_id for r in records.records] == [raw.model_call_id]
    assert records.records[0].request == raw.request
    assert records.records[0].model_ref == ModelRef(name="policy")


def test_round_trip_mapping_with_path_value(store: CaptureStore, tmp_path: Path) -> None:
    where = tmp_path / "ünïcode dir" / "file.txt"
    first = _line(request={"file": where, "text": "naïve ✓"})
    second = _line(status_code=429, error_category="rate_limit")
    sizes = [store.record(RID, first), store.record(RID, second)]
    assert sum(sizes) == store.path_for(RID).stat().st_size
    read = store.read(RID)
    assert [e.call_index for e in read.entries] == [0, 1]
    assert read.entries[0].data["request"] == {"file": str(where), "text": "naïve ✓"}
    assert read.entries[1].data["status_code"] == 429
    assert read.entries[1].byte_offset == sizes[0]
    assert read.entries[1].length == sizes[1] - 1
    assert read.entries[1].line_number == 2


def test_non_dict_mapping_is_written_as_an_object(store: CaptureStore) -> None:
    from types import MappingProxyType

    line = _line()
    store.record(RID, MappingProxyType(line))
    assert store.read(RID).entries[0].data == line


def test_missing_file_reads_empty(store: CaptureStore) -> None:
    read = store.read(RID, strict=True)
    assert (read.entries, read.damaged, read.file_exists) == ([], [], False)
    assert read.path == store.path_for(RID)
    records = store.read_records(RID, strict=True)
    assert (records.records, records.damaged) == ([], [])
    assert (records.file_exists, records.incomplete) == (False, False)
    assert not store.exists(RID)
    assert not store.path_for(RID).exists()


# --- tolerant and strict reading ----------------------------------------------------------


def test_blank_lines_are_skipped_without_taking_an_index(store: CaptureStore) -> None:
    a, b = _line(), _line()
    body = b"\n" + _jl(a) + b"\n \n\t\r\n\n" + _jl(b) + b"\n\n"
    store.path_for(RID).write_bytes(body)
    read = store.read(RID, strict=True)
    assert read.damaged == []
    assert [(e.call_index, e.line_number) for e in read.entries] == [(0, 2), (1, 6)]
    assert [e.data["model_call_id"] for e in read.entries] == [
        a["model_call_id"],
        b["model_call_id"],
    ]
    assert read.entries[1].byte_offset == body.index(_jl(b))


def test_damaged_line_keeps_its_index(store: CaptureStore) -> None:
    a, b = _jl(_line()), _jl(_line())
    store.path_for(RID).write_bytes(a + b"\n{not-json\n" + b + b"\n")
    read = store.read(RID)
    assert [e.call_index for e in read.entries] == [0, 2]
    assert [e.line_number for e in read.entries] == [1, 3]
    assert len(read.damaged) == 1
    bad = read.damaged[0]
    assert (bad.line_number, bad.call_index) == (2, 1)
    assert bad.byte_offset == len(a) + 1
    assert bad.length == len(b"{not-json")
    assert bad.path == str(store.path_for(RID))
    assert "JSON" in bad.reason
    records = store.read_records(RID)
    assert [r.call_index for r in records.records] == [0, 2]
    assert [d.call_index for d in records.damaged] == [1]


@pytest.mark.parametrize(
    ("value", "kind"),
    [([1, 2], "array"), ("text", "string"), (42, "number"), (None, "null"), (True, "boolean")],
)
def test_non_object_json_line_is_damaged(store: CaptureStore, value: object, kind: str) -> None:
    store.path_for(RID).write_bytes(_jl(_line()) + b"\n" + _jl(value) + b"\n")
    read = store.read(RID)
    assert [e.call_index for e in read.entries] == [0]
    assert [(d.line_number, d.call_index) for d in read.damaged] == [(2, 1)]
    assert kind in read.damaged[0].reason
    assert "object" in read.damaged[0].reason


@pytest.mark.parametrize(
    "garbage",
    [b"\x00\x00\x00", b'{"a": "\xff\xfe"}', b"\xef\xbb\xbf{}", b"{} {}", b"[" * 5000, b"\x0c"],
)
def test_corrupt_bytes_are_damaged_not_raised(store: CaptureStore, garbage: bytes) -> None:
    good = _jl(_line())
    store.path_for(RID).write_bytes(good + b"\n" + garbage + b"\n" + good + b"\n")
    read = store.read(RID)
    assert [e.call_index for e in read.entries] == [0, 2]
    assert [(d.line_number, d.length) for d in read.damaged] == [(2, len(garbage))]


def test_strict_read_raises_on_first_damaged_line(store: CaptureStore) -> None:
    path = store.path_for(RID)
    path.write_bytes(_jl(_line()) + b"\n\n{not-json\n[1]\n")
    with pytest.raises(DamagedLineError) as info:
        store.read(RID, strict=True)
    err = info.value
    assert (err.path, err.line_number, err.call_index) == (path, 3, 1)
    assert str(path) in str(err)
    assert "line 3" in str(err)
    assert "call_index 1" in str(err)
    with pytest.raises(DamagedLineError):
        store.read_records(RID, strict=True)


def test_complete_final_line_without_newline_is_valid(store: CaptureStore) -> None:
    line = _line()
    store.path_for(RID).write_bytes(_jl(_line()) + b"\n" + _jl(line))
    read = store.read(RID, strict=True)
    assert [e.data["model_call_id"] for e in read.entries][-1] == line["model_call_id"]
    assert read.damaged == []


def test_torn_final_line_is_damaged_and_closed_by_next_record(store: CaptureStore) -> None:
    path = store.path_for(RID)
    first = _jl(_line())
    torn = _jl(_line())[:37]
    path.write_bytes(first + b"\n" + torn)
    read = store.read(RID)
    assert [e.call_index for e in read.entries] == [0]
    assert [(d.line_number, d.call_index, d.byte_offset) for d in read.damaged] == [
        (2, 1, len(first) + 1)
    ]
    assert "torn" in read.damaged[0].reason
    with pytest.raises(DamagedLineError) as info:
        store.read(RID, strict=True)
    assert (info.value.line_number, info.value.call_index) == (2, 1)

    after = _line()
    written = store.record(RID, after)
    assert written == len(_jl(after)) + 2  # the closing newline + the line and its newline
    content = path.read_bytes()
    assert content == first + b"\n" + torn + b"\n" + _jl(after) + b"\n"
    read = store.read(RID)
    assert [e.call_index for e in read.entries] == [0, 2]
    assert read.entries[1].data == after
    assert [(d.line_number, d.call_index) for d in read.damaged] == [(2, 1)]
    assert "torn" not in read.damaged[0].reason  # no longer the last line
    # a further record needs no closing newline
    last = _line()
    assert store.record(RID, last) == len(_jl(last)) + 1


def test_read_records_counts_wrong_typed_known_fields_as_damaged(store: CaptureStore) -> None:
    good = _line()
    rows = [good, _line(status_code="abc"), _line(model_ref=5), _line(dialect="chat")]
    store.path_for(RID).write_bytes(b"".join(_jl(row) + b"\n" for row in rows) + b"{torn")
    raw = store.read(RID)
    assert [e.call_index for e in raw.entries] == [0, 1, 2, 3]
    records = store.read_records(RID)
    assert records.rollout_id == RID
    assert records.file_exists
    assert [r.call_index for r in records.records] == [0, 3]
    assert records.records[0].model_call_id == good["model_call_id"]
    assert records.records[0].tokens_in == 3
    damaged = {d.call_index: d for d in records.damaged}
    assert sorted(damaged) == [1, 2, 4]
    assert [d.call_index for d in records.damaged] == [1, 2, 4]  # file order
    assert "status_code" in damaged[1].reason
    assert "model_ref" in damaged[2].reason
    assert damaged[2].line_number == 3
    assert damaged[2].byte_offset == raw.entries[2].byte_offset
    assert "torn" in damaged[4].reason
    with pytest.raises(DamagedLineError) as info:
        store.read_records(RID, strict=True)
    assert (info.value.line_number, info.value.call_index) == (2, 1)
    assert "status_code" in info.value.reason


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    content=st.binary(max_size=400)
    | st.lists(
        st.sampled_from([b"{", b"}", b"\n", b" ", b'"', b"[]", b"{}", b"\xff", b":", b"1"])
    ).map(b"".join)
)
def test_arbitrary_bytes_never_raise_in_tolerant_mode(store: CaptureStore, content: bytes) -> None:
    store.path_for(RID).write_bytes(content)
    read = store.read(RID)
    records = store.read_records(RID)
    lines = content.split(b"\n")
    non_blank = [line for line in lines if line.strip(b" \t\r")]
    indexes = sorted([e.call_index for e in read.entries] + [d.call_index for d in read.damaged])
    assert indexes == list(range(len(non_blank)))
    for entry in read.entries:
        chunk = content[entry.byte_offset : entry.byte_offset + entry.length]
        assert orjson.loads(chunk) == entry.data
    for bad in read.damaged:
        assert content[bad.byte_offset : bad.byte_offset + bad.length] == lines[bad.line_number - 1]
    assert len(records.records) + len(records.damaged) == len(non_blank)


_JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
_BODY_KEYS = st.sampled_from(
    ["usage", "choices", "output", "content", "model", "id", "status", "error", "type", "delta"]
)
_JSON = st.recursive(
    _JSON_LEAF,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6) | _BODY_KEYS, inner, max_size=4)
    ),
    max_leaves=15,
)
_KNOWN = ["model_ref", "started_at", "completed_at", "latency_ms", "latency_ttft_ms"]
_KNOWN += ["status_code", "error_category", "request", "response", "request_raw", "response_raw"]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    row=st.fixed_dictionaries(
        {
            "model_call_id": st.just("c" * 32) | _JSON,
            "dialect": st.sampled_from(["chat", "responses", "messages", "x"]) | _JSON,
        },
        optional=dict.fromkeys(_KNOWN, _JSON),
    )
)
def test_any_json_object_is_a_record_or_damaged(store: CaptureStore, row: dict[str, Any]) -> None:
    store.path_for(RID).write_bytes(_jl(row) + b"\n" + _jl(_line()) + b"\n")
    records = store.read_records(RID)
    assert [r.call_index for r in records.records][-1] == 1
    assert len(records.records) + len(records.damaged) == 2
    assert all(d.call_index == 0 and d.reason for d in records.damaged)


# --- serialization failures ---------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        _line(request={"nested": {1: 2}}),
        _line(response={"usage": {"prompt_tokens": 2**64}}),
        _line(response={"big": -(2**70)}),
    ],
)
def test_serialization_failure_writes_nothing(store: CaptureStore, bad: dict[str, Any]) -> None:
    path = store.path_for(RID)
    with pytest.raises(CaptureStoreError) as info:
        store.record(RID, bad)
    assert info.value.path == path
    assert str(path) in str(info.value)
    assert not path.exists()
    store.record(RID, _line())
    before = path.read_bytes()
    with pytest.raises(CaptureStoreError):
        store.record(RID, bad)
    assert path.read_bytes() == before


def test_non_mapping_line_is_refused(store: CaptureStore) -> None:
    with pytest.raises(CaptureStoreError):
        store.record(RID, [1, 2, 3])  # type: ignore[arg-type]
    assert not store.path_for(RID).exists()


# --- clear, markers, listing --------------------------------------------------------------


def test_clear_removes_file_and_marker(store: CaptureStore) -> None:
    assert store.clear(RID) is False
    store.record(RID, _line())
    store.mark_incomplete(RID)
    assert store.clear(RID) is True
    assert not store.path_for(RID).exists()
    assert not store.marker_path(RID).exists()
    assert not store.exists(RID)
    assert store.clear(RID) is False

    store.record(RID, _line())
    assert store.clear(RID) is True
    assert not store.path_for(RID).exists()

    store.mark_incomplete(RID)
    assert store.clear(RID) is True
    assert not store.marker_path(RID).exists()
    assert os.listdir(store.root) == []


def test_clear_only_touches_its_rollout(store: CaptureStore) -> None:
    store.record("keep", _line())
    store.mark_incomplete("keep")
    store.record(RID, _line())
    assert store.clear(RID)
    assert store.rollout_ids() == ["keep"]
    assert len(store.read("keep").entries) == 1
    assert store.is_incomplete("keep")


def test_marker_on_and_off(store: CaptureStore) -> None:
    assert not store.is_incomplete(RID)
    store.mark_incomplete(RID)
    store.mark_incomplete(RID)  # idempotent
    assert store.is_incomplete(RID)
    assert store.marker_path(RID).read_bytes() == b""
    assert store.exists(RID)
    assert not store.path_for(RID).exists()
    records = store.read_records(RID)
    assert (records.incomplete, records.file_exists, records.records) == (True, False, [])
    store.record(RID, _line())
    assert store.read_records(RID).incomplete
    assert store.clear(RID)
    assert not store.is_incomplete(RID)
    assert not store.exists(RID)


def test_rollout_ids_lists_valid_ids_and_ignores_foreign_files(store: CaptureStore) -> None:
    store.record("b-2", _line())
    store.mark_incomplete("a-1")
    store.record("c-3", _line())
    store.mark_incomplete("c-3")
    for name in [
        "notes.txt",
        ".hidden.capture.jsonl",
        "a..b.capture.jsonl",
        "-x.capture.incomplete",
        ".capture.jsonl",
        "d-4.capture.jsonl.bak",
        "e-5.lineage.jsonl",
        "sp ace.capture.jsonl",
        "ünï.capture.jsonl",
    ]:
        (store.root / name).write_bytes(b"{}\n")
    fd = os.open(os.fsencode(store.root) + b"/\xff\xfe.capture.jsonl", os.O_CREAT | os.O_WRONLY)
    os.close(fd)
    assert store.rollout_ids() == ["a-1", "b-2", "c-3"]


def test_rollout_ids_of_missing_root_is_empty(tmp_path: Path) -> None:
    made = CaptureStore(tmp_path / "captures", create=True)
    made.root.rmdir()
    assert made.rollout_ids() == []


# --- durability and disk failures ---------------------------------------------------------


def _spy_fsync(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the kind of every fsync'd descriptor: 'dir' or 'file'."""
    calls: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        calls.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return calls


def test_directory_is_fsynced_when_a_file_is_created(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy_fsync(monkeypatch)
    store.record(RID, _line())
    assert calls == ["file", "dir"]
    calls.clear()
    store.record(RID, _line())
    assert calls == ["file"]
    calls.clear()
    store.mark_incomplete(RID)
    assert calls == ["file", "dir"]
    calls.clear()
    store.clear(RID)
    assert calls == ["dir"]


def test_fsync_failure_raises_and_leaves_the_file_readable(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store.path_for(RID)
    kept = _line()
    store.record(RID, kept)
    before = path.read_bytes()

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", no_space)
        with pytest.raises(CaptureStoreError) as info:
            store.record(RID, _line())
    assert info.value.path == path
    assert str(path) in str(info.value)
    assert "ENOSPC" in str(info.value)
    assert path.read_bytes() == before  # the unsynced line was cut back
    assert store.read(RID, strict=True).entries[0].data == kept
    store.record(RID, _line())
    assert [e.call_index for e in store.read(RID, strict=True).entries] == [0, 1]


def test_short_write_then_failure_leaves_no_half_line(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store.path_for(RID)
    store.record(RID, _line())
    before = path.read_bytes()
    real_write = os.write
    calls = 0

    def half_then_enospc(fd: int, data: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", half_then_enospc)
        with pytest.raises(CaptureStoreError, match="ENOSPC"):
            store.record(RID, _line(request={"pad": "x" * 5000}))
    assert calls == 2
    assert path.read_bytes() == before
    assert store.read(RID, strict=True).damaged == []


def test_short_writes_are_completed(store: CaptureStore, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def trickle(fd: int, data: Any) -> int:
        return real_write(fd, bytes(data[:7]))

    line = _line(request={"pad": "y" * 100})
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", trickle)
        store.record(RID, line)
    assert store.read(RID, strict=True).entries[0].data == line


def test_disk_errors_become_capture_store_errors(tmp_path: Path) -> None:
    made = CaptureStore(tmp_path / "captures", create=True)
    made.root.rmdir()
    (tmp_path / "captures").write_bytes(b"now a file")
    with pytest.raises(CaptureStoreError) as info:
        made.record(RID, _line())
    assert info.value.path == made.path_for(RID)
    assert "ENOTDIR" in str(info.value)
    with pytest.raises(CaptureStoreError) as info:
        made.mark_incomplete(RID)
    assert info.value.path == made.marker_path(RID)
    assert "ENOTDIR" in str(info.value)
    with pytest.raises(CaptureStoreError):
        made.read(RID)
    with pytest.raises(CaptureStoreError):
        made.rollout_ids()
    assert (tmp_path / "captures").read_bytes() == b"now a file"


def test_directory_in_place_of_data_file(store: CaptureStore) -> None:
    store.path_for(RID).mkdir()
    with pytest.raises(CaptureStoreError, match="EISDIR"):
        store.record(RID, _line())


# --- clear racing a writer (in one process, ordered by hand) ------------------------------


def test_writer_that_opened_before_clear_writes_to_the_new_file(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that opened the file, then waited for the lock while ``clear`` unlinked it,
    must reopen and write to a new file instead of the removed inode."""
    store.record(RID, _line())
    writer_opened = threading.Event()
    cleared = threading.Event()
    real_flock = fcntl.flock
    main = threading.current_thread()

    def gated_flock(fd: int, op: int) -> None:
        gate = threading.current_thread() is not main and op == fcntl.LOCK_EX
        if gate and not writer_opened.is_set():
            writer_opened.set()
            assert cleared.wait(10)
        real_flock(fd, op)

    late = _line()
    errors: list[BaseException] = []

    def write_late() -> None:
        try:
            store.record(RID, late)
        except BaseException as exc:
            errors.append(exc)

    monkeypatch.setattr(fcntl, "flock", gated_flock)
    thread = threading.Thread(target=write_late)
    thread.start()
    assert writer_opened.wait(10)
    assert store.clear(RID) is True
    cleared.set()
    thread.join(10)
    assert not thread.is_alive()
    assert errors == []
    read = store.read(RID, strict=True)
    assert [e.data for e in read.entries] == [late]


def test_clear_failure_names_the_file(store: CaptureStore) -> None:
    store.marker_path(RID).mkdir()  # a directory where the marker should be
    (store.marker_path(RID) / "keep").write_bytes(b"")
    store.record(RID, _line())
    with pytest.raises(CaptureStoreError) as info:
        store.clear(RID)
    assert info.value.path == store.marker_path(RID)
    assert "EISDIR" in str(info.value) or "EPERM" in str(info.value)
    assert not store.path_for(RID).exists()  # the data file was still removed


def test_a_new_capture_files_name_is_durable_before_its_lock_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Else another writer could lock the new file, append and report its line durable first."""
    import fcntl

    from capture_core import _appending

    seen: list[bool] = []
    real = _appending.fsync_dir

    def fsync_dir(directory: str) -> None:
        fd = os.open(tmp_path / "n.capture.jsonl", os.O_RDONLY)
        try:  # another open file description: flock conflicts while the append holds it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(False)
        except BlockingIOError:
            seen.append(True)
        finally:
            os.close(fd)
        real(directory)

    monkeypatch.setattr(_appending, "fsync_dir", fsync_dir)
    store = CaptureStore(tmp_path)
    store.record("n", {"model_call_id": "a", "dialect": "chat"})
    store.record("n", {"model_call_id": "b", "dialect": "chat"})
    assert seen == [True]  # synced once, while locked; not again for a file with lines
