"""Staging sinks and sources: the filesystem sink on disk and across processes, the test doubles."""

from __future__ import annotations

import doctest
import errno
import importlib
import multiprocessing
import os
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest

from capture_core.staging import (
    FilesystemStagingSink,
    InvalidAttachmentError,
    RawStagingSource,
    StagedCallRecord,
    StagedCallSnapshot,
    StagedRowDamagedError,
    StagedRowNotFoundError,
    StagingConflictError,
    StagingError,
    StagingSink,
    StagingSource,
    StagingWriteError,
    TextOnlyStagingSink,
    build_staged_call_record,
    check_attachments,
)
from capture_core.testing.staging import InMemoryStagingSink, LegacyStagingSink

CTX = multiprocessing.get_context("fork")
WAIT = 30.0  # failure timeout for the worker processes; generous for a busy machine
PIXELS = bytes(range(256)) * 3


def make_record(
    call: str = "c1", *, rollout: str = "r1", weight_version: int = 7, size: int = 3
) -> StagedCallRecord:
    return build_staged_call_record(
        rollout_id=rollout,
        model_call_id=call,
        prompt_token_ids=list(range(1, size + 1)),
        generated_token_ids=[40, 41],
        generated_logprobs=[-0.5, -1.5e-07],
        weight_version=weight_version,
        extras={"routed_experts": [[[1, 2]], [[3, -1]]]},
    )


