"""The facts the server writes into each capture line (issue 19): what they hold, that lines
carrying them still read under the spec's reader contract, and the version that guards them."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import orjson
import pytest

import capture_core
from capture_core import CaptureStore, normalize_line, read_model_call_records
from capture_core.facts import FACTS_KEY, FACTS_VERSION, call_facts, line_facts, writer_name
from capture_core.normalize import record_fields, validate_raw_line
from capture_core.server.exchange import Exchange
from capture_core.testing import Answer, CaptureLineFactory, ToolCallSpec, request_body
from capture_core.testing.bodies import response_body
from capture_core.testing.streams import response_stream


def _exchange(dialect: str, response: bytes, *, stream: bool = False) -> Exchange:
    request = orjson.dumps(request_body(dialect, stream=stream, tools=True))
    return Exchange(
        "c" * 32,
        dialect,
        {"type": "responses_api_models", "name": "policy"},
        time.time(),
        [request],
        [response],
        status_code=200,
        streaming=stream,
        completed_at=time.time(),
        latency_ms=12.5,
        ttft_ms=3.0,
    )


def _record_values(line: dict[str, object]) -> dict[str, object]:
    """What normalization derives from the line's bodies, in the facts' terms."""
    fields = record_fields(validate_raw_line(line), 0)
    return {key: value for key, value in fields.items() if key not in ("request", "response")}


ANSWER = Answer(
    reasoning="think first",
    tool_calls=(ToolCallSpec("lookup", {"q": "x", "k": 2}, "call_1"),),
    cached_tokens=7,
)


@pytest.mark.parametrize("dialect", ["responses", "chat", "messages"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_server_line_carries_the_facts_normalization_derives(
    dialect: str, stream: bool
) -> None:
    body = (
        response_stream(dialect, ANSWER) if stream else orjson.dumps(response_body(dialect, ANSWER))
    )
    line = orjson.loads(orjson.dumps(_exchange(dialect, body, stream=stream).line()))
    facts = line[FACTS_KEY]
    assert facts["v"] == FACTS_VERSION and facts["writer"] == writer_name()
    record = _record_values(line)
    for key in ("response_id", "model", "stream", "response_status", "finish_reason",
                "tokens_in", "tokens_out", "tokens_reasoning", "tokens_total",
                "cached_tokens", "cache_creation_tokens", "reasoning_content",
                "error_code", "error_message"):  # fmt: skip
        assert facts.get(key) == record[key], key
    assert facts["stream"] is stream
    assert facts["tokens_in"] is not None and facts["reasoning_content"]
    (tool,) = facts["tool_calls"]
    (expected,) = record["tool_calls"]  # type: ignore[misc]
    assert tool["name"] == expected.name == "lookup"
    assert orjson.loads(tool["arguments"]) == expected.arguments == {"q": "x", "k": 2}
    assert tool.get("choice_index") == (0 if dialect == "chat" else None)


def test_lines_with_facts_read_back_under_the_reader_contract(tmp_path: Path) -> None:
    """Readers ignore unknown keys: the record is the same with and without the facts."""
    store = CaptureStore(tmp_path)
    plain = [line.to_json_dict() for line in CaptureLineFactory(seed=3).lines(30)]
    with_facts = [
        {**line, FACTS_KEY: call_facts(line["dialect"], line["request"], line["response"])}
        for line in plain
    ]
    for line in with_facts:
        store.record("0-0", line)
    records = read_model_call_records(store, "0-0", strict=True)
    assert records == [normalize_line(line, n) for n, line in enumerate(plain)]
    assert FACTS_KEY in orjson.loads(store.path_for("0-0").read_bytes().splitlines()[0])


def test_facts_that_cannot_be_built_leave_the_line_without_them() -> None:
    class Unencodable:
        pass

    response = {"choices": [{"message": {"tool_calls": [
        {"id": "a", "function": {"name": "f", "arguments": {"x": Unencodable()}}}]}}]}  # fmt: skip
    assert line_facts("chat", {}, response) is None
    assert line_facts("chat", {}, {"choices": []}) is not None


def test_a_body_that_is_not_an_object_gives_facts_of_nothing() -> None:
    line = _exchange("chat", b"not json").line()
    assert line["error_category"] == "capture_parse_error"
    expected = {
        "v": FACTS_VERSION,
        "writer": writer_name(),
        "model": "sim-model-1",
        "stream": False,
    }
    assert line[FACTS_KEY] == expected  # the model the request named; nothing from the body


def test_the_facts_add_few_bytes_and_leave_nulls_out() -> None:
    lines = [line.to_json_dict() for line in CaptureLineFactory(seed=1).lines(300)]
    facts = [call_facts(line["dialect"], line["request"], line["response"]) for line in lines]
    assert all(None not in each.values() for each in facts)
    added = sum(len(orjson.dumps(each)) for each in facts)
    assert added < 0.08 * sum(len(orjson.dumps(line)) for line in lines)  # measured: 5.7 %


# Normalization decides what facts mean: a change to any of these files that changes what is
# derived must bump FACTS_VERSION (readers would otherwise trust facts the new code no longer
# derives), then record the new digest here. A change that derives the same (a speed-up, shown
# by the equality and property tests) records the new digest for the current version.
_SOURCES = (
    "capture_core/normalize.py",
    "capture_core/facts.py",
    "capture_core/dialects/__init__.py",
    "capture_core/dialects/_facts.py",
    "capture_core/dialects/_usage.py",
    "capture_core/dialects/chat.py",
    "capture_core/dialects/messages.py",
    "capture_core/dialects/responses.py",
)
_PINNED = {1: "f48c7cdc1a64e32bb9060e2ae5fb4164cbe6b857d7c40894a37228433b6ac43d"}


def test_the_facts_version_is_bumped_when_normalization_changes() -> None:
    root = Path(capture_core.__file__).parent.parent
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((root / name).read_bytes())
    assert FACTS_VERSION in _PINNED, "pin the digest of the new FACTS_VERSION below"
    assert _PINNED[FACTS_VERSION] == digest.hexdigest(), (
        "capture_core's normalization changed: if what it derives from a body changed, bump "
        f"FACTS_VERSION; then pin {digest.hexdigest()} for it in this test"
    )
