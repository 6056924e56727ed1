"""The consumer: freeze, build and project one rollout (reference §11.7 and the consumer part
of §12.4)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from capture_core.tokens import (
    NO_RECORDS_ERROR,
    PER_REQUEST_ERROR,
    SnapshotRef,
    TokenCaptureSnapshot,
    TokenCaptureStore,
    TokenEntry,
    assemble,
    canonical_line,
    check_prefix_contiguity,
    trajectories_for_rollout,
    trajectories_from_source,
)
from capture_core.tokens import consumer as consumer_module
from tests.capture_core.tokens.entries import entry, three_turns
from tests.capture_core.tokens.sinks import FakeSource


@pytest.fixture
def store(tmp_path: Path) -> TokenCaptureStore:
    return TokenCaptureStore(tmp_path, create=True)


def _fill(store: TokenCaptureStore, entries: list[TokenEntry]) -> None:
    for one in entries:
        store.append(one)


def _snapshot(entries: list[TokenEntry], *, incomplete: bool = False) -> TokenCaptureSnapshot:
    return TokenCaptureSnapshot("r1", tuple(entries), incomplete, "snap-1", 4)


# --- the local consumer -----------------------------------------------------------------------


def test_the_local_consumer_builds_three_contiguous_items(store: TokenCaptureStore) -> None:
    _fill(store, three_turns())
    build = trajectories_for_rollout("r1", [store.root], model="policy")
    assert build is not None
    assert not build.mask_sample
    assert build.rebuilt_response is not None
    assert len(build.rebuilt_response["output"]) == 3
    assert build.rebuilt_response["model"] == "policy"
    check_prefix_contiguity(build.rebuilt_response)
    snapshot = store.freeze_now("r1")  # the consumer froze it: same snapshot
    assert build.snapshot == SnapshotRef(snapshot.snapshot_id, snapshot.version)
    assert build.can_retire
    assert build.metrics.to_record() == {
        "n_calls": 3, "chains": 1, "roots": 1, "quarantined_calls": 0,
        "quarantined_fraction": 0.0, "delivered_fraction": 1.0,
        "generated_tokens_captured": 5, "generated_tokens_delivered": 5,
        "empty_generation_calls": 0,
    }  # fmt: skip


def test_no_dirs_gives_none_and_a_missing_rollout_is_masked(store: TokenCaptureStore) -> None:
    assert trajectories_for_rollout("r1", []) is None
    build = trajectories_for_rollout("never", [store.root])
    assert build is not None
    assert build.mask_sample
    assert build.error == NO_RECORDS_ERROR
    assert build.rebuilt_response is None
    assert not build.can_retire


def test_a_malformed_capture_is_masked_with_its_validation_error(store: TokenCaptureStore) -> None:
    bad = orjson.loads(canonical_line(entry("c1", [1], [2, 3])))
    bad["generation_log_probs"] = [-0.1]
    store.path_for("r1").write_bytes(orjson.dumps(bad) + b"\n")
    build = trajectories_for_rollout("r1", [store.root])
    assert build is not None
    assert build.mask_sample
    assert build.error is not None
    assert "ValidationError" in build.error
    assert build.snapshot is None  # the freeze failed: nothing to retire
    assert store.path_for("r1").exists()  # the evidence is kept


def test_an_incomplete_capture_is_masked(store: TokenCaptureStore) -> None:
    _fill(store, three_turns())
    store.mark_incomplete_now("r1", "lost-call")
    build = trajectories_for_rollout("r1", [store.root])
    assert build is not None
    assert build.mask_sample
    assert build.metrics.capture_incomplete is True
    assert build.rebuilt_response is not None  # rebuilt, but not to be trained on
    assert build.mask_reasons == ["capture_incomplete"]
    assert not build.can_retire


def test_a_clean_rollout_is_unmasked(store: TokenCaptureStore) -> None:
    _fill(store, three_turns())
    build = trajectories_for_rollout("r1", [store.root])
    assert build is not None
    assert (build.mask_sample, build.metrics.delivered_fraction) == (False, 1.0)
    assert build.metrics.quarantined_calls == 0
    assert build.mask_reasons == []


def test_ambiguous_retry_evidence_is_masked_without_a_response(store: TokenCaptureStore) -> None:
    _fill(store, [entry("c1", [1, 2], [3]), entry("c2a", [1, 2, 3, 4], [5]),
                  entry("c2b", [1, 2, 3, 4], [5]), entry("c3", [1, 2, 3, 4, 5, 6], [7])])  # fmt: skip
    build = trajectories_for_rollout("r1", [store.root])
    assert build is not None
    assert build.mask_sample
    assert build.rebuilt_response is None
    assert build.error is not None
    assert "no safe trainable chain" in build.error


def test_unresolved_retries_are_masked(store: TokenCaptureStore) -> None:
    _fill(store, [entry("c1", [1, 2], [3]), entry("c2a", [1, 2, 3, 4], [5]),
                  entry("c2b", [1, 2, 3, 4], [6])])  # fmt: skip
    build = trajectories_for_rollout("r1", [store.root])
    assert build is not None
    assert build.mask_sample
    assert build.unresolved_retries == ["c2a", "c2b"]
    assert build.mask_reasons == ["unresolved_parent_calls"]


def test_only_empty_generations_are_masked(store: TokenCaptureStore) -> None:
    _fill(store, [entry("e1", [1], []), entry("e2", [2], [])])
    build = trajectories_for_rollout("r1", [store.root])
    assert build is not None
    assert build.mask_sample
    assert build.error is not None
    assert "no safe trainable chain" in build.error


def test_multiple_roots_are_masked() -> None:
    build = assemble("r1", [entry("a", [1], [2], created_at=1.0), entry("b", [5], [6])])
    assert build.mask_sample
    assert (build.metrics.roots, build.metrics.chains) == (2, 2)
    assert build.mask_reasons == ["multiple_roots"]
    assert build.rebuilt_response is not None  # the main chain, masked


def test_per_request_is_refused_for_single_response_delivery() -> None:
    build = assemble("r1", three_turns(), builder="per_request")
    assert (build.mask_sample, build.error, build.rebuilt_response) == (
        True, PER_REQUEST_ERROR, None,
    )  # fmt: skip
    assert build.metrics.to_record() == {"n_calls": 3, "error": PER_REQUEST_ERROR}


def test_the_builder_runs_once_per_rollout(
    store: TokenCaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = consumer_module.run_builder

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(consumer_module, "run_builder", counting)
    _fill(store, three_turns())
    trajectories_for_rollout("r1", [store.root])
    assert len(calls) == 1


# --- through a TokenSource ----------------------------------------------------------------------


def test_an_external_source_passes_its_snapshot_id_and_version() -> None:
    source = FakeSource({"r1": _snapshot(three_turns())})
    build = asyncio.run(trajectories_from_source("r1", source))
    assert build.snapshot == SnapshotRef("snap-1", 4)
    assert not build.mask_sample
    assert source.freezes == ["r1"]


def test_assembly_runs_off_the_event_loop_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    real = consumer_module.assemble

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(consumer_module, "assemble", recording)
    source = FakeSource({"r1": _snapshot(three_turns())})
    asyncio.run(trajectories_from_source("r1", source))
    assert source.freeze_threads and threads
    assert threads[0] != source.freeze_threads[0]  # freeze on the loop, assembly in a worker


@pytest.mark.parametrize(
    ("snapshot", "reason"),
    [(_snapshot(three_turns(), incomplete=True), "capture_incomplete"),
     (_snapshot([]), NO_RECORDS_ERROR)],
)  # fmt: skip
def test_an_external_snapshot_that_cannot_train_is_masked(
    snapshot: TokenCaptureSnapshot, reason: str
) -> None:
    build = asyncio.run(trajectories_from_source("r1", FakeSource({"r1": snapshot})))
    assert build.mask_sample
    assert reason in build.mask_reasons
    assert build.snapshot == SnapshotRef("snap-1", 4)


def test_a_source_error_propagates_to_the_caller() -> None:
    with pytest.raises(ConnectionError):
        asyncio.run(trajectories_from_source("r1", FakeSource({}, fail=True)))