@pytest.fixture(params=["memory", "filesystem"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "memory":
        return InMemoryStagingSink()
    return FilesystemStagingSink(tmp_path / "stage")


def stored_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


# --- both sinks ---------------------------------------------------------------------------


def test_sinks_satisfy_the_protocols(sink: Any) -> None:
    assert isinstance(sink, StagingSink)
    assert isinstance(sink, StagingSource)
    assert isinstance(sink, RawStagingSource)
    assert isinstance(LegacyStagingSink(), TextOnlyStagingSink)


def test_record_and_attachments_are_stored_together(sink: Any) -> None:
    record = make_record()
    grid = memoryview(bytearray(b"abcdef")).cast("B", shape=[2, 3])  # a 2-D view
    attachments = {"pixels": PIXELS, "sizes": bytearray(b"\x01\x02"), "grid": grid, "none": b""}
    result = sink.stage(record, attachments=attachments)
    assert result.ok and result.staging_key == "r1/c1"
    (snapshot,) = sink.fetch(["r1/c1"])
    assert isinstance(snapshot, StagedCallSnapshot)
    assert snapshot.model_dump() == record.model_dump()
    assert sink.fetch_raw(["r1/c1"]) == [record.model_dump_json().encode()]
    assert sink.fetch_attachments("r1/c1") == {
        "pixels": PIXELS, "sizes": b"\x01\x02", "grid": b"abcdef", "none": b"",
    }  # fmt: skip


def test_attachments_are_copied_when_staged(sink: Any) -> None:
    buffer = bytearray(b"before")
    sink.stage(make_record(), attachments={"pixels": buffer})
    buffer[:] = b"after!"
    assert sink.fetch_attachments("r1/c1") == {"pixels": b"before"}


def test_a_row_without_attachments_has_none(sink: Any) -> None:
    sink.stage(make_record())
    assert sink.fetch_attachments("r1/c1") == {}


def test_fetch_returns_one_snapshot_per_key_in_key_order(sink: Any) -> None:
    records = {f"r1/c{i}": make_record(f"c{i}", size=i + 1) for i in range(6)}
    for record in records.values():
        sink.stage(record)
    order = ["r1/c4", "r1/c0", "r1/c5", "r1/c2", "r1/c4"]
    snapshots = sink.fetch(order)
    assert [s.model_call_id for s in snapshots] == ["c4", "c0", "c5", "c2", "c4"]
    assert [s.model_dump() for s in snapshots] == [records[k].model_dump() for k in order]
    assert sink.fetch([]) == []


def test_a_missing_key_is_named(sink: Any) -> None:
    sink.stage(make_record())
    with pytest.raises(StagedRowNotFoundError) as caught:
        sink.fetch(["r1/c1", "r1/nope"])
    assert caught.value.staging_key == "r1/nope"
    assert "r1/nope" in str(caught.value)
    with pytest.raises(StagedRowNotFoundError):
        sink.fetch_attachments("r1/nope")


def test_identical_restage_is_a_no_op(sink: Any) -> None:
    record = make_record()
    first = sink.stage(record, attachments={"pixels": PIXELS})
    again = sink.stage(make_record(), attachments={"pixels": bytearray(PIXELS)})
    assert first == again
    assert sink.fetch_attachments("r1/c1") == {"pixels": PIXELS}


@pytest.mark.parametrize(
    ("second", "attachments"),
    [
        (make_record(weight_version=8), {"pixels": PIXELS}),  # another row, same key
        (make_record(), {"pixels": PIXELS[:-1]}),  # other attachment bytes
        (make_record(), None),  # the attachments dropped
        (make_record(), {"pixels": PIXELS, "more": b"x"}),  # one more attachment
    ],
)
def test_a_differing_restage_is_a_conflict(
    sink: Any, second: StagedCallRecord, attachments: dict[str, bytes] | None
) -> None:
    record = make_record()
    sink.stage(record, attachments={"pixels": PIXELS})
    with pytest.raises(StagingConflictError) as caught:
        sink.stage(second, attachments=attachments)
    assert caught.value.staging_key == "r1/c1"
    assert sink.fetch(["r1/c1"])[0].model_dump() == record.model_dump()
    assert sink.fetch_attachments("r1/c1") == {"pixels": PIXELS}


@pytest.mark.parametrize(
    "attachments",
    [
        [("pixels", b"x")],
        b"pixels",
        {1: b"x"},
        {"": b"x"},
        {"\ud800": b"x"},
        {"pixels": "text"},
        {"pixels": [1, 2]},
        {"ok": b"x", "pixels": 3},
    ],
)
def test_bad_attachments_are_refused_before_anything_is_written(
    sink: Any, attachments: Any, tmp_path: Path
) -> None:
    with pytest.raises(InvalidAttachmentError) as caught:
        sink.stage(make_record(), attachments=attachments)
    assert isinstance(caught.value, TypeError)
    with pytest.raises(StagedRowNotFoundError):
        sink.fetch(["r1/c1"])
    if isinstance(sink, FilesystemStagingSink):
        assert stored_files(sink.root) == []


def test_check_attachments_sorts_by_name_and_flattens_views() -> None:
    view = memoryview(b"\x01\x00\x02\x00").cast("H")
    assert check_attachments({"b": view, "a": b""}) == {"a": b"", "b": b"\x01\x00\x02\x00"}
    assert list(check_attachments({"b": b"", "a": b""})) == ["a", "b"]


def test_a_record_of_the_wrong_type_is_refused(sink: Any) -> None:
    with pytest.raises(TypeError, match="StagedCallRecord"):
        sink.stage(make_record().model_dump())


def test_fetch_needs_a_sequence_of_keys(tmp_path: Path) -> None:
    sink = FilesystemStagingSink(tmp_path)
    sink.stage(make_record())
    with pytest.raises(TypeError, match="single string"):
        sink.fetch("r1/c1")
    with pytest.raises(TypeError, match="str"):
        sink.fetch([b"r1/c1"])  # type: ignore[list-item]


def test_in_memory_overwrite_reaches_validation() -> None:
    sink = InMemoryStagingSink()
    record = make_record()
    sink.stage(record)
    tampered = record.model_dump_json().replace('"weight_version":7', '"weight_version":8')
    sink.overwrite_raw("r1/c1", tampered.encode())
    assert sink.fetch_raw(["r1/c1"]) == [tampered.encode()]
    with pytest.raises(StagedRowDamagedError, match="digest") as caught:
        sink.fetch(["r1/c1"])
    assert caught.value.staging_key == "r1/c1"


def test_doubles_count_stage_calls() -> None:
    sink, legacy = InMemoryStagingSink(), LegacyStagingSink()
    for double in (sink, legacy):
        double.stage(make_record())
        double.stage(make_record())
        with pytest.raises(StagingConflictError):
            double.stage(make_record(weight_version=9))
        assert double.stage_calls == 3
        assert double.keys() == ["r1/c1"]
    with pytest.raises(InvalidAttachmentError):
        sink.stage(make_record("c2"), attachments={"x": 1})  # type: ignore[dict-item]
    assert sink.stage_calls == 4
    with pytest.raises(TypeError, match="attachments"):
        legacy.stage(make_record("c2"), attachments={"x": b""})  # type: ignore[call-arg]
    assert legacy.stage_calls == 3


# --- the filesystem sink ------------------------------------------------------------------


def test_rows_are_files_named_by_the_hash_of_their_key(tmp_path: Path) -> None:
    sink = FilesystemStagingSink(tmp_path / "stage")
    hostile = make_record("../../x/..\x00/c", rollout="../../../etc/passwd")
    key = sink.stage(hostile, attachments={"../name": b"x"}).staging_key
    assert key == "../../../etc/passwd/../../x/..\x00/c"
    (path,) = stored_files(tmp_path)
    assert path == sink.path_for(key)
    assert path.parent.parent == sink.root
    assert len(path.stem) == 64 and path.name.endswith(".stage")
    assert path.parent.name == path.stem[:2]
    assert sink.fetch([key])[0].model_call_id == "../../x/..\x00/c"
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_the_file_layout_is_a_checksummed_header_then_record_then_attachments(
    tmp_path: Path,
) -> None:
    import hashlib
    import json

    sink = FilesystemStagingSink(tmp_path)
    record = make_record()
    sink.stage(record, attachments={"b": b"BB", "a": b"A"})
    data = sink.path_for("r1/c1").read_bytes()
    line, rest = data.split(b"\n", 1)
    magic, checksum, header_json = line.split(b" ", 2)
    assert magic == b"ngstage1"
    assert hashlib.sha256(header_json).hexdigest().encode() == checksum
    header = json.loads(header_json)
    record_json = record.model_dump_json().encode()
    assert header == {
        "staging_key": "r1/c1",
        "record": {"length": len(record_json), "sha256": hashlib.sha256(record_json).hexdigest()},
        "attachments": [
            {"name": "a", "length": 1, "sha256": hashlib.sha256(b"A").hexdigest()},
            {"name": "b", "length": 2, "sha256": hashlib.sha256(b"BB").hexdigest()},
        ],
    }
    assert rest == record_json + b"A" + b"BB"


def _flip_each_byte(path: Path, xor: int) -> Iterator[int]:
    original = path.read_bytes()
    try:
        for position in range(len(original)):
            damaged = bytearray(original)
            damaged[position] ^= xor
            path.write_bytes(bytes(damaged))
            yield position
    finally:
        path.write_bytes(original)


@pytest.mark.parametrize("xor", [0x01, 0x20, 0xFF])
def test_flipping_any_byte_of_a_row_is_detected(tmp_path: Path, xor: int) -> None:
    sink = FilesystemStagingSink(tmp_path)
    record = make_record()  # its JSON holds "-1.5e-7": flipping 0x20 turns e into E
    sink.stage(record)
    path = sink.path_for("r1/c1")
    assert b"-1.5e-7" in path.read_bytes()
    positions = 0
    for position in _flip_each_byte(path, xor):
        positions += 1
        for fetch in (sink.fetch, sink.fetch_raw):
            with pytest.raises(StagedRowDamagedError) as caught:
                fetch(["r1/c1"])
            assert caught.value.staging_key == "r1/c1", position
    assert positions > 700
    assert sink.fetch(["r1/c1"])[0].model_dump() == record.model_dump()  # restored


def test_flipping_any_byte_of_a_row_with_attachments_is_detected(tmp_path: Path) -> None:
    """The header guards both reads; the record and each attachment are checked when read."""
    sink = FilesystemStagingSink(tmp_path)
    sink.stage(make_record(), attachments={"a": b"\x00" * 40, "b": b"\xff" * 40})
    path = sink.path_for("r1/c1")
    data = path.read_bytes()
    record_start, attachments_start = data.index(b"\n") + 1, len(data) - 80
    for position in _flip_each_byte(path, 0x01):
        record_damaged = position < attachments_start
        attachments_damaged = position < record_start or position >= attachments_start
        for read, damaged in (
            (lambda: sink.fetch(["r1/c1"]), record_damaged),
            (lambda: sink.fetch_attachments("r1/c1"), attachments_damaged),
        ):
            if damaged:
                with pytest.raises(StagedRowDamagedError):
                    read()
            else:
                read()


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-1],  # truncated
        lambda data: data + b"\n",  # grown
        lambda data: b"",  # emptied
        lambda data: data.replace(b"\n", b" ", 1),  # header line never ends
    ],
)
def test_a_truncated_or_grown_file_is_detected(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    sink = FilesystemStagingSink(tmp_path)
    sink.stage(make_record())
    path = sink.path_for("r1/c1")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(StagedRowDamagedError):
        sink.fetch(["r1/c1"])


def test_a_row_moved_to_another_key_is_detected(tmp_path: Path) -> None:
    sink = FilesystemStagingSink(tmp_path)
    sink.stage(make_record("c1"))
    sink.stage(make_record("c2"))
    os.replace(sink.path_for("r1/c2"), sink.path_for("r1/c1"))
    with pytest.raises(StagedRowDamagedError, match="another key"):
        sink.fetch(["r1/c1"])


def test_a_symlink_at_a_row_path_is_not_followed(tmp_path: Path) -> None:
    sink = FilesystemStagingSink(tmp_path / "stage")
    sink.stage(make_record("c2"))
    target = sink.path_for("r1/c2")
    link = sink.path_for("r1/c1")
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target)
    with pytest.raises(StagedRowDamagedError):
        sink.fetch(["r1/c1"])
    with pytest.raises(StagingConflictError):  # the link is a taken key, never a write target
        sink.stage(make_record("c1"))
    assert sink.fetch(["r1/c2"])[0].model_call_id == "c2"


