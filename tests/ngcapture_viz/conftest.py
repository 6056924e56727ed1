"""Shared fixtures of the ``ngcapture_viz`` tests: capture directories and capture lines.

Kept small on purpose: a temporary store directory, a deterministic line factory, and a helper
that writes raw bytes (lines go to disk exactly as given, damaged or not).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from capture_core import RawCaptureLine
from capture_core.testing import CaptureLineFactory

__all__ = ["jsonl", "write_capture"]


def jsonl(line: RawCaptureLine | Mapping[str, Any] | bytes) -> bytes:
    """One capture line as bytes ending in a newline (``bytes`` are taken as they are)."""
    if isinstance(line, bytes):
        return line
    if isinstance(line, RawCaptureLine):
        return line.to_jsonl()
    return orjson.dumps(dict(line), option=orjson.OPT_APPEND_NEWLINE)


def write_capture(
    capture_dir: Path, rollout_id: str, lines: Iterable[RawCaptureLine | Mapping[str, Any] | bytes]
) -> Path:
    """Write ``<capture_dir>/<rollout_id>.capture.jsonl`` holding exactly ``lines``."""
    path = capture_dir / f"{rollout_id}.capture.jsonl"
    path.write_bytes(b"".join(jsonl(line) for line in lines))
    return path


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    """An empty capture store directory, ``<tmp>/model-calls``."""
    path = tmp_path / "model-calls"
    path.mkdir()
    return path


@pytest.fixture
def line_factory() -> CaptureLineFactory:
    """Varied, realistic capture lines; seed 0, so the same lines on every run."""
    return CaptureLineFactory(seed=0)


def bar_values(trace: Any) -> list[Any]:
    """A bar trace's values, whichever way its bars point."""
    return list(trace.x if trace.orientation == "h" else trace.y)


def bar_labels(trace: Any) -> list[Any]:
    """A bar trace's group labels, whichever way its bars point."""
    return list(trace.y if trace.orientation == "h" else trace.x)
