"""The collector's failures file: a failed rollout shows as failed, with its reason."""

from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core.collect import failures_path
from capture_core.collect.runner import FAILURE_KEY as COLLECTOR_FAILURE_KEY
from capture_core.testing import RunSpec, write_run
from ngcapture_viz.frames import AnalysisGap
from ngcapture_viz.load.failures import FAILURE_KEY, failures_file


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run whose rollout 2-0 was captured but failed: it is in the failures file only."""
    written = write_run(tmp_path, RunSpec(tasks=4, repeats=1, calls=(1, 3), seed=5))
    lines = written.rollouts.read_bytes().splitlines()
    kept, failed = [], []
    for line in lines:
        row = orjson.loads(line)
        if row["ng_model_call_capture"]["rollout_id"] == "2-0":
            row[FAILURE_KEY] = {
                "rollout_id": "2-0",
                "attempt": 0,
                "error_type": "RateLimitError",
                "error": "Error code: 429 - too many requests",
            }
            failed.append(orjson.dumps(row))
        else:
            kept.append(line)
    written.rollouts.write_bytes(b"\n".join(kept) + b"\n")
    failures_file(written.rollouts).write_bytes(b"\n".join(failed) + b"\n")
    return tmp_path


def _open(run_dir: Path) -> ngv.CaptureRun:
    return ngv.open_run(run_dir / "model-calls", run_dir / "rollouts.jsonl", index=False)


def test_the_reader_uses_the_collectors_names(tmp_path: Path) -> None:
    rollouts = tmp_path / "rollouts.jsonl"
    assert failures_file(rollouts) == failures_path(rollouts)
    assert FAILURE_KEY == COLLECTOR_FAILURE_KEY


def test_a_failed_rollout_is_failed_with_its_reason_not_a_missing_record(run_dir: Path) -> None:
    run = _open(run_dir)
    assert run.failures_path == run_dir / "rollouts_failures.jsonl"
    row = run.rollouts.filter(pl.col("rollout_id") == "2-0").row(0, named=True)
    assert row["failed"] is True
    assert row["failure"] == "RateLimitError: Error code: 429 - too many requests"
    assert row["in_rollouts"] is True and row["num_calls"] > 0
    assert AnalysisGap.NOT_IN_ROLLOUTS.value not in run.gaps["code"].cast(str).to_list()
    others = run.rollouts.filter(pl.col("rollout_id") != "2-0")
    assert others["failed"].to_list() == [False] * others.height
    assert others["failure"].null_count() == others.height
    card = run._repr_mimebundle_()
    assert "(1 failed)" in card["text/plain"]
    assert "Rollouts that failed in collection" in card["text/html"]
    assert "Error code: 429 - too many requests" in card["text/html"]


def test_without_the_failures_file_the_capture_has_no_record(run_dir: Path) -> None:
    (run_dir / "rollouts_failures.jsonl").unlink()
    run = _open(run_dir)
    assert run.failures_path is None
    gaps = run.gaps.filter(pl.col("rollout_id") == "2-0")
    assert gaps["code"].cast(str).to_list() == [AnalysisGap.NOT_IN_ROLLOUTS.value]
    row = run.rollouts.filter(pl.col("rollout_id") == "2-0").row(0, named=True)
    assert row["failed"] is None  # no record says: unknown, not "did not fail"
    assert run.rollouts.filter(pl.col("rollout_id") != "2-0")["failed"].to_list() == [False] * 3


def test_without_a_rollout_file_failed_is_unknown(run_dir: Path) -> None:
    run = ngv.open_run(run_dir / "model-calls", index=False)
    assert run.rollouts["failed"].null_count() == run.rollouts.height
