"""Delivery around each rollout: finalize, retire, clear, and the run-level mask-fraction abort
(reference §11.8 and the delivery part of §12.5)."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from capture_core.exceptions import (
    CaptureDirNotFoundError,
    InvalidRolloutIdError,
    MaskFractionExceededError,
    TokenCaptureConfigError,
)
from capture_core.tokens import (
    MASK_SAMPLE_KEY,
    TOKEN_CAPTURE_KEY,
    TokenCaptureStore,
    TokenDelivery,
    TokenIdCaptureConfig,
    TokenSource,
    capture_build_can_retire,
    clear_token_captures_for_rollouts,
    finalize_rollout_token_capture,
    install_token_source,
    retire_rollout_token_capture,
    rollout_carries_token_ids,
)
from tests.capture_core.tokens.entries import entry, three_turns
from tests.capture_core.tokens.sinks import FakeSource


@pytest.fixture
def store(tmp_path: Path) -> TokenCaptureStore:
    return TokenCaptureStore(tmp_path / "tokens", create=True)


@pytest.fixture(autouse=True)
def _no_installed_source() -> Iterator[None]:
    install_token_source(None)
    yield
    install_token_source(None)


def _result(**extra: Any) -> dict[str, Any]:
    """A rollout record as an agent returns it: the last response has no token ids."""
    return {
        "reward": 1.0,
        "task": "t",
        "response": {"id": "resp_9", "model": "policy", "output": [
            {"type": "message", "content": [{"type": "output_text", "text": "final"}]}
        ]},
        **extra,
    }  # fmt: skip


def _native_result() -> dict[str, Any]:
    result = _result()
    result["response"]["output"][0].update(
        prompt_token_ids=[1], generation_token_ids=[2], generation_log_probs=[-0.1]
    )
    return result


def _finalize(result: dict[str, Any], source: TokenSource | None, rid: str | None) -> Any:
    return asyncio.run(finalize_rollout_token_capture(result, source, rollout_id=rid))


def _retire(rid: str, source: TokenSource | None, build: Any) -> bool:
    return asyncio.run(retire_rollout_token_capture(rid, source, build))


# --- finalize and retire ------------------------------------------------------------------------


def test_a_rollout_without_ids_is_rebuilt_and_retired_after_delivery(
    store: TokenCaptureStore,
) -> None:
    for one in three_turns():
        store.append(one)
    result = _result()
    build = _finalize(result, store, "r1")
    assert result["reward"] == 1.0 and result["task"] == "t"
    assert result["response"]["id"] == "resp_9"  # only output is replaced
    output = result["response"]["output"]
    assert [item["generation_token_ids"] for item in output] == [[10, 11], [12], [13, 14]]
    assert result[TOKEN_CAPTURE_KEY]["delivered_fraction"] == 1.0
    assert MASK_SAMPLE_KEY not in result  # a healthy rollout has no mask_sample key
    assert capture_build_can_retire(build)
    assert [e.model_call_id for e in store.read_entries("r1")] == ["c1", "c2", "c3"]  # kept ...
    assert _retire("r1", store, build)  # ... until the result is durable and it is retired
    assert store.state("r1").retired
    assert not store.path_for("r1").exists()


def test_a_response_that_is_not_an_object_is_replaced_whole(store: TokenCaptureStore) -> None:
    for one in three_turns():
        store.append(one)
    result = _result(response="plain text")
    _finalize(result, store, "r1")
    assert result["response"]["id"] == "proj-r1"


def test_retirement_cannot_delete_a_newer_attempt(store: TokenCaptureStore) -> None:
    for one in three_turns():
        store.append(one)
    old = _finalize(_result(), store, "r1")
    clear_token_captures_for_rollouts(["r1"], [store.root])  # re-dispatched before retirement
    store.append(entry("n1", [7], [8]))
    assert not _retire("r1", store, old)
    assert [e.model_call_id for e in store.read_entries("r1")] == ["n1"]


def test_native_ids_are_left_alone_and_the_capture_still_retired(
    store: TokenCaptureStore, caplog: pytest.LogCaptureFixture
) -> None:
    for one in three_turns():
        store.append(one)
    result = _native_result()
    before = copy.deepcopy(result)
    with caplog.at_level(logging.WARNING, "capture_core.tokens"):
        build = _finalize(result, store, "r1")
    assert caplog.text == ""
    assert result == before
    assert build.redundant and not build.mask_sample and build.rebuilt_response is None
    assert capture_build_can_retire(build)
    assert _retire("r1", store, build)
    assert _finalize(_native_result(), store, None) is None  # no id: nothing to retire


def test_native_and_rebuilt_rollouts_in_one_batch(store: TokenCaptureStore) -> None:
    for one in three_turns("a") + three_turns("b"):
        store.append(one)
    native, rebuilt = _native_result(), _result()
    builds = [_finalize(native, store, "a"), _finalize(rebuilt, store, "b")]
    assert [b.redundant for b in builds] == [True, False]
    assert len(rebuilt["response"]["output"]) == 3
    assert all(_retire(rid, store, b) for rid, b in zip(["a", "b"], builds, strict=True))


def test_a_second_finalize_changes_nothing_and_still_returns_a_snapshot(
    store: TokenCaptureStore,
) -> None:
    for one in three_turns():
        store.append(one)
    result = _result()
    first = _finalize(result, store, "r1")
    after_first = copy.deepcopy(result)
    second = _finalize(result, store, "r1")
    assert result == after_first
    assert second.snapshot == first.snapshot


def test_no_source_gives_none(store: TokenCaptureStore) -> None:
    result = _result()
    assert _finalize(result, None, "r1") is None
    assert result == _result()
    assert not _retire("r1", None, None)


def test_an_incomplete_capture_is_flagged_at_the_top_level(store: TokenCaptureStore) -> None:
    for one in three_turns():
        store.append(one)
    store.mark_incomplete_now("r1", "lost")
    result = _result()
    build = _finalize(result, store, "r1")
    assert result[MASK_SAMPLE_KEY] is True
    assert result[TOKEN_CAPTURE_KEY]["capture_incomplete"] is True
    assert MASK_SAMPLE_KEY not in result[TOKEN_CAPTURE_KEY]
    assert not capture_build_can_retire(build)
    assert not _retire("r1", store, build)
    assert store.read_entries("r1")  # evidence kept


def test_a_failed_build_keeps_its_records(store: TokenCaptureStore) -> None:
    line = orjson.loads(orjson.dumps(entry("c1", [1], [2, 3]).model_dump()))
    line["generation_log_probs"] = [-0.1]
    store.path_for("r1").write_bytes(orjson.dumps(line) + b"\n")
    result = _result()
    build = _finalize(result, store, "r1")
    assert result[MASK_SAMPLE_KEY] is True
    assert "ValidationError" in result[TOKEN_CAPTURE_KEY]["error"]
    assert not _retire("r1", store, build)
    assert store.path_for("r1").exists()


@pytest.mark.parametrize(
    ("rid", "error"),
    [(None, "no capture key"), ("empty-one", "capture contains no token records"),
     ("../escape", "malformed rollout id: '../escape'")],
)  # fmt: skip
def test_rollouts_that_cannot_be_built_are_masked(
    store: TokenCaptureStore, rid: str | None, error: str
) -> None:
    result = _result()
    build = _finalize(result, store, rid)
    assert result[MASK_SAMPLE_KEY] is True
    assert result[TOKEN_CAPTURE_KEY] == {"n_calls": 0, "error": error}
    assert build.error == error
    assert result["response"] == _result()["response"]


def test_a_source_that_raises_loses_only_that_rollout(store: TokenCaptureStore) -> None:
    bad, good = _result(), _result()
    _finalize(bad, FakeSource({}, fail=True), "r1")
    assert bad[MASK_SAMPLE_KEY] is True
    assert bad[TOKEN_CAPTURE_KEY]["error"] == "ConnectionError: token source unreachable"
    for one in three_turns():
        store.append(one)
    _finalize(good, store, "r1")
    assert MASK_SAMPLE_KEY not in good


def test_a_retirement_that_raises_is_logged_and_false(
    store: TokenCaptureStore, caplog: pytest.LogCaptureFixture
) -> None:
    class Failing(FakeSource):
        async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
            raise OSError("disk gone")

    for one in three_turns():
        store.append(one)
    build = _finalize(_result(), store, "r1")
    with caplog.at_level(logging.WARNING, "capture_core.tokens"):
        assert not _retire("r1", Failing({}), build)
    assert "disk gone" in caplog.text


@pytest.mark.parametrize(
    ("result", "expected"),
    [({"response": {"output": [{"generation_token_ids": [1]}]}}, True),
     ({"response": {"output": [{"generation_token_ids": []}]}}, False),
     ({"response": {"output": [{"content": "x"}]}}, False), ({"response": {}}, False),
     ({"response": None}, False), ({}, False)],
)  # fmt: skip
def test_rollout_carries_token_ids(result: dict[str, Any], expected: bool) -> None:
    assert rollout_carries_token_ids(result) is expected


# --- clearing before dispatch -------------------------------------------------------------------


def test_clearing_removes_only_the_listed_ids_fences_included(store: TokenCaptureStore) -> None:
    for rid in ("a", "b", "keep"):
        store.append(entry("c1", [1], [2], rollout=rid))
    snapshot = store.freeze_now("b")
    store.drop_now("b", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    store.mark_incomplete_now("a")
    assert clear_token_captures_for_rollouts(["a", "b", "never"], [store.root]) == 2
    store.append(entry("c2", [1], [2], rollout="b"))  # the fence is gone
    assert not store.is_incomplete("a")
    assert store.read_entries("a") == []
    assert [e.model_call_id for e in store.read_entries("keep")] == ["c1"]
    assert clear_token_captures_for_rollouts(["a"], []) == 0


def test_clearing_refuses_bad_ids_first_and_a_missing_directory(
    store: TokenCaptureStore, tmp_path: Path
) -> None:
    store.append(entry("c1", [1], [2], rollout="a"))
    with pytest.raises(InvalidRolloutIdError):
        clear_token_captures_for_rollouts(["a", "../x"], [store.root])
    assert store.read_entries("a")  # nothing was deleted
    with pytest.raises(CaptureDirNotFoundError):
        clear_token_captures_for_rollouts(["a"], [tmp_path / "typo"])
    assert not (tmp_path / "typo").exists()
    with pytest.raises(TypeError):
        clear_token_captures_for_rollouts("a", [store.root])


# --- TokenDelivery ---------------------------------------------------------------------------


def _config(store: TokenCaptureStore | None, **block: Any) -> TokenIdCaptureConfig:
    settings = {"enabled": True, **block}
    if store is not None:
        settings["dir"] = str(store.root)
    return TokenIdCaptureConfig.from_global_config({"token_id_capture": settings})


def test_delivery_refuses_to_dispatch_without_a_source() -> None:
    config = _config(None, sink="tests.capture_core.tokens.sinks:RecordingSink")
    with TokenDelivery(config) as delivery:
        assert delivery.source is None
        with pytest.raises(TokenCaptureConfigError, match="requires a TokenSource"):
            delivery.prepare(["0-0"])
        assert delivery.prepare([]) == 0  # nothing participates: nothing to refuse


def test_delivery_over_a_run(store: TokenCaptureStore) -> None:
    for rid in ("0-0", "1-0"):
        store.append(entry("stale", [9], [9], rollout=rid))  # an earlier attempt's capture
    with TokenDelivery(_config(store)) as delivery:
        assert delivery.prepare(["0-0", "1-0"]) == 2
        for rid in ("0-0", "1-0"):  # the model server records the new attempts
            for one in three_turns(rid):
                store.append(one)
        store.mark_incomplete_now("1-0", "lost")
        results = {rid: _result() for rid in ("0-0", "1-0")}
        builds = {rid: delivery.finalize(results[rid], rid) for rid in results}
        # ... each result line is written and fsynced, then:
        assert delivery.retire("0-0", builds["0-0"])
        assert not delivery.retire("1-0", builds["1-0"])  # masked: evidence kept
        summary = delivery.summary()
    assert (summary.finalized, summary.masked, summary.retired, summary.kept) == (2, 1, 1, 0)
    assert summary.reasons == {"capture_incomplete": 1}
    assert summary.masked_fraction == 0.5
    assert store.state("0-0").retired
    assert [e.model_call_id for e in store.read_entries("1-0")] == ["c1", "c2", "c3"]


def test_delivery_aborts_when_too_many_finalized_rollouts_are_masked(
    store: TokenCaptureStore,
) -> None:
    config = _config(store, max_mask_fraction=0.5, mask_fraction_min_samples=4)
    with TokenDelivery(config) as delivery:
        for rid in ("ok-0", "ok-1"):
            for one in three_turns(rid):
                store.append(one)
        outcomes = []
        for rid in ("bad-0", "ok-0", "bad-1", "ok-1", "bad-2"):  # "bad": nothing recorded
            delivery.finalize(_result(), rid)
            try:
                delivery.check_mask_fraction()
                outcomes.append("go")
            except MaskFractionExceededError as exc:
                outcomes.append("abort")
                error = exc
    # 1/1, 1/2, 2/3 are below the minimum of 4 finalized; 2/4 = 0.5 is not above 0.5.
    assert outcomes == ["go", "go", "go", "go", "abort"]
    assert (error.masked, error.finalized, error.limit) == (3, 5, 0.5)
    assert error.reasons == {"capture contains no token records": 3}
    assert "3 of 5 finalized rollouts were masked" in str(error)


def test_delivery_without_a_limit_never_aborts(store: TokenCaptureStore) -> None:
    with TokenDelivery(_config(store)) as delivery:
        for n in range(3):
            delivery.finalize(_result(), f"bad-{n}")
        delivery.check_mask_fraction()
        assert delivery.summary().masked == 3


def test_delivery_is_off_without_rebuilding(store: TokenCaptureStore) -> None:
    for one in three_turns():
        store.append(one)
    with TokenDelivery(_config(store, rebuild_response=False)) as delivery:
        assert not delivery.active
        assert delivery.prepare(["r1"]) == 1  # captures are still cleared before dispatch
        result = _result()
        assert delivery.finalize(result, "r1") is None
        assert result == _result()


def test_delivery_closes_only_a_source_it_created(
    store: TokenCaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []

    async def close(self: TokenCaptureStore) -> None:
        closed.append(str(self.root))

    monkeypatch.setattr(TokenCaptureStore, "close", close)
    with TokenDelivery(_config(store)) as delivery:
        delivery.finalize(_result(), "r1")
    assert closed == [str(store.root)]
    given = FakeSource({})
    install_token_source(given)
    with TokenDelivery(_config(store)) as delivery:
        assert delivery.source is given
        delivery.finalize(_result(), "r1")
    with TokenDelivery(_config(store), source=FakeSource({})) as delivery:
        delivery.close()  # idempotent
    assert not given.closed
    assert closed == [str(store.root)]


def test_delivery_from_many_collector_threads(store: TokenCaptureStore) -> None:
    rids = [f"{n}-0" for n in range(24)]
    for rid in rids:
        for one in three_turns(rid):
            store.append(one)

    with TokenDelivery(_config(store)) as delivery:

        def one(rid: str) -> bool:
            result = _result()
            build = delivery.finalize(result, rid)
            return len(result["response"]["output"]) == 3 and delivery.retire(rid, build)

        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(one, rids))
        summary = delivery.summary()
    assert (summary.finalized, summary.masked, summary.retired) == (24, 0, 24)
    assert all(store.state(rid).retired for rid in rids)
