from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from capture_core.exceptions import InvalidRolloutIdError, RolloutRetiredError
from capture_core.lineage import (
    FINGERPRINT_VERSION,
    LedgerConflictError,
    LedgerCorruptError,
    LineageStore,
    RecordOutcome,
    ResolutionStatus,
    assistant_fingerprint,
    conversation_digest,
    lineage_request_items,
)
from capture_core.staging.manifest import CallRecord, ManifestFailure
from capture_core.staging.reasons import LineageResolutionReason


def hexd(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def row(
    call: str,
    *,
    parent: CallRecord | None = None,
    delta: int = 3,
    rollout: str = "r1",
    fingerprint: str | None = None,
    **changes: Any,
) -> CallRecord:
    prev = 0 if parent is None else parent.cum_len
    fields: dict[str, Any] = {
        "model_call_id": call,
        "parent_call_id": None if parent is None else parent.model_call_id,
        "prev_len": prev,
        "delta_len": delta,
        "cum_len": prev + delta,
        "weight_version": 1,
        "digest": hexd(f"digest {call}"),
        "extras_digest": hexd("extras"),
        "staging_key": f"{rollout}/{call}",
        "mode": "text" if parent is None else "token_in",
        "chain_hash": hexd(f"chain {call}"),
        "cumulative_hash": hexd(f"cum {call}"),
        "response_id": f"resp_{call}",
        "admitted_at": 1_700_000_000.5,
        "output_fingerprint": hexd(f"out {call}"),
        "continuation_fingerprint": fingerprint or hexd(f"cont {call}"),
        "fingerprint_version": FINGERPRINT_VERSION,
    }
    fields.update(changes)
    return CallRecord.model_validate(fields)


@pytest.fixture
def store(tmp_path: Path) -> LineageStore:
    return LineageStore(tmp_path / "lineage")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- record, failures, manifest -------------------------------------------------------------


def test_record_appends_a_token_free_sorted_row(store: LineageStore) -> None:
    c1 = row("c1")
    assert store.record("r1", c1) is RecordOutcome.APPENDED
    raw = store.ledger_path("r1").read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    (written,) = lines(store.ledger_path("r1"))
    assert list(written) == sorted(written)
    assert written["staging_digest"] == c1.digest
    assert written["digest"] == c1.cumulative_hash
    assert written["fingerprint"] == c1.continuation_fingerprint
    assert written["staging_chain"] == ["r1/c1"]
    assert "capture_key" not in written and "schema_version" not in written
    assert not any("token_ids" in key for key in written)
    assert store.manifest("r1").records == [c1]


def test_identical_recommit_is_a_duplicate(store: LineageStore) -> None:
    store.record("r1", row("c1"))
    assert store.record("r1", row("c1")) is RecordOutcome.DUPLICATE
    assert len(lines(store.ledger_path("r1"))) == 1


@pytest.mark.parametrize(
    "change", [{"weight_version": 2}, {"response_id": "other"}, {"admitted_at": 1.0}]
)
def test_differing_recommit_conflicts_and_writes_nothing(
    store: LineageStore, change: dict[str, Any]
) -> None:
    store.record("r1", row("c1"))
    before = store.ledger_path("r1").read_bytes()
    with pytest.raises(LedgerConflictError) as caught:
        store.record("r1", row("c1", **change))
    assert (caught.value.rollout_id, caught.value.model_call_id) == ("r1", "c1")
    assert store.ledger_path("r1").read_bytes() == before


def test_failures_are_listed_apart_and_written_once(store: LineageStore) -> None:
    store.record("r1", row("c1"))
    failure = ManifestFailure(model_call_id="c2", reason="unresolved_parent")
    assert store.record_failure("r1", failure) is RecordOutcome.APPENDED
    assert store.record_failure("r1", failure) is RecordOutcome.DUPLICATE
    other = ManifestFailure(model_call_id="c2", reason="worker_capture_failed")
    assert store.record_failure("r1", other) is RecordOutcome.APPENDED
    assert lines(store.ledger_path("r1"))[1] == {
        "failure_reason": "unresolved_parent",
        "model_call_id": "c2",
    }
    manifest = store.manifest("r1")
    assert [r.model_call_id for r in manifest.records] == ["c1"]
    assert manifest.failures == [failure, other]


def test_manifest_keeps_ledger_order_and_lists_each_call_once(store: LineageStore) -> None:
    c1 = row("c1")
    c2 = row("c2", parent=c1)
    c3 = row("c3", parent=c2)
    for record in (c1, c2, c3):
        store.record("r1", record)
    # Another writer of the format may repeat a row: the first one is listed.
    with store.ledger_path("r1").open("a") as file:
        file.write(json.dumps(lines(store.ledger_path("r1"))[0]) + "\n")
    manifest = store.manifest("r1")
    assert manifest.rollout_id == "r1"
    assert manifest.records == [c1, c2, c3]
    assert lines(store.ledger_path("r1"))[2]["staging_chain"] == ["r1/c1", "r1/c2", "r1/c3"]


def test_absent_rollout_has_an_empty_manifest_and_no_rows(store: LineageStore) -> None:
    manifest = store.manifest("never")
    assert (manifest.rollout_id, manifest.records, manifest.failures) == ("never", [], [])
    assert store.has_rows("never") is False
    assert list(store.root.iterdir()) == []  # reads create no files
    store.record_failure("r1", ManifestFailure(model_call_id="c1", reason="x"))
    assert store.has_rows("r1") is True


def test_rows_missing_response_id_or_chain_hash_become_failures(store: LineageStore) -> None:
    store.record("r1", row("c1"))
    base = lines(store.ledger_path("r1"))[0]
    no_response = {**base, "model_call_id": "c2", "response_id": None}
    no_chain = {k: v for k, v in base.items() if k != "chain_hash"} | {"model_call_id": "c3"}
    with store.ledger_path("r1").open("a") as file:
        for extra in (no_response, no_chain):
            file.write(json.dumps(extra) + "\n")
    manifest = store.manifest("r1")
    assert [r.model_call_id for r in manifest.records] == ["c1"]
    assert [(f.model_call_id, f.reason) for f in manifest.failures] == [
        ("c2", "ledger_row_missing_response_id"),
        ("c3", "ledger_row_missing_chain_hash"),
    ]


def test_torn_last_line_is_ignored_then_cut_by_the_next_append(
    store: LineageStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.record("r1", row("c1"))
    with store.ledger_path("r1").open("ab") as file:
        file.write(b'{"model_call_id": "c2", "staging_')
    with caplog.at_level(logging.WARNING, logger="capture_core.lineage"):
        assert [r.model_call_id for r in store.manifest("r1").records] == ["c1"]
    assert "torn last line (33 bytes)" in caplog.text
    store.record("r1", row("c3"))
    assert [r["model_call_id"] for r in lines(store.ledger_path("r1"))] == ["c1", "c3"]
    assert [r.model_call_id for r in store.manifest("r1").records] == ["c1", "c3"]


@pytest.mark.parametrize("bad", [b"not json", b"[1, 2]", b'{"no_call": 1}', b""])
def test_damaged_line_with_more_after_it_raises_naming_file_and_line(
    store: LineageStore, bad: bytes
) -> None:
    store.record("r1", row("c1"))
    with store.ledger_path("r1").open("ab") as file:
        file.write(bad + b"\n")
    store_path = store.ledger_path("r1")
    with store_path.open("ab") as file:
        file.write(json.dumps({"failure_reason": "x", "model_call_id": "c9"}).encode() + b"\n")
    with pytest.raises(LedgerCorruptError) as caught:
        store.manifest("r1")
    assert caught.value.path == store_path and caught.value.line_number == 2
    assert str(store_path) in str(caught.value) and "line 2" in str(caught.value)
    with pytest.raises(LedgerCorruptError):
        store.record("r1", row("c2"))


def test_invalid_custody_row_is_corruption(store: LineageStore) -> None:
    store.record("r1", row("c1"))
    bad = {**lines(store.ledger_path("r1"))[0], "model_call_id": "c2", "cum_len": 99}
    with store.ledger_path("r1").open("a") as file:
        file.write(json.dumps(bad) + "\n")
    with pytest.raises(LedgerCorruptError, match="line 2"):
        store.manifest("r1")


def test_hostile_ids_never_reach_a_path(store: LineageStore) -> None:
    for bad in ("../x", "", "a/b", ".hidden"):
        with pytest.raises(InvalidRolloutIdError):
            store.record(bad, row("c1"))
        with pytest.raises(InvalidRolloutIdError):
            store.manifest(bad)
    assert list(store.root.iterdir()) == []


def test_a_symlinked_ledger_is_refused(store: LineageStore, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    store.ledger_path("r1").symlink_to(target)
    with pytest.raises(OSError):
        store.record("r1", row("c1"))
    assert target.read_text() == ""


# --- retire and delete ----------------------------------------------------------------------


def test_retire_fences_the_rollout(store: LineageStore) -> None:
    store.record("r1", row("c1"))
    removal = store.retire(["r1", "r2"])
    assert (removal.removed, removal.absent) == (["r1"], ["r2"])
    assert not store.ledger_path("r1").exists()
    assert store.fence_path("r1").read_bytes() == b""
    assert store.fence_path("r2").exists()  # a never-used id is fenced too
    assert store.is_retired("r1") and store.is_retired("r2")
    for rollout in ("r1", "r2"):
        with pytest.raises(RolloutRetiredError) as caught:
            store.manifest(rollout)
        assert caught.value.rollout_id == rollout
        with pytest.raises(RolloutRetiredError):
            store.has_rows(rollout)
        with pytest.raises(RolloutRetiredError):
            store.resolve_parent(rollout, fingerprint=hexd("x"))


def test_late_writes_are_discarded_with_a_warning_and_counted(
    store: LineageStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.record("r1", row("c1"))
    store.retire(["r1"])
    assert store.discarded == 0
    with caplog.at_level(logging.WARNING, logger="capture_core.lineage"):
        assert store.record("r1", row("c2")) is RecordOutcome.DISCARDED_RETIRED
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "r1/c2" in caplog.text
    failure = ManifestFailure(model_call_id="c3", reason="unresolved_parent")
    assert store.record_failure("r1", failure) is RecordOutcome.DISCARDED_RETIRED
    assert store.discarded == 2
    assert not store.ledger_path("r1").exists()


def test_retire_is_idempotent(store: LineageStore) -> None:
    store.record("r1", row("c1"))
    assert store.retire(["r1"]).removed == ["r1"]
    second = store.retire(["r1"])
    assert (second.removed, second.absent) == ([], ["r1"])
    assert store.is_retired("r1")


def test_batches_are_deduped_in_order(store: LineageStore) -> None:
    for rollout in ("a", "b"):
        store.record(rollout, row("c1", rollout=rollout))
    removal = store.retire(["b", "x", "b", "a", "x"])
    assert (removal.removed, removal.absent) == (["b", "a"], ["x"])
    removal = store.delete(["x", "a", "x"])
    assert (removal.removed, removal.absent) == ([], ["x", "a"])


@pytest.mark.parametrize("operation", ["retire", "delete"])
def test_an_invalid_id_in_a_batch_changes_nothing(store: LineageStore, operation: str) -> None:
    store.record("r1", row("c1"))
    store.retire(["r2"])
    before = sorted(p.name for p in store.root.iterdir())
    with pytest.raises(InvalidRolloutIdError):
        getattr(store, operation)(["r1", "r2", "r3", "../etc"])
    assert sorted(p.name for p in store.root.iterdir()) == before
    with pytest.raises(TypeError, match="the string"):
        getattr(store, operation)("r1")
    assert sorted(p.name for p in store.root.iterdir()) == before


def test_delete_makes_the_id_reusable(store: LineageStore) -> None:
    store.record("r1", row("c1"))
    removal = store.delete(["r1", "r9"])
    assert (removal.removed, removal.absent) == (["r1"], ["r9"])
    assert list(store.root.iterdir()) == []
    assert store.manifest("r1").records == []
    assert store.record("r1", row("c7")) is RecordOutcome.APPENDED
    assert [r.model_call_id for r in store.manifest("r1").records] == ["c7"]


def test_delete_after_retire_reports_absent_and_lifts_the_fence(store: LineageStore) -> None:
    store.record("r1", row("c1"))
    store.retire(["r1"])
    removal = store.delete(["r1"])
    assert (removal.removed, removal.absent) == ([], ["r1"])
    assert not store.is_retired("r1") and list(store.root.iterdir()) == []
    assert store.manifest("r1").records == []
    assert store.record("r1", row("c1")) is RecordOutcome.APPENDED


def test_root_must_exist_without_create(tmp_path: Path) -> None:
    from capture_core.exceptions import CaptureStoreError

    with pytest.raises(CaptureStoreError):
        LineageStore(tmp_path / "missing", create=False)
    assert LineageStore(tmp_path, create=False).root == tmp_path.resolve()


# --- parent resolution ----------------------------------------------------------------------


def test_resolve_parent_by_continuation_fingerprint(store: LineageStore) -> None:
    c1 = row("c1")
    c2 = row("c2", parent=c1)
    store.record("r1", c1)
    store.record("r1", c2)
    root = store.resolve_parent("r1", fingerprint="")
    assert root.status is ResolutionStatus.ROOT and root.parent is None
    found = store.resolve_parent("r1", fingerprint=c2.continuation_fingerprint or "")
    assert found.status is ResolutionStatus.RESOLVED and found.reason is None
    assert found.parent == c2
    assert found.staging_chain == ("r1/c1", "r1/c2")
    # The output fingerprint alone is not the lineage key of a continuation.
    missing = store.resolve_parent("r1", fingerprint=c2.output_fingerprint or "")
    assert (missing.status, missing.reason) == (
        ResolutionStatus.UNRESOLVED,
        LineageResolutionReason.NO_MATCH,
    )


def test_resolve_parent_never_guesses_between_different_parents(store: LineageStore) -> None:
    shared = hexd("same history")
    store.record("r1", row("c1", fingerprint=shared))
    store.record("r1", row("c2", fingerprint=shared))
    result = store.resolve_parent("r1", fingerprint=shared)
    assert (result.status, result.reason) == (
        ResolutionStatus.UNRESOLVED,
        LineageResolutionReason.AMBIGUOUS,
    )


def test_resolve_parent_accepts_equivalent_repeats(store: LineageStore) -> None:
    same = {"cumulative_hash": hexd("cum"), "chain_hash": hexd("chain")}
    fp = hexd("same history")
    store.record("r1", row("c1", fingerprint=fp, **same))
    store.record("r1", row("c2", fingerprint=fp, **same))
    result = store.resolve_parent("r1", fingerprint=fp)
    assert result.parent is not None and result.parent.model_call_id == "c1"


def test_rows_without_v3_fingerprint_cannot_anchor(store: LineageStore) -> None:
    fp = hexd("x")
    store.record("r1", row("c1", fingerprint=fp, fingerprint_version=2))
    result = store.resolve_parent("r1", fingerprint=fp)
    assert result.reason is LineageResolutionReason.NO_MATCH


def test_resolve_parent_checks_the_recorded_context(store: LineageStore) -> None:
    request = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    response = [{"role": "assistant", "content": "hello"}]
    fp = assistant_fingerprint(request + response)
    store.record("r1", row("c1", fingerprint=fp), request_items=request)
    child = [*request, *response, {"role": "user", "content": "more"}]
    assert assistant_fingerprint(child) == fp
    ok = store.resolve_parent("r1", fingerprint=fp, request_items=child)
    assert ok.status is ResolutionStatus.RESOLVED
    edited = [request[0], {"role": "user", "content": "HI"}, *child[2:]]
    bad = store.resolve_parent("r1", fingerprint=fp, request_items=edited)
    assert bad.reason is LineageResolutionReason.NO_MATCH
    short = store.resolve_parent("r1", fingerprint=fp, request_items=child[:1])
    assert short.reason is LineageResolutionReason.NO_MATCH


# --- fingerprints (§2.7, version 3) ---------------------------------------------------------


def _field(tag: int, text: str) -> bytes:
    data = text.encode()
    return bytes([tag]) + len(data).to_bytes(8, "big") + data


def test_assistant_fingerprint_bytes() -> None:
    items = [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "summary": []},
        {"role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {
            "type": "function_call",
            "call_id": "call_1",
            "namespace": "shell",
            "name": "run",
            "arguments": '{ "b": 1, "a": 2 }',
        },
    ]
    expected = hashlib.sha256(
        b"nemo-gym-lineage"
        + _field(0, "text")
        + _field(1, "a")
        + _field(2, "call_1")
        + _field(3, "shell__run")
        + _field(4, '{"a":2,"b":1}')
    ).hexdigest()
    assert assistant_fingerprint(items) == expected
    assert assistant_fingerprint(items[:2]) == ""


def test_namespaces_keep_tools_apart() -> None:
    def call(namespace: str | None) -> list[dict[str, Any]]:
        item = {"type": "function_call", "call_id": "c", "name": "run", "arguments": "{}"}
        return [item | ({"namespace": namespace} if namespace else {})]

    prints = {assistant_fingerprint(call(ns)) for ns in (None, "a", "b")}
    assert len(prints) == 3


def test_chat_and_anthropic_tool_calls_fingerprint_alike() -> None:
    chat = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "t1", "function": {"name": "f", "arguments": '{"x": 1}'}}],
    }
    anthropic = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}],
    }
    assert assistant_fingerprint([chat]) == assistant_fingerprint([anthropic])


