"""open_run names every call whose capture was lost: by a dead server, or a failed write."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl

import ngcapture_viz as ngv
from capture_core import CaptureStore
from capture_core.records import CaptureFailure
from capture_core.testing import capture_line
from capture_core.writers import CaptureWriter
from tests.capture_core.test_writers import dead_writer


def test_lost_and_failed_calls_are_gaps_and_pending_ones_stay_pending(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path, create=True)
    landed = capture_line("chat")
    store.record("0-0", landed)
    dead_writer(tmp_path, "0-0", "lost1", landed.model_call_id)  # one lost, one stale
    live = CaptureWriter(tmp_path)
    try:
        live.mark("1-0", "inflight1")
        live.record_failure(CaptureFailure(rollout_id="2-0", model_call_id="failed1",
                                           started_at=time.time(), failed_at=time.time(),
                                           reason="ENOSPC: No space left on device",
                                           writer=live.token))  # fmt: skip
        store.mark_incomplete("2-0")  # explained call by call: no rollout-level gap too
        store.mark_incomplete("3-0")  # nothing names the call: the rollout-level gap
        run = ngv.open_run(tmp_path, progress=False)
    finally:
        live.close()
    gaps = run.gaps.filter(pl.col("code").cast(pl.String).str.starts_with("model_call_capture"))
    found = sorted(gaps.select("code", "rollout_id", "model_call_id").iter_rows())
    assert found == [
        ("model_call_capture_failed", "2-0", "failed1"),
        ("model_call_capture_incomplete", "3-0", None),
        ("model_call_capture_lost", "0-0", "lost1"),
        ("model_call_capture_pending", "1-0", "inflight1"),
    ]
    failed = gaps.filter(pl.col("code") == "model_call_capture_failed").row(0, named=True)
    assert "ENOSPC" in failed["detail"]
    pending = dict(run.rollouts.select("rollout_id", "pending_writes").iter_rows())
    assert pending.get("1-0") == 1 and pending.get("0-0") == 0


def test_abandoned_calls_are_failures_and_the_gap_report_counts_them(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path, create=True)
    served = capture_line("chat", model_call_id="c1")
    abandoned = capture_line("chat", stream=True, terminal=False, model_call_id="c2")
    abandoned = abandoned.model_copy(update={"error_category": "client_disconnected"})
    store.record("0-0", served)
    store.record("0-0", abandoned)
    run = ngv.open_run(tmp_path, progress=False)
    assert ngv.summary_metrics(run)["error_rate"] == 0.5
    summary = ngv.gap_report(run).summary
    row = summary.filter(pl.col("metric") == "calls_abandoned").row(0, named=True)
    assert (row["count"], row["total"]) == (1, 2)
