"""``ngcapture sweep``: the marks of a killed server go, and the calls they lost are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from capture_core import CaptureStore
from capture_core.cli import main
from capture_core.pending import pending_calls
from capture_core.writers import CaptureWriter
from tests.capture_core.test_writers import dead_writer


def test_sweep_names_lost_calls_and_leaves_live_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    store = CaptureStore(tmp_path, create=True)
    store.record("0-0", {"model_call_id": "landed1", "dialect": "chat"})
    dead = dead_writer(tmp_path, "0-0", "lost1", "landed1")
    live = CaptureWriter(tmp_path)
    try:
        live.mark("1-0", "inflight1")
        assert main(["sweep", "--capture-dir", str(tmp_path), "--dry-run"]) == 0
        preview = capsys.readouterr().out
        assert "would remove mark of call lost1 in rollout 0-0" in preview
        assert len(pending_calls(tmp_path)) == 3  # nothing removed yet
        assert main(["sweep", "--capture-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
    finally:
        live.close()
    assert f"removed mark of call lost1 in rollout 0-0 (server {dead}): its capture is lost" in out
    assert "call landed1 in rollout 0-0" in out and "its line had landed" in out
    assert "removed 2 mark(s) of 1 dead server(s), 1 lost call(s); left 1 mark(s)" in out
    # the live writer's mark was left alone; closed while still marked, it is lost now
    assert [(p.model_call_id, p.state) for p in pending_calls(tmp_path)] == [("inflight1", "dead")]


def test_sweep_refuses_a_directory_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    missing = tmp_path / "nope"
    assert main(["sweep", "--capture-dir", str(missing)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not missing.exists()