def test_conversation_digest_bytes_and_system_by_position() -> None:
    items = [
        {"role": "system", "content": "secret"},
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "function_call_output", "call_id": "c1", "output": {"ok": True}},
    ]
    expected = hashlib.sha256(
        b"nemo-gym-lineage-context"
        + _field(0, "system")
        + _field(0, "user")
        + _field(1, "text")
        + _field(2, "q")
        + _field(0, "function_call_output")
        + _field(6, "c1")
        + _field(7, '{"ok":true}')
    ).hexdigest()
    assert conversation_digest(items) == expected
    other = [{"role": "system", "content": "other"}, *items[1:]]
    assert conversation_digest(other) == expected


def test_a_content_block_without_type_is_an_error() -> None:
    with pytest.raises(ValueError, match="without a type"):
        assistant_fingerprint([{"role": "assistant", "content": [{"text": "x"}]}])


def test_lineage_request_items_prepends_the_envelope() -> None:
    body = {"input": [{"role": "user", "content": "q"}], "instructions": "be kind"}
    items = lineage_request_items(body)
    assert items[0] == {
        "role": "_ng_request_envelope",
        "content": '{"instructions": "be kind", "tools": null}',
    }
    assert items[1:] == body["input"]
    assert lineage_request_items({"messages": []}) == []
