from __future__ import annotations

import time
from pathlib import Path

from capture_core import CaptureStore
from capture_core.collect import capture_attachment
from capture_core.pending import mark_pending
from capture_core.testing import Answer, CaptureLineFactory, capture_line, torn

SEED_CALL_KEYS = {
    "model_call_id", "response_id", "call_index", "model_ref", "model", "dialect",
    "status_code", "response_status", "tokens_in", "tokens_out", "tokens_reasoning",
    "tokens_total", "latency_total_ms",
}  # fmt: skip
SEED_METRIC_KEYS = [
    "tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens",
    "latency_total_ms", "num_calls",
]  # fmt: skip


def test_a_clean_rollout_matches_the_seed_shape(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    lines = list(CaptureLineFactory(seed=5, error_rate=0).lines(6))
    for line in lines:
        store.record("0-0", line)
    data = capture_attachment([tmp_path], "0-0").to_json_dict()
    assert list(data) == ["rollout_id", "metrics", "calls"]  # no gaps key when there are none
    assert list(data["metrics"]) == SEED_METRIC_KEYS
    assert data["metrics"]["num_calls"] == 6
    assert all(set(call) >= SEED_CALL_KEYS for call in data["calls"])
    assert not any({"request", "response"} & set(call) for call in data["calls"])
    reported = [c["tokens_in"] for c in data["calls"] if c["tokens_in"] is not None]
    assert data["metrics"]["tokens_in"] == sum(reported)


def test_missing_capture_is_a_no_records_gap(tmp_path: Path) -> None:
    data = capture_attachment([tmp_path / "a", tmp_path / "b"], "9-9").to_json_dict()
    assert data["gaps"] == [{"code": "model_call_capture_no_records"}]
    assert data["calls"] == []
    assert data["metrics"]["num_calls"] == 0
    assert data["metrics"]["tokens_in"] is None
    assert not (tmp_path / "a").exists()  # reading never creates directories


def test_damaged_lines_and_a_marker_keep_the_other_calls(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    good = capture_line("chat", Answer())
    store.record("1-0", good)
    with store.path_for("1-0").open("ab") as handle:
        handle.write(torn(good) + b"\n" + b"[1, 2]\n")
    store.record("1-0", capture_line("messages", Answer()))
    store.mark_incomplete("1-0")
    data = capture_attachment([tmp_path], "1-0").to_json_dict()
    assert [c["call_index"] for c in data["calls"]] == [0, 3]
    assert data["gaps"] == [
        {"code": "model_call_capture_records_unreadable", "detail": "count=2"},
        {"code": "model_call_capture_incomplete"},
    ]


def test_an_empty_file_is_no_records(tmp_path: Path) -> None:
    CaptureStore(tmp_path).path_for("2-0").write_bytes(b"\n  \n")
    gaps = capture_attachment([tmp_path], "2-0").to_json_dict()["gaps"]
    assert gaps == [{"code": "model_call_capture_no_records"}]


def test_a_write_that_never_lands_is_pending_and_bounded(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.record("3-0", capture_line("chat", Answer()))
    mark_pending(tmp_path, "3-0", "a" * 32)
    mark_pending(tmp_path, "3-00", "b" * 32)  # another rollout: must not count
    started = time.monotonic()
    data = capture_attachment([tmp_path], "3-0", drain_timeout_s=0.3).to_json_dict()
    assert 0.3 <= time.monotonic() - started < 5
    assert data["gaps"] == [{"code": "model_call_capture_pending", "detail": "count=1"}]
    assert data["metrics"]["num_calls"] == 1
