from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from capture_core import (
    ATTACHMENT_KEY,
    PAYLOAD_FIELDS,
    Gap,
    InvalidRecordError,
    ModelCallCaptureAttachment,
    ModelCallMetrics,
    ModelCallRecord,
    RawCaptureLine,
    normalize_line,
)

# The seed document's raw CaptureStore record, as one JSONL line.
SPEC_LINE = (
    b'{"model_call_id": "863410a8d52e4be6a31efc5c6e9d4629", "dialect": "responses",'
    b' "model_ref": {"type": "responses_api_models", "name": "policy_model"},'
    b' "started_at": 1786032154.12, "completed_at": 1786032154.96, "latency_ms": 842.7,'
    b' "latency_ttft_ms": 213.4, "status_code": 200, "error_category": null,'
    b' "request": {"model": "gpt-4.1-2025-04-14", "input": [{"role": "user",'
    b' "content": "Which option is correct?"}]},'
    b' "response": {"id": "resp_123", "status": "completed", "usage": {"input_tokens": 94,'
    b' "output_tokens": 28, "total_tokens": 122}}}'
)


def test_the_spec_example_line_reads_back_as_its_record() -> None:
    record = normalize_line(orjson.loads(SPEC_LINE), 0)
    assert record.tokens_in == 94
    assert record.tokens_out == 28
    assert record.tokens_total == 122
    assert record.latency_total_ms == 842.7
    assert record.latency_ttft_ms == 213.4
    assert record.response_id == "resp_123"
    assert record.response_status == "completed"
    assert record.model == "gpt-4.1-2025-04-14"
    assert record.model_ref is not None
    assert record.model_ref.name == "policy_model"
    assert record.dialect == "responses"
    assert record.started_at == datetime(2026, 8, 6, 16, 2, 34, 120000, tzinfo=UTC)
    assert record.started_at.tzinfo is UTC
    assert record.completed_at is not None and record.completed_at > record.started_at
    assert record.tokens_reasoning is None  # the example's usage does not report it
    assert record.cached_tokens is None and record.cache_hit is None
    assert record.finish_reason is None
    assert record.stream is False
    assert record.tool_calls == []


def test_the_spec_example_with_reasoning_tokens_gives_12() -> None:
    line = orjson.loads(SPEC_LINE)
    line["response"]["usage"]["output_tokens_details"] = {"reasoning_tokens": 12}
    line["response"]["usage"]["input_tokens_details"] = {"cached_tokens": 0}
    record = normalize_line(line, 0)
    assert (record.tokens_in, record.tokens_out, record.tokens_reasoning) == (94, 28, 12)
    assert record.tokens_total == 122
    assert (record.cached_tokens, record.cache_hit) == (0, False)


def test_raw_line_serializes_in_spec_order_without_absent_raw_keys() -> None:
    line = RawCaptureLine.model_validate(orjson.loads(SPEC_LINE))
    data = orjson.loads(line.to_jsonl())
    assert list(data) == [
        "model_call_id", "dialect", "model_ref", "started_at", "completed_at", "latency_ms",
        "latency_ttft_ms", "status_code", "error_category", "request", "response",
    ]  # fmt: skip
    assert data == orjson.loads(SPEC_LINE)
    raw = line.model_copy(update={"response_raw": "data: x\n\n"})
    assert list(orjson.loads(raw.to_jsonl()))[-1] == "response_raw"
    assert line.to_jsonl().endswith(b"\n") and line.to_jsonl().count(b"\n") == 1


def test_unknown_keys_are_ignored_so_newer_writers_stay_readable() -> None:
    line = orjson.loads(SPEC_LINE)
    line["added_by_a_newer_writer"] = {"x": 1}
    line["model_ref"]["region"] = "eu"
    record = normalize_line(line, 3)
    assert record.call_index == 3
    assert record.tokens_total == 122


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(status_code="abc"), "status_code"),
        (lambda d: d.update(model_ref=5), "model_ref"),
        (lambda d: d.update(request=[1, 2]), "request"),
        (lambda d: d.pop("model_call_id"), "model_call_id"),
        (lambda d: d.update(started_at=1e300), "timestamp"),
    ],
)
def test_wrong_typed_fields_make_the_line_invalid_and_say_which(mutate, field) -> None:  # type: ignore[no-untyped-def]
    line = orjson.loads(SPEC_LINE)
    mutate(line)
    with pytest.raises(InvalidRecordError) as info:
        normalize_line(line, 0)
    assert field in str(info.value)