def test_a_directory_at_a_row_path_is_damage(tmp_path: Path) -> None:
    sink = FilesystemStagingSink(tmp_path)
    sink.path_for("r1/c1").mkdir(parents=True)
    with pytest.raises(StagedRowDamagedError, match="EISDIR"):
        sink.fetch(["r1/c1"])


def test_a_valid_frame_around_an_invalid_row_is_damage(tmp_path: Path) -> None:
    """A row whose checksums match but whose digest does not (written by a buggy sink)."""
    sink = FilesystemStagingSink(tmp_path)
    record = make_record()
    bogus = StagedCallRecord.model_construct(**{**dict(record), "weight_version": 8})
    sink.stage(bogus)
    assert b'"weight_version":8' in sink.fetch_raw(["r1/c1"])[0]
    with pytest.raises(StagedRowDamagedError, match="digest") as caught:
        sink.fetch(["r1/c1"])
    assert caught.value.__cause__ is not None


def test_fsync_discipline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    durable = FilesystemStagingSink(tmp_path / "durable")
    durable.stage(make_record("c1"))
    assert len(synced) == 3  # root (new row directory), the row file, the row directory
    durable.stage(make_record("c1"))  # identical: the directory is synced again
    assert len(synced) == 5  # the temp file, then the directory
    synced.clear()
    fast = FilesystemStagingSink(tmp_path / "fast", fsync=False)
    fast.stage(make_record("c1"))
    assert synced == []
    assert fast.fetch(["r1/c1"])[0].model_call_id == "c1"


