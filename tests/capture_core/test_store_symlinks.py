"""A symlink planted in the capture directory never redirects a write outside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from capture_core import CaptureStore
from capture_core.exceptions import CaptureStoreError


@pytest.fixture
def planted(tmp_path: Path) -> tuple[CaptureStore, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    return CaptureStore(tmp_path / "calls", create=True), outside


def test_a_symlinked_capture_file_is_refused(planted: tuple[CaptureStore, Path]) -> None:
    store, outside = planted
    store.path_for("r").symlink_to(outside / "data")
    with pytest.raises(CaptureStoreError):
        store.record("r", {"model_call_id": "c", "dialect": "chat"})
    assert list(outside.iterdir()) == []


def test_a_symlinked_incomplete_marker_is_refused(planted: tuple[CaptureStore, Path]) -> None:
    store, outside = planted
    store.marker_path("r").symlink_to(outside / "marker")  # was: created outside
    with pytest.raises(CaptureStoreError):
        store.mark_incomplete("r")
    assert list(outside.iterdir()) == []