@pytest.mark.parametrize("value", [[], "x", 3, None, True])
def test_non_objects_are_not_capture_lines(value: object) -> None:
    with pytest.raises(InvalidRecordError, match="JSON object"):
        normalize_line(value, 0)


def test_malformed_nested_shapes_never_raise() -> None:
    base = orjson.loads(SPEC_LINE)
    for response in (
        {"choices": {"x": 1}},
        {"incomplete_details": []},
        {"usage": {"input_tokens": "invalid", "output_tokens": 2.5}},
        {"usage": {"prompt_tokens_details": {"cached_tokens": []}}},
        {"choices": [{"message": "invalid"}]},
        {"output": [{"type": "reasoning", "summary": [{"text": {}}]}, 3, None]},
        {"content": [{"type": "tool_use", "input": 5}], "usage": []},
        {"error": 5},
    ):
        for dialect in ("responses", "chat", "messages", "future-dialect"):
            record = normalize_line({**base, "dialect": dialect, "response": response}, 0)
            assert record.tokens_total is None
            assert record.tokens_in is None
            assert record.reasoning_content is None


def test_attachment_omits_payloads_and_empty_gaps() -> None:
    record = normalize_line(orjson.loads(SPEC_LINE), 0)
    metrics = ModelCallMetrics(tokens_in=94, num_calls=1)
    attachment = ModelCallCaptureAttachment(rollout_id="0-0", metrics=metrics, calls=[record])
    data = attachment.to_json_dict()
    assert list(data) == ["rollout_id", "metrics", "calls"]
    assert not set(PAYLOAD_FIELDS) & set(data["calls"][0])
    assert data["calls"][0]["tokens_reasoning"] is None  # nulls are kept, not dropped
    full = attachment.to_json_dict(include_payloads=True)
    assert set(PAYLOAD_FIELDS) <= set(full["calls"][0])
    with_gap = attachment.model_copy(update={"gaps": [Gap(code="model_call_capture_incomplete")]})
    assert with_gap.to_json_dict()["gaps"] == [{"code": "model_call_capture_incomplete"}]
    assert list(ModelCallMetrics().model_dump()) == [
        "tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens",
        "latency_total_ms", "num_calls",
    ]  # fmt: skip
    assert ATTACHMENT_KEY == "ng_model_call_capture"


def test_record_field_order_puts_identity_first_and_latency_last() -> None:
    fields = list(ModelCallRecord.model_fields)
    assert fields[:3] == ["model_call_id", "response_id", "call_index"]
    assert fields[-2:] == ["latency_total_ms", "latency_ttft_ms"]
    record = ModelCallRecord(call_index=0)
    assert orjson.loads(orjson.dumps(record.to_json_dict()))["started_at"] is None


def test_the_spec_example_through_the_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from capture_core import CaptureStore, aggregate_model_call_metrics, read_model_call_records

    store = CaptureStore(tmp_path / "model-calls", create=True)
    line = orjson.loads(SPEC_LINE)
    line["response"]["usage"]["output_tokens_details"] = {"reasoning_tokens": 12}
    store.record("0-0", line)
    (record,) = read_model_call_records(store, "0-0")
    assert (record.tokens_in, record.tokens_out, record.tokens_reasoning) == (94, 28, 12)
    assert (record.tokens_total, record.latency_total_ms, record.response_id) == (
        122, 842.7, "resp_123",
    )  # fmt: skip
    metrics = aggregate_model_call_metrics(store, "0-0")
    assert metrics.model_dump() == {
        "tokens_in": 94, "tokens_out": 28, "tokens_reasoning": 12, "tokens_total": 122,
        "cached_tokens": None, "latency_total_ms": 842.7, "num_calls": 1,
    }  # fmt: skip
    assert store.path_for("0-0").read_bytes().count(b"\n") == 1