def test_a_refused_write_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = FilesystemStagingSink(tmp_path)

    def no_links(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(StagingWriteError, match="EPERM") as caught:
        sink.stage(make_record())
    assert caught.value.staging_key == "r1/c1"
    assert caught.value.path == sink.path_for("r1/c1")
    assert stored_files(tmp_path) == []


def test_the_root_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StagingError, match="not a directory"):
        FilesystemStagingSink(tmp_path / "file")
    sink = FilesystemStagingSink(tmp_path / "a" / "b")
    assert sink.root == (tmp_path / "a" / "b").resolve() and sink.root.is_dir()
    assert repr(sink).startswith("FilesystemStagingSink(")


# --- several processes --------------------------------------------------------------------


def _stage_many(root: str, writer: int, start: Event, out: Connection) -> None:
    sink = FilesystemStagingSink(root)
    start.wait(WAIT)
    outcomes: dict[str, str] = {}
    for index in range(100):
        sink.stage(make_record(f"w{writer}-c{index}", size=1 + index % 7))
        if index % 5 == 0:  # 20 rows both writers stage identically
            sink.stage(make_record(f"shared-{index}"))
        if index % 10 == 0:  # 10 keys both writers stage with different content
            try:
                sink.stage(make_record(f"contested-{index}", weight_version=writer))
                outcomes[f"r1/contested-{index}"] = "won"
            except StagingConflictError:
                outcomes[f"r1/contested-{index}"] = "conflict"
    out.send(outcomes)
    out.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_two_processes_stage_into_one_root(tmp_path: Path) -> None:
    start = CTX.Event()
    pipes = [CTX.Pipe(duplex=False) for _ in range(2)]
    workers = [
        CTX.Process(target=_stage_many, args=(str(tmp_path), writer, start, pipes[writer][1]))
        for writer in range(2)
    ]
    try:
        for worker in workers:
            worker.start()
        for _, sender in pipes:
            sender.close()  # a worker that dies now reads as EOF here instead of a hang
        start.set()
        for receiver, _ in pipes:
            assert receiver.poll(WAIT), "a worker sent no outcomes"
        outcomes = [receiver.recv() for receiver, _ in pipes]
        for worker in workers:
            worker.join(WAIT)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join()
    assert [worker.exitcode for worker in workers] == [0, 0]

    sink = FilesystemStagingSink(tmp_path)
    own = [(w, i) for w in range(2) for i in range(100)]
    snapshots = sink.fetch([f"r1/w{w}-c{i}" for w, i in own])
    assert len(snapshots) == 200
    for (w, i), snapshot in zip(own, snapshots, strict=True):
        assert snapshot.model_dump() == make_record(f"w{w}-c{i}", size=1 + i % 7).model_dump()
    shared = sink.fetch([f"r1/shared-{i}" for i in range(0, 100, 5)])
    assert [s.digest for s in shared] == [make_record(s.model_call_id).digest for s in shared]
    for key in outcomes[0]:
        assert sorted([outcomes[0][key], outcomes[1][key]]) == ["conflict", "won"], key
        winner = 0 if outcomes[0][key] == "won" else 1
        assert sink.fetch([key])[0].weight_version == winner
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".stage"]
    assert leftovers == []
    assert len(stored_files(tmp_path)) == 200 + 20 + 10


# --- docstring examples -------------------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    [
        "capture_core.staging.sinks",
        "capture_core.staging.fs_sink",
        "capture_core.staging.capture",
        "capture_core.testing.staging",
        "capture_core.adapters.vllm",
    ],
)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
