"""The README's "Reading a capture" snippet runs as written, and never creates what it reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from capture_core import CaptureDirNotFoundError, ModelCallMetrics, ModelCallRecord
from capture_core.testing import RunSpec, write_run

README = Path(__file__).resolve().parents[2] / "README.md"


def _snippet(section: str) -> str:
    """The first python block of a README section."""
    text = README.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match is not None, section
    return match.group(1)


def test_reading_snippet_runs_as_written_after_make_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `make demo` leaves in results/demo/ckpt-200 (the same layout, synthetic calls).
    written = write_run(tmp_path / "results" / "demo" / "ckpt-200", RunSpec(tasks=3, repeats=1))
    monkeypatch.chdir(tmp_path)
    names: dict[str, object] = {}
    exec(compile(_snippet("Reading a capture"), str(README), "exec"), names)
    assert names["rollout_id"] == "0-0"
    calls = names["calls"]
    assert isinstance(calls, list) and calls and all(isinstance(c, ModelCallRecord) for c in calls)
    totals = names["totals"]
    assert isinstance(totals, ModelCallMetrics) and totals.num_calls == len(calls)
    assert len(calls) == len((written.capture_dir / "0-0.capture.jsonl").read_bytes().splitlines())


def test_reading_snippet_in_an_empty_directory_raises_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CaptureDirNotFoundError) as info:
        exec(compile(_snippet("Reading a capture"), str(README), "exec"), {})
    assert str(tmp_path / "results" / "demo" / "ckpt-200" / "model-calls") in str(info.value)
    assert list(tmp_path.iterdir()) == []
