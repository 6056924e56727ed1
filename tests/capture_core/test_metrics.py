from __future__ import annotations

import logging

import pytest

from capture_core import (
    CaptureStore,
    DamagedLineError,
    ModelCallRecord,
    aggregate_model_call_metrics,
    aggregate_model_call_records,
    read_model_call_records,
)
from capture_core.testing import Answer, CaptureLineFactory, capture_line


def test_totals_sum_what_was_reported_and_null_means_unknown() -> None:
    calls = [
        ModelCallRecord(call_index=0, tokens_in=5, cached_tokens=4, latency_total_ms=0.1),
        ModelCallRecord(call_index=1, tokens_in=None, cached_tokens=0, latency_total_ms=0.2),
        ModelCallRecord(call_index=2, tokens_out=7),
    ]
    metrics = aggregate_model_call_records(calls)
    assert metrics.tokens_in == 5  # a partially unknown set sums the known values
    assert metrics.cached_tokens == 4  # 0 is a reported value
    assert metrics.tokens_out == 7
    assert metrics.tokens_reasoning is None  # nobody reported it: unknown, not 0
    assert metrics.tokens_total is None
    assert metrics.latency_total_ms == 0.3  # no float noise (0.1 + 0.2)
    assert metrics.num_calls == 3


def test_no_calls_gives_all_nulls_and_zero_calls() -> None:
    metrics = aggregate_model_call_records([])
    assert metrics.model_dump() == {
        "tokens_in": None, "tokens_out": None, "tokens_reasoning": None, "tokens_total": None,
        "cached_tokens": None, "latency_total_ms": None, "num_calls": 0,
    }  # fmt: skip


def test_store_level_seed_api(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    store = CaptureStore(tmp_path / "model-calls", create=True)
    lines = list(CaptureLineFactory(seed=3, error_rate=0.3).lines(40))
    for line in lines:
        store.record("0-0", line)
    records = read_model_call_records(store, "0-0")
    assert [r.call_index for r in records] == list(range(40))
    assert [r.model_call_id for r in records] == [line.model_call_id for line in lines]
    metrics = aggregate_model_call_metrics(store, "0-0")
    assert metrics.num_calls == 40
    reported = [r.tokens_in for r in records if r.tokens_in is not None]
    assert reported and metrics.tokens_in == sum(reported)
    assert metrics.latency_total_ms == pytest.approx(sum(line.latency_ms or 0 for line in lines))

    with store.path_for("0-0").open("ab") as handle:
        handle.write(b'{"torn": \n')
    store.record("0-0", capture_line("chat", Answer(output_tokens=1000)))
    with caplog.at_level(logging.WARNING, logger="capture_core"):
        records = read_model_call_records(store, "0-0")
    assert len(records) == 41
    assert records[-1].call_index == 41  # the damaged line keeps its index
    assert "1 damaged line" in caplog.text and "line 41" in caplog.text
    assert aggregate_model_call_metrics(store, "0-0").num_calls == 41
    with pytest.raises(DamagedLineError) as info:
        aggregate_model_call_metrics(store, "0-0", strict=True)
    assert info.value.line_number == 41 and info.value.path == store.path_for("0-0")


def test_missing_rollout_reads_as_no_calls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = CaptureStore(tmp_path)
    assert read_model_call_records(store, "9-9") == []
    assert aggregate_model_call_metrics(store, "9-9").num_calls == 0
