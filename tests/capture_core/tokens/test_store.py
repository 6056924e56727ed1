"""TokenCaptureStore in one process: files, index, intents, freeze, the drop fence, delete, sweep
(reference §11.5 and the store part of §12.3)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path

import orjson
import pytest

from capture_core.exceptions import (
    CaptureDirNotFoundError,
    CaptureStoreError,
    InvalidRecordError,
    InvalidRolloutIdError,
    RolloutRetiredError,
    TokenCaptureFrozenError,
    TokenCaptureRetiredError,
    TokenEntryConflictError,
    TokenStoreDamagedError,
)
from capture_core.tokens import (
    ENTRIES_SUFFIX,
    INCOMPLETE_SUFFIX,
    INTENTS_SUFFIX,
    LOCK_SUFFIX,
    STATE_SUFFIX,
    CallIntentSink,
    TokenCaptureStore,
    TokenEntry,
    TokenSink,
    TokenSource,
    canonical_line,
    entry_digest,
)
from capture_core.tokens import directory as directory_module
from capture_core.tokens import state as state_module
from tests.capture_core.tokens.entries import entry


@pytest.fixture
def store(tmp_path: Path) -> TokenCaptureStore:
    return TokenCaptureStore(tmp_path / "tokens", create=True)


def _ids(entries: list[TokenEntry] | tuple[TokenEntry, ...]) -> list[str]:
    return [e.model_call_id for e in entries]


def _state_json(store: TokenCaptureStore, rid: str = "r1") -> dict[str, object]:
    data = orjson.loads(store.path_for(rid, STATE_SUFFIX).read_bytes())
    assert isinstance(data, dict)
    return data


# --- files, round trip, protocols -----------------------------------------------------------


def test_round_trip_in_order_and_an_unknown_rollout_is_empty(store: TokenCaptureStore) -> None:
    first, second = entry("c1", [1], [2]), entry("c2", [1, 2, 3], [4])
    store.append(first)
    store.append(second)
    assert store.read_entries("r1") == [first, second]
    assert store.read_entries("never") == []
    lines = store.path_for("r1").read_bytes().splitlines()
    assert lines == [canonical_line(first), canonical_line(second)]


def test_state_file_is_sorted_key_json_with_the_digest_index(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    raw = store.path_for("r1", STATE_SUFFIX).read_bytes()
    assert raw.endswith(b"\n")
    state = orjson.loads(raw)
    assert list(state) == sorted(state)
    assert state == {
        "entry_digests": {"c1": entry_digest(canonical_line(entry("c1", [1], [2])))},
        "frozen": False, "incomplete": False, "indexed_size": store.path_for("r1").stat().st_size,
        "retired": False, "snapshot_id": "", "version": 1,
    }  # fmt: skip


def test_the_store_is_a_sink_a_source_and_takes_intents(store: TokenCaptureStore) -> None:
    assert isinstance(store, TokenSink)
    assert isinstance(store, TokenSource)
    assert isinstance(store, CallIntentSink)


def test_a_record_is_readable_by_freeze_right_after_put(store: TokenCaptureStore) -> None:
    async def go() -> list[str]:
        await store.put(entry("c1", [1], [2]))
        return _ids((await store.freeze("r1")).entries)

    assert asyncio.run(go()) == ["c1"]


@pytest.mark.parametrize("bad", ["", "a/b", "../a", "a b", "röllout", ".hidden", "a..b"])
def test_unsafe_rollout_ids_are_refused_before_any_file(store: TokenCaptureStore, bad: str) -> None:
    with pytest.raises(InvalidRolloutIdError):
        store.append(entry("c1", [1], [2], rollout=bad))
    for call in (store.freeze_now, store.read_entries, store.delete, store.is_incomplete):
        with pytest.raises(InvalidRolloutIdError):
            call(bad)
    assert list(store.root.iterdir()) == []


@pytest.mark.parametrize("bad", ["", "a b", "a\nb", "x" * 257, "tab\there"])
def test_call_ids_that_cannot_key_a_line_are_refused(store: TokenCaptureStore, bad: str) -> None:
    with pytest.raises(InvalidRecordError):
        store.append(entry(bad, [1], [2]))
    with pytest.raises(InvalidRecordError):
        store.begin_call_now("r1", bad)


def test_a_mutated_invalid_entry_is_refused_before_writing(store: TokenCaptureStore) -> None:
    """Stricter than upstream, which writes it and then fails every freeze of the rollout."""
    bad = entry("c1", [1], [2, 3])
    bad.generation_log_probs = [-0.1]  # validate_assignment is off
    with pytest.raises(ValueError, match="same length"):
        store.append(bad)
    assert not store.path_for("r1").exists()


# --- idempotency, conflicts, the digest index ----------------------------------------------------


def test_put_is_idempotent(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    store.append(entry("c1", [1], [2]))
    assert _ids(store.read_entries("r1")) == ["c1"]
    assert store.state("r1").version == 1


def test_a_conflicting_payload_raises_marks_incomplete_and_keeps_the_first(
    store: TokenCaptureStore,
) -> None:
    store.append(entry("c1", [1], [2]))
    with pytest.raises(TokenEntryConflictError, match="reused with a different payload") as info:
        store.append(entry("c1", [1], [3]))
    assert (info.value.rollout_id, info.value.model_call_id, info.value.durable) == (
        "r1",
        "c1",
        False,
    )
    assert store.is_incomplete("r1")
    assert [e.generation_token_ids for e in store.read_entries("r1")] == [[2]]
    assert store.path_for("r1", INCOMPLETE_SUFFIX).read_text() == "c1\n"
    assert store.freeze_now("r1").incomplete


def test_an_append_uses_the_digest_index_not_a_rescan(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    path = store.path_for("r1")
    size = path.stat().st_size
    path.write_bytes(b"#" * (size - 1) + b"\n")  # the indexed line, unreadable, same length
    store.append(entry("c2", [1], [3]))  # never looks at the indexed bytes
    store.append(entry("c1", [1], [2]))  # a no-op by digest
    assert set(store.state("r1").entry_digests) == {"c1", "c2"}
    with pytest.raises(TokenStoreDamagedError, match="not JSON"):
        store.read_entries("r1")


def test_an_unindexed_durable_tail_is_adopted(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    version = store.state("r1").version
    line = canonical_line(entry("c2", [1, 2], [3]))
    with store.path_for("r1").open("ab") as file:
        file.write(line + b"\n")
    store.append(entry("c3", [1, 2, 3], [4]))
    state = store.state("r1")
    assert state.indexed_size == store.path_for("r1").stat().st_size
    assert state.entry_digests["c2"] == entry_digest(line)
    assert state.version == version + 2  # one recovered, one appended
    assert _ids(store.read_entries("r1")) == ["c1", "c2", "c3"]


def test_state_lag_is_recovered_from_the_tail(store: TokenCaptureStore, tmp_path: Path) -> None:
    store.append(entry("c1", [1], [2]))
    older = tmp_path / "older-state.json"
    shutil.copy(store.path_for("r1", STATE_SUFFIX), older)
    store.append(entry("c2", [1, 2, 3], [4]))
    shutil.copy(older, store.path_for("r1", STATE_SUFFIX))  # the un-fsynced state was lost
    assert store.state("r1").entry_digests.keys() == {"c1"}
    snapshot = store.freeze_now("r1")
    assert _ids(snapshot.entries) == ["c1", "c2"]
    assert not snapshot.incomplete
    assert store.state("r1").entry_digests.keys() == {"c1", "c2"}


def test_conflicting_durable_payloads_in_the_tail_are_refused(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    with store.path_for("r1").open("ab") as file:
        file.write(canonical_line(entry("c1", [1], [9])) + b"\n")
    with pytest.raises(TokenEntryConflictError, match="conflicting durable payloads"):
        store.freeze_now("r1")
    assert store.is_incomplete("r1")
    assert not store.state("r1").frozen


def test_a_legacy_state_without_index_is_rebuilt(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    store.append(entry("c2", [1, 2, 3], [4]))
    store.path_for("r1", STATE_SUFFIX).write_bytes(
        orjson.dumps({"frozen": False, "incomplete": False, "snapshot_id": "", "version": 7})
    )
    snapshot = store.freeze_now("r1")
    assert _ids(snapshot.entries) == ["c1", "c2"]
    assert snapshot.version == 8  # the freeze only: recovered lines of a legacy state don't count
    assert store.state("r1").entry_digests.keys() == {"c1", "c2"}


def test_an_index_beyond_the_file_is_refused(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    store.path_for("r1").write_bytes(b"")
    with pytest.raises(TokenStoreDamagedError, match="Invalid token-capture index offset"):
        store.append(entry("c2", [1], [2]))


@pytest.mark.parametrize(
    "content",
    [b'{"not": "an entry"}\n', b"[1, 2]\n", b"{oops\n", b"{oops\n" + b"{}\n"],
    ids=["not-an-entry", "not-an-object", "garbage-last", "garbage-middle"],
)
def test_a_damaged_line_is_refused_not_skipped(store: TokenCaptureStore, content: bytes) -> None:
    """A newline-terminated line no writer of the store could have left is damage, even when
    it is the last line (upstream cuts a last unreadable line: ours are never torn that way)."""
    store.path_for("r1").write_bytes(canonical_line(entry("c1", [1], [2])) + b"\n" + content)
    with pytest.raises(TokenStoreDamagedError):
        store.read_entries("r1")
    with pytest.raises(TokenStoreDamagedError):
        store.freeze_now("r1")
    with pytest.raises(TokenStoreDamagedError):
        store.append(entry("c2", [1], [2]))


def test_a_newer_schema_line_makes_reads_raise(store: TokenCaptureStore) -> None:
    newer = {**orjson.loads(canonical_line(entry("c1", [1], [2]))), "schema_version": 2}
    store.path_for("r1").write_bytes(orjson.dumps(newer) + b"\n")
    with pytest.raises(TokenStoreDamagedError, match=r"ValidationError.*newer than this reader"):
        store.read_entries("r1")


def test_blank_lines_are_skipped(store: TokenCaptureStore) -> None:
    line = canonical_line(entry("c1", [1], [2]))
    store.path_for("r1").write_bytes(b"\n  \n" + line + b"\n\t\r\n")
    assert _ids(store.read_entries("r1")) == ["c1"]
    store.append(entry("c2", [1], [3]))
    assert _ids(store.freeze_now("r1").entries) == ["c1", "c2"]


def test_a_damaged_state_file_is_refused_not_reset(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    store.path_for("r1", STATE_SUFFIX).write_bytes(b'{"retired": tru')
    with pytest.raises(TokenStoreDamagedError, match="not JSON"):
        store.append(entry("c2", [1], [2]))
    store.path_for("r1", STATE_SUFFIX).write_bytes(b'{"retired": "yes"}')
    with pytest.raises(TokenStoreDamagedError, match="retired"):
        store.freeze_now("r1")


def test_a_failed_index_write_after_a_durable_line_does_not_fail_the_put(
    store: TokenCaptureStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = state_module.write_state

    def flaky(path: Path, state: state_module.TokenCaptureState, *, durable: bool) -> None:
        if not durable:
            raise OSError(28, "No space left on device")
        real(path, state, durable=durable)

    monkeypatch.setattr("capture_core.tokens.store.write_state", flaky)
    with caplog.at_level(logging.WARNING, "capture_core.tokens"):
        store.append(entry("c1", [1], [2]))
    assert "re-indexes" in caplog.text
    monkeypatch.undo()
    assert _ids(store.freeze_now("r1").entries) == ["c1"]


def test_a_state_write_cut_short_leaves_the_old_state_whole(
    store: TokenCaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state is written to a temporary and renamed: a writer that dies mid-write (here:
    the write fails after half the bytes) leaves the previous state, never half of one."""
    store.append(entry("c1", [1], [2]))
    before = store.path_for("r1", STATE_SUFFIX).read_bytes()

    def half(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(state_module, "write_all", half)
    with pytest.raises(OSError, match="Input/output error"):
        store.freeze_now("r1")  # a durable write
    assert store.path_for("r1", STATE_SUFFIX).read_bytes() == before
    assert not [p for p in store.root.iterdir() if p.name.startswith(".tokens-state-")]
    monkeypatch.undo()
    assert not store.state("r1").frozen
    assert _ids(store.freeze_now("r1").entries) == ["c1"]


# --- torn tails ------------------------------------------------------------------------------


def test_a_torn_tail_is_cut_by_the_next_writer_with_a_warning(
    store: TokenCaptureStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.append(entry("c1", [1], [2]))
    whole = store.path_for("r1").read_bytes()
    torn = canonical_line(entry("c2", [1, 2], [3]))[:25]
    store.path_for("r1").write_bytes(whole + torn)
    with caplog.at_level(logging.WARNING, "capture_core.tokens"):
        assert _ids(store.read_entries("r1")) == ["c1"]  # a reader skips it
        assert "skipped a torn last line (25 bytes" in caplog.text
        assert store.path_for("r1").read_bytes() == whole + torn  # ... and changes nothing
        caplog.clear()
        store.append(entry("c3", [1], [4]))
        assert "cut a torn token entry line (25 bytes" in caplog.text
    assert (
        store.path_for("r1").read_bytes() == whole + canonical_line(entry("c3", [1], [4])) + b"\n"
    )
    assert _ids(store.freeze_now("r1").entries) == ["c1", "c3"]


def test_a_whole_object_without_its_newline_is_torn_too(store: TokenCaptureStore) -> None:
    """It was never acknowledged (the newline is part of the one write); upstream adopts it
    and the next append glues onto it."""
    store.append(entry("c1", [1], [2]))
    with store.path_for("r1").open("ab") as file:
        file.write(canonical_line(entry("c2", [1], [3])))
    snapshot = store.freeze_now("r1")
    assert _ids(snapshot.entries) == ["c1"]
    assert store.path_for("r1").read_bytes().endswith(b"\n")


# --- intents and incomplete marks ---------------------------------------------------------------


def test_a_dangling_intent_makes_the_snapshot_incomplete(store: TokenCaptureStore) -> None:
    store.begin_call_now("r1", "c1")
    store.begin_call_now("r1", "c2")
    store.append(entry("c1", [1], [2]))
    assert not store.is_incomplete("r1")  # intents are not consulted
    assert store.freeze_now("r1").incomplete


def test_a_committed_call_satisfies_its_intent(store: TokenCaptureStore) -> None:
    async def go() -> bool:
        await store.begin_call("r1", "c1")
        await store.put(entry("c1", [1], [2]))
        return (await store.freeze("r1")).incomplete

    assert asyncio.run(go()) is False
    assert store.path_for("r1", INTENTS_SUFFIX).read_text() == "c1\n"


def test_a_torn_intent_is_ignored_and_cut(store: TokenCaptureStore) -> None:
    store.begin_call_now("r1", "c1")
    with store.path_for("r1", INTENTS_SUFFIX).open("ab") as file:
        file.write(b"dead-cal")  # a begin_call killed mid-write: never acknowledged
    store.begin_call_now("r1", "c2")
    assert store.path_for("r1", INTENTS_SUFFIX).read_text() == "c1\nc2\n"
    store.append(entry("c1", [1], [2]))
    store.append(entry("c2", [1], [3]))
    assert not store.freeze_now("r1").incomplete


def test_a_lost_call_is_seen_by_is_incomplete(store: TokenCaptureStore) -> None:
    assert not store.is_incomplete("r1")
    asyncio.run(store.mark_incomplete("r1", "c9"))
    store.mark_incomplete_now("r1")
    assert store.is_incomplete("r1")
    assert store.path_for("r1", INCOMPLETE_SUFFIX).read_text() == "c9\n\n"
    assert not store.is_incomplete("r2")


# --- freeze, drop, retire, delete --------------------------------------------------------------


def test_freeze_is_idempotent_and_stops_writers(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    first = store.freeze_now("r1")
    assert first == store.freeze_now("r1")
    assert len(first.snapshot_id) == 32
    with pytest.raises(TokenCaptureFrozenError, match="already frozen"):
        store.append(entry("c2", [1], [3]))
    with pytest.raises(TokenCaptureFrozenError):
        store.append(entry("c1", [1], [2]))  # even an identical re-put
    with pytest.raises(TokenCaptureFrozenError):
        store.begin_call_now("r1", "c3")
    assert store.freeze_now("r1") == first


def test_freezing_an_unknown_rollout_gives_an_empty_frozen_snapshot(
    store: TokenCaptureStore,
) -> None:
    snapshot = store.freeze_now("never")
    assert (snapshot.entries, snapshot.incomplete, snapshot.version) == ((), False, 1)
    assert store.path_for("never", STATE_SUFFIX).exists()
    assert store.path_for("never", LOCK_SUFFIX).exists()


def test_the_drop_version_race_keeps_the_evidence(store: TokenCaptureStore) -> None:
    """A mark_incomplete after the freeze changes the version: the old snapshot's drop fails."""
    store.append(entry("c1", [1], [2]))
    store.append(entry("c2", [1, 2, 3], [4]))
    old = store.freeze_now("r1")
    store.mark_incomplete_now("r1", "late")  # allowed after the freeze
    assert not store.drop_now("r1", snapshot_id=old.snapshot_id, version=old.version)
    assert _ids(store.read_entries("r1")) == ["c1", "c2"]
    assert not store.state("r1").retired

    new = store.freeze_now("r1")
    assert new.incomplete
    assert (new.snapshot_id, new.version) == (old.snapshot_id, old.version + 1)
    assert store.drop_now("r1", snapshot_id=new.snapshot_id, version=new.version)

    for suffix in (ENTRIES_SUFFIX, INTENTS_SUFFIX, INCOMPLETE_SUFFIX):
        assert not store.path_for("r1", suffix).exists()
    state = _state_json(store)
    assert (state["retired"], state["frozen"], state["entry_digests"], state["indexed_size"]) == (
        True, True, {}, 0,
    )  # fmt: skip
    assert store.path_for("r1", LOCK_SUFFIX).exists()


def test_retired_writers_are_refused_until_delete(store: TokenCaptureStore) -> None:
    store.begin_call_now("r1", "c1")
    store.append(entry("c1", [1], [2]))
    snapshot = store.freeze_now("r1")
    assert store.drop_now("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)

    refusals = [
        lambda: store.append(entry("c2", [1], [3])),
        lambda: store.begin_call_now("r1", "c2"),
        lambda: store.mark_incomplete_now("r1", "c2"),
        lambda: store.freeze_now("r1"),
        lambda: store.read_entries("r1"),  # stricter: gone on purpose, never "empty"
    ]
    for refused in refusals:
        with pytest.raises(TokenCaptureRetiredError, match="is retired") as info:
            refused()
        assert isinstance(info.value, RolloutRetiredError)
        assert info.value.rollout_id == "r1"
    assert not store.path_for("r1").exists()

    assert store.delete("r1")
    store.append(entry("c2", [1], [3]))
    assert _ids(store.freeze_now("r1").entries) == ["c2"]


def test_drop_names_exactly_one_snapshot(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    assert not store.drop_now("r1", snapshot_id="", version=0)  # not frozen
    snapshot = store.freeze_now("r1")
    assert not store.drop_now("r1", snapshot_id="0" * 32, version=snapshot.version)
    assert not store.drop_now("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version - 1)
    assert not store.drop_now("r1", snapshot_id="", version=snapshot.version)
    assert _ids(store.read_entries("r1")) == ["c1"]
    assert asyncio.run(store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version))
    # Dropping the same snapshot again is still true (and changes nothing).
    assert store.drop_now("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)


def test_retirement_cannot_delete_a_newer_attempt(store: TokenCaptureStore) -> None:
    store.append(entry("c1", [1], [2]))
    old = store.freeze_now("r1")
    store.delete("r1")  # the id is dispatched again before the old snapshot was retired
    store.append(entry("c2", [5], [6]))
    assert not store.drop_now("r1", snapshot_id=old.snapshot_id, version=old.version)
    new = store.freeze_now("r1")
    assert not store.drop_now("r1", snapshot_id=old.snapshot_id, version=old.version)
    assert new.snapshot_id != old.snapshot_id
    assert _ids(store.read_entries("r1")) == ["c2"]
    assert store.drop_now("r1", snapshot_id=new.snapshot_id, version=new.version)


def test_a_drop_cut_short_is_finished_by_the_next_one(store: TokenCaptureStore) -> None:
    """The retired state is written before the files go: a crash in between leaves a fence
    (never a frozen state whose entries vanished)."""
    store.append(entry("c1", [1], [2]))
    snapshot = store.freeze_now("r1")
    saved = store.path_for("r1").read_bytes()
    assert store.drop_now("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    store.path_for("r1").write_bytes(saved)  # as if killed before the unlink
    with pytest.raises(TokenCaptureRetiredError):
        store.read_entries("r1")
    with pytest.raises(TokenCaptureRetiredError):
        store.append(entry("c2", [1], [2]))
    assert store.drop_now("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert not store.path_for("r1").exists()


def test_delete_removes_records_and_marks_and_is_idempotent(store: TokenCaptureStore) -> None:
    store.begin_call_now("r1", "c1")
    store.append(entry("c1", [1], [2]))
    store.mark_incomplete_now("r1", "c1")
    assert store.delete("r1")
    for suffix in (ENTRIES_SUFFIX, INTENTS_SUFFIX, INCOMPLETE_SUFFIX, STATE_SUFFIX):
        assert not store.path_for("r1", suffix).exists()
    assert store.path_for("r1", LOCK_SUFFIX).exists()  # one lock inode across delete
    assert not store.is_incomplete("r1")
    assert store.read_entries("r1") == []
    assert not store.delete("r1")
    assert not store.delete("never-used")


def test_a_delete_cut_short_never_lets_old_entries_into_a_new_attempt(
    store: TokenCaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries go first and the state last: a delete cut short after its first unlink leaves
    an index naming missing bytes (refused loudly), never old entries a fresh state would
    adopt as the new attempt's."""
    store.append(entry("old", [1], [2]))
    real = directory_module.unlink_if_present
    calls: list[Path] = []

    def dies_after_one(path: Path) -> bool:
        if calls:
            raise KeyboardInterrupt  # the process "dies" here
        calls.append(path)
        return real(path)

    monkeypatch.setattr(directory_module, "unlink_if_present", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        store.delete("r1")
    monkeypatch.undo()
    with pytest.raises(TokenStoreDamagedError, match="index offset"):
        store.append(entry("new", [5], [6]))
    store.delete("r1")  # running the delete again finishes it
    store.append(entry("new", [5], [6]))
    assert _ids(store.freeze_now("r1").entries) == ["new"]


# --- sweep ------------------------------------------------------------------------------------


def _retire(store: TokenCaptureStore, rid: str) -> None:
    store.append(entry("c1", [1], [2], rollout=rid))
    snapshot = store.freeze_now(rid)
    assert store.drop_now(rid, snapshot_id=snapshot.snapshot_id, version=snapshot.version)


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_sweep_removes_only_old_retired_fences(store: TokenCaptureStore) -> None:
    for rid in ("old", "recent"):
        _retire(store, rid)
    store.append(entry("c1", [1], [2], rollout="live"))
    store.append(entry("c1", [1], [2], rollout="old-live"))
    store.freeze_now("frozen")
    for rid in ("old", "old-live", "frozen"):
        _age(store.path_for(rid, STATE_SUFFIX), 7200)
    temp_old = store.root / ".tokens-state-killed"
    temp_new = store.root / ".tokens-state-writing"
    temp_old.write_bytes(b"{")
    temp_new.write_bytes(b"{")
    _age(temp_old, 2 * 3600)

    assert store.sweep_retired(3600) == 1
    assert not any(p.name.startswith("old.") for p in store.root.iterdir())
    with pytest.raises(TokenCaptureRetiredError):
        store.append(entry("c2", [1], [2], rollout="recent"))
    assert _ids(store.read_entries("live")) == ["c1"]
    assert _ids(store.read_entries("old-live")) == ["c1"]
    assert store.state("frozen").frozen
    assert not temp_old.exists()
    assert temp_new.exists()  # a live writer's temporary is never touched

    store.append(entry("c9", [1], [2], rollout="old"))  # the swept id starts fresh
    assert store.sweep_retired(0) == 1  # "recent", now past a zero cutoff
    assert temp_new.exists()  # temporaries must be an hour old whatever the cutoff


# --- construction -------------------------------------------------------------------------------


def test_the_root_is_created_only_when_asked_and_must_be_a_directory(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    with pytest.raises(CaptureDirNotFoundError, match="does not exist"):
        TokenCaptureStore(root)  # the collector's side never creates
    assert not root.exists()
    assert TokenCaptureStore(root, create=True).root == root
    assert TokenCaptureStore(root).root == root
    (tmp_path / "file").write_text("x")
    with pytest.raises(CaptureStoreError):
        TokenCaptureStore(tmp_path / "file", create=True)
    with pytest.raises(CaptureStoreError, match="not a directory"):
        TokenCaptureStore(tmp_path / "file")
