"""One call's capture through a sink, failures isolated (reference §11.3 and the sink-semantics
part of §12.3)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from capture_core.exceptions import TokenCaptureRetiredError
from capture_core.tokens import (
    INCOMPLETE_SUFFIX,
    INTENTS_SUFFIX,
    TOKEN_FIELDS,
    TokenCallCapture,
    TokenCaptureStore,
    TokenEntry,
)
from tests.capture_core.tokens.entries import entry
from tests.capture_core.tokens.sinks import NoMarkSink, RecordingSink

TOKENS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3],
          "generation_log_probs": [-0.5]}  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> TokenCaptureStore:
    return TokenCaptureStore(tmp_path, create=True)


def _responses(**carrier: Any) -> dict[str, Any]:
    return {"model": "policy", "output": [
        {"type": "reasoning", "summary": []},
        {"type": "message", "content": [{"type": "output_text", "text": "hi"}], **carrier},
    ]}  # fmt: skip


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


class FailingPutSink(RecordingSink):
    async def put(self, entry: TokenEntry) -> None:
        raise OSError(28, "No space left on device")


class FailingMarkSink(FailingPutSink):
    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        raise ConnectionError("staging service down")


def test_a_responses_call_is_recorded_with_its_content_and_tokens_once(
    store: TokenCaptureStore,
) -> None:
    capture = TokenCallCapture("r1", "c1", store)
    assert _run(capture.capture_response(_responses(**TOKENS)))
    assert capture.committed
    [recorded] = store.read_entries("r1")
    assert (recorded.model_call_id, recorded.model) == ("c1", "policy")
    assert recorded.prompt_token_ids == [1, 2]
    assert recorded.output_items[1]["content"] == [{"type": "output_text", "text": "hi"}]
    assert not any(name in item for item in recorded.output_items for name in TOKEN_FIELDS)
    assert recorded.token_item_index == len(recorded.output_items) - 1
    assert not store.is_incomplete("r1")


def test_a_chat_call_and_a_model_object_are_recorded(store: TokenCaptureStore) -> None:
    class Completion(BaseModel):
        model: str
        choices: list[dict[str, Any]]

    chat = Completion(model="m", choices=[{"message": {"content": "x", **TOKENS}}])
    assert _run(TokenCallCapture("r1", "c1", store, model="ctx").capture_response(chat))
    assert [(e.model_call_id, e.model) for e in store.read_entries("r1")] == [("c1", "ctx")]


@pytest.mark.parametrize(
    "response",
    [_responses(), "plain text", _responses(prompt_token_ids=[1], generation_token_ids=[2]),
     _responses(**{**TOKENS, "generation_log_probs": [-0.1, -0.2]})],
    ids=["no-token-ids", "not-an-object", "partial", "mismatched-lengths"],
)  # fmt: skip
def test_a_call_without_usable_tokens_marks_the_rollout(
    store: TokenCaptureStore, response: object, caplog: pytest.LogCaptureFixture
) -> None:
    capture = TokenCallCapture("r1", "c1", store)
    with caplog.at_level(logging.WARNING, "capture_core.tokens"):
        assert not _run(capture.capture_response(response))
    assert store.read_entries("r1") == []
    assert store.is_incomplete("r1")
    assert store.path_for("r1", INCOMPLETE_SUFFIX).read_text() == "c1\n"
    assert "c1" in caplog.text


def test_a_failed_put_is_served_and_marks_through_the_protocol() -> None:
    sink = FailingPutSink()
    capture = TokenCallCapture("r1", "c1", sink)
    assert not _run(capture.capture_response(_responses(**TOKENS)))
    assert sink.marks == [("r1", "c1")]
    assert not capture.committed


def test_a_store_that_refuses_the_entry_marks_the_rollout(store: TokenCaptureStore) -> None:
    store.freeze_now("r1")  # a straggler after the collector froze the rollout
    assert not _run(TokenCallCapture("r1", "late", store).capture_response(_responses(**TOKENS)))
    assert store.is_incomplete("r1")


def test_marking_that_fails_or_cannot_happen_is_logged_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, "capture_core.tokens"):
        assert not _run(TokenCallCapture("r1", "c1", FailingMarkSink()).capture_response({}))
        assert "staging service down" in caplog.text
        caplog.clear()
        assert not _run(TokenCallCapture("r1", "c2", NoMarkSink()).capture_response({}))  # type: ignore[arg-type]
        assert "does not implement mark_incomplete" in caplog.text


def test_external_staging_writes_and_marks_nothing(tmp_path: Path) -> None:
    capture = TokenCallCapture("r1", "c1", None)
    assert not _run(capture.capture_response(_responses()))  # no ids: not marked
    assert _run(capture.commit(entry("c1", [1], [2])))
    assert capture.committed
    assert list(tmp_path.iterdir()) == []


def test_a_committed_call_is_not_marked_by_a_later_capture_without_ids(
    store: TokenCaptureStore,
) -> None:
    capture = TokenCallCapture("r1", "c1", store)
    assert _run(capture.commit(entry("c1", [1], [2])))
    assert not _run(capture.capture_response(_responses()))
    assert not store.is_incomplete("r1")


def test_an_entry_for_another_call_is_refused_and_marks(store: TokenCaptureStore) -> None:
    capture = TokenCallCapture("r1", "c1", store)
    assert not _run(capture.commit(entry("c2", [1], [2])))
    assert not _run(capture.commit(entry("c1", [1], [2], rollout="r2")))
    assert store.is_incomplete("r1")
    assert store.read_entries("r1") == []
    sink = RecordingSink()
    assert _run(TokenCallCapture("r1", "c1", sink).commit(entry("c1", [1], [2])))
    assert [e.model_call_id for e in sink.entries] == ["c1"]


def test_begin_records_the_intent_and_a_refusal_fails_the_call(store: TokenCaptureStore) -> None:
    capture = TokenCallCapture("r1", "c1", store)
    _run(capture.begin())
    assert store.path_for("r1", INTENTS_SUFFIX).read_text() == "c1\n"
    snapshot = store.freeze_now("r1")
    assert snapshot.incomplete  # announced, never committed: a lost call
    store.drop_now("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    with pytest.raises(TokenCaptureRetiredError):
        _run(TokenCallCapture("r1", "c2", store).begin())
    _run(TokenCallCapture("r1", "c3", RecordingSink()).begin())  # no begin_call: nothing
    _run(TokenCallCapture("r1", "c4", None).begin())
