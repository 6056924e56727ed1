"""Every CaptureStore method refuses hostile rollout ids before it touches the disk."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capture_core.exceptions import InvalidRolloutIdError
from capture_core.store import CaptureStore

HOSTILE_IDS: list[object] = [
    "",
    ".",
    "..",
    "...",
    ".hidden",
    "../a",
    "a/../b",
    "a/b",
    "a/",
    "/abs",
    "a\\b",
    "a\x00b",
    "a\nb",
    "a\rb",
    "a b",
    " a",
    "a\tb",
    "a\x0bb",
    "a\x7f",
    "röllout",
    "日本",
    "ａｂｃ",  # fullwidth letters
    "a" * 201,
    "a" * 10_000,
    "-lead",
    "_lead",
    "%2e%2e",
    "%2e%2e%2fetc",
    "a%2fb",
    "a..b",
    "x..",
    "CON?",
    "a:b",
    "a*b",
    "~user",
    "$HOME",
    "a;rm",
    "a|b",
    "\u202eabc",
    "a\u200bb",
    "a\ud800b",  # lone surrogate
    None,
    7,
    b"abc",
    ["a"],
]

LINE: dict[str, Any] = {"model_call_id": "0" * 32, "dialect": "chat"}


def _calls(store: CaptureStore) -> dict[str, Callable[[Any], object]]:
    return {
        "path_for": store.path_for,
        "marker_path": store.marker_path,
        "record": lambda rid: store.record(rid, LINE),
        "read": store.read,
        "read_strict": lambda rid: store.read(rid, strict=True),
        "read_records": store.read_records,
        "read_records_strict": lambda rid: store.read_records(rid, strict=True),
        "clear": store.clear,
        "mark_incomplete": store.mark_incomplete,
        "is_incomplete": store.is_incomplete,
        "exists": store.exists,
    }


def _tree(top: Path) -> set[str]:
    """Every directory and file below ``top``, with file sizes."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames:
            found.add(os.path.join(dirpath, name) + "/")
        for name in filenames:
            full = os.path.join(dirpath, name)
            found.add(f"{full} {os.path.getsize(full)}")
    return found


def _expected_quote(value: object) -> str:
    if isinstance(value, str):
        return ascii(value[:80])
    return ascii(value)


def _disk_tripwire(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any file-system call fail loudly, to prove validation comes first."""

    def boom(*args: object, **kwargs: object) -> Any:
        raise AssertionError(f"touched the disk before validating: {args!r}")

    for name in ("open", "stat", "lstat", "mkdir", "makedirs", "unlink", "listdir", "scandir"):
        monkeypatch.setattr(os, name, boom)
    monkeypatch.setattr(fcntl, "flock", boom)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[CaptureStore, CaptureStore]:
    """A store root nested inside tmp_path, and a store whose root does not exist yet."""
    (tmp_path / "outer").mkdir()
    (tmp_path / "outer" / "sibling.txt").write_bytes(b"untouched")
    present = CaptureStore(tmp_path / "outer" / "captures", create=True)
    present.record("existing-1", LINE)
    absent = CaptureStore(tmp_path / "outer" / "not-yet", create=True)
    absent.root.rmdir()  # a store whose directory went away
    return present, absent


def test_there_are_enough_hostile_ids() -> None:
    assert len(HOSTILE_IDS) >= 30
    assert len({repr(value) for value in HOSTILE_IDS}) == len(HOSTILE_IDS)


@pytest.mark.parametrize("rollout_id", HOSTILE_IDS, ids=repr)
def test_every_method_refuses_before_touching_the_disk(
    tmp_path: Path,
    layout: tuple[CaptureStore, CaptureStore],
    monkeypatch: pytest.MonkeyPatch,
    rollout_id: object,
) -> None:
    before = _tree(tmp_path)
    for store in layout:
        for method, call in _calls(store).items():
            with monkeypatch.context() as patch:
                _disk_tripwire(patch)
                with pytest.raises(InvalidRolloutIdError) as info:
                    call(rollout_id)
            message = str(info.value)
            assert info.value.rollout_id is rollout_id, method
            assert "rollout id" in message, method
            assert "^[A-Za-z0-9][A-Za-z0-9._-]*$" in message, method
            assert _expected_quote(rollout_id) in message, method
            assert isinstance(info.value, ValueError)
    assert _tree(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == ["outer"]
    assert sorted(os.listdir(tmp_path / "outer")) == ["captures", "sibling.txt"]
    assert os.listdir(tmp_path / "outer" / "captures") == ["existing-1.capture.jsonl"]


def test_hostile_files_in_the_directory_never_surface_as_ids(
    layout: tuple[CaptureStore, CaptureStore],
) -> None:
    store, _ = layout
    for value in HOSTILE_IDS:
        if not isinstance(value, str) or "/" in value or "\x00" in value or not value:
            continue
        for suffix in (".capture.jsonl", ".capture.incomplete"):
            name = value + suffix
            try:
                (store.root / name).write_bytes(b"{}\n")
            except (OSError, UnicodeEncodeError):
                continue  # the file system refuses this name; nothing to list
    assert store.rollout_ids() == ["existing-1"]


def test_longest_valid_id_is_accepted(layout: tuple[CaptureStore, CaptureStore]) -> None:
    store, _ = layout
    rid = "a" * 200
    assert store.path_for(rid).name == rid + ".capture.jsonl"
    assert store.record(rid, LINE) > 0
    store.mark_incomplete(rid)
    assert store.exists(rid)
    assert store.is_incomplete(rid)
    assert [e.data for e in store.read(rid, strict=True).entries] == [LINE]
    assert len(store.read_records(rid, strict=True).records) == 1
    assert store.rollout_ids() == [rid, "existing-1"]
    assert store.clear(rid)
    assert store.rollout_ids() == ["existing-1"]
