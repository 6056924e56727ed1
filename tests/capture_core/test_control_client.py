"""The control-plane clients: validation before sending, batching, merging and error mapping.

Most tests drive the async client against the real control app over ``httpx.ASGITransport``
(the fake ledger records what the server received), or against an ``httpx.MockTransport``
when a reply must be wrong on purpose; the blocking client also runs against uvicorn.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from capture_core.control_client import (
    MAX_BATCH_SIZE,
    AsyncRolloutControlClient,
    ManifestMismatchError,
    RolloutBatchError,
    RolloutControlClient,
    RolloutControlError,
)
from capture_core.exceptions import InvalidRolloutIdError, RolloutRetiredError
from capture_core.server.control import control_app
from capture_core.staging import RolloutManifest, RolloutRemoval
from tests.capture_core.server.test_control_routes import (
    TOKEN,
    FakeLedger,
    sample_manifest,
    serve,
)

BASE = "http://gym.test"
T = TypeVar("T")
Handler = Callable[[httpx.Request], httpx.Response]


def asgi_client(ledger: FakeLedger, **options: object) -> AsyncRolloutControlClient:
    transport = httpx.ASGITransport(app=control_app(ledger, token=TOKEN))
    return AsyncRolloutControlClient(BASE, TOKEN, transport=transport, **options)  # type: ignore[arg-type]


class Recorder:
    """A MockTransport handler: records requests; answers with ``answer`` (default: all absent)."""

    def __init__(self, answer: Handler | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.answer = answer

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.answer is not None:
            return self.answer(request)
        ids = json.loads(request.content)["rollout_ids"]
        return httpx.Response(200, json={"removed": [], "absent": ids})

    def batches(self) -> list[list[str]]:
        return [json.loads(request.content)["rollout_ids"] for request in self.requests]


def mock_client(recorder: Recorder, **options: object) -> AsyncRolloutControlClient:
    transport = httpx.MockTransport(recorder)
    return AsyncRolloutControlClient(BASE, TOKEN, transport=transport, **options)  # type: ignore[arg-type]


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


# --- retire / delete ---------------------------------------------------------------------


def test_10000_ids_go_in_three_batches_and_each_is_reported_once() -> None:
    ids = [f"rollout-{i}" for i in range(10_000)]
    ledger = FakeLedger({i: RolloutManifest(rollout_id=i) for i in ids[::7]})

    async def go() -> RolloutRemoval:
        async with asgi_client(ledger) as client:
            return await client.retire(ids)

    result = run(go())
    received = [batch for method, batch in ledger.calls if method == "retire"]
    assert [len(batch) for batch in received] == [4096, 4096, 1808]
    assert [i for batch in received for i in batch] == ids
    assert result.removed == ids[::7]
    assert sorted(result.removed + result.absent) == sorted(ids)
    assert len(set(result.removed + result.absent)) == 10_000
    assert ledger.fences == set(ids) and ledger.ledgers == {}


def test_duplicates_are_sent_once_and_reported_once() -> None:
    ledger = FakeLedger({"b": RolloutManifest(rollout_id="b")})
    ids = ["a", "b", "a", "c", "b", "a"]

    async def go() -> RolloutRemoval:
        async with asgi_client(ledger, batch_size=2) as client:
            return await client.delete(ids)

    result = run(go())
    assert ledger.calls == [("delete", ["a", "b"]), ("delete", ["c"])]
    assert result == RolloutRemoval(removed=["b"], absent=["a", "c"])


@pytest.mark.parametrize("bad", ["../r1", "..", "", "a/b", 7, None])
def test_an_invalid_id_raises_before_any_request(bad: object) -> None:
    recorder = Recorder()
    ids = [f"r{i}" for i in range(5000)] + [bad]
    client = mock_client(recorder)
    with pytest.raises(InvalidRolloutIdError):
        run(client.retire(ids))  # type: ignore[arg-type]
    with pytest.raises(InvalidRolloutIdError):
        run(client.manifest(bad))  # type: ignore[arg-type]
    assert recorder.requests == []


def test_a_bare_string_is_not_a_list_of_ids() -> None:
    recorder = Recorder()
    with pytest.raises(TypeError, match="got the string"):
        run(mock_client(recorder).retire("rollout-1"))
    assert recorder.requests == []


def test_an_empty_list_sends_nothing() -> None:
    recorder = Recorder()
    assert run(mock_client(recorder).delete([])) == RolloutRemoval()
    assert recorder.requests == []


def test_requests_carry_the_token_the_path_and_the_body() -> None:
    recorder = Recorder()
    run(mock_client(recorder).retire(iter(["r1", "r2"])))
    (request,) = recorder.requests
    assert request.method == "POST"
    assert str(request.url) == f"{BASE}/training-token-capture/control/rollouts/retire"
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert json.loads(request.content) == {"rollout_ids": ["r1", "r2"]}


def _fail_second(request: httpx.Request, count: list[int]) -> httpx.Response:
    count.append(1)
    ids = json.loads(request.content)["rollout_ids"]
    if len(count) == 2:
        return httpx.Response(503, text="ledger busy")
    return httpx.Response(200, json={"removed": ids, "absent": []})


def test_a_failed_batch_names_itself_and_can_be_resumed() -> None:
    count: list[int] = []
    recorder = Recorder(lambda request: _fail_second(request, count))
    ids = [f"r{i}" for i in range(10)]
    client = mock_client(recorder, batch_size=4)
    with pytest.raises(RolloutBatchError) as caught:
        run(client.retire(ids))
    error = caught.value
    assert (error.action, error.batch_index, error.batch_count) == ("retire", 2, 3)
    assert error.rollout_ids == tuple(ids[4:8])
    assert error.completed == RolloutRemoval(removed=ids[:4])
    assert error.remaining == tuple(ids[4:])
    assert error.status_code == 503 and error.body == "ledger busy"
    assert "retire batch 2 of 3" in str(error) and "HTTP 503 ledger busy" in str(error)
    assert recorder.batches() == [ids[:4], ids[4:8]]  # batch 3 was not attempted
    resumed = run(client.retire(error.remaining))
    assert recorder.batches()[2:] == [ids[4:8], ids[8:]]  # batch 1 is not sent again
    assert error.completed.removed + resumed.removed == ids


def test_a_transport_failure_is_a_batch_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(RolloutBatchError, match=r"batch 1 of 1.*ConnectError") as caught:
        run(mock_client(Recorder(refuse)).delete(["r1"]))
    assert caught.value.status_code is None
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


@pytest.mark.parametrize(
    "reply",
    [
        {"removed": ["r1"], "absent": []},  # r2 missing
        {"removed": ["r1", "r2"], "absent": ["r2"]},  # r2 twice
        {"removed": ["r1", "r2", "r3"], "absent": []},  # r3 was not asked about
        {"removed": ["r1"], "absent": ["r2"], "extra": 1},  # not a RolloutRemoval
        {"removed": "r1"},
    ],
)
def test_a_reply_that_does_not_account_for_the_batch_is_an_error(reply: object) -> None:
    recorder = Recorder(lambda request: httpx.Response(200, json=reply))
    with pytest.raises(RolloutBatchError, match="batch 1 of 1"):
        run(mock_client(recorder).retire(["r1", "r2"]))


def test_a_wrong_token_is_a_401_error() -> None:
    transport = httpx.ASGITransport(app=control_app(FakeLedger(), token=TOKEN))
    client = AsyncRolloutControlClient(BASE, "not-the-token", transport=transport)
    with pytest.raises(RolloutBatchError) as caught:
        run(client.retire(["r1"]))
    assert caught.value.status_code == 401 and "HTTP 401" in str(caught.value)
    with pytest.raises(RolloutControlError, match="HTTP 401") as failed:
        run(client.manifest("r1"))
    assert failed.value.status_code == 401


# --- manifest ----------------------------------------------------------------------------


def test_manifest_round_trips_and_410_is_rollout_retired() -> None:
    ledger = FakeLedger({"r1": sample_manifest("r1")})

    async def go() -> RolloutManifest:
        async with asgi_client(ledger) as client:
            manifest = await client.manifest("r1")
            await client.retire(["r1"])
            with pytest.raises(RolloutRetiredError) as caught:
                await client.manifest("r1")
            assert caught.value.rollout_id == "r1"
            return manifest

    assert run(go()) == sample_manifest("r1")


def test_a_manifest_for_another_rollout_is_refused() -> None:
    other = sample_manifest("r2").model_dump(mode="json")
    recorder = Recorder(lambda request: httpx.Response(200, json=other))
    with pytest.raises(ManifestMismatchError, match=r"'r1'.*'r2'") as caught:
        run(mock_client(recorder).manifest("r1"))
    assert (caught.value.rollout_id, caught.value.received_rollout_id) == ("r1", "r2")
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("response", "match"),
    [
        (httpx.Response(500, text="disk on fire"), "HTTP 500 disk on fire"),
        (httpx.Response(404, json={"detail": "nope"}), "HTTP 404"),
        (httpx.Response(200, json={"rollout_id": "r1", "surprise": 1}), "not a manifest"),
        (httpx.Response(200, text="<html>"), "not a manifest"),
    ],
)
def test_other_manifest_failures_name_status_and_body(response: httpx.Response, match: str) -> None:
    recorder = Recorder(lambda request: response)
    with pytest.raises(RolloutControlError, match=match):
        run(mock_client(recorder).manifest("r1"))
    assert str(recorder.requests[0].url).endswith("/control/rollouts/r1/manifest")


# --- construction and the blocking client ----------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"auth_token": ""},
        {"base_url": ""},
        {"timeout_s": 0},
        {"timeout_s": -1.0},
        {"batch_size": 0},
        {"batch_size": MAX_BATCH_SIZE + 1},
        {"batch_size": True},
    ],
)
def test_bad_arguments_are_refused(options: dict[str, object]) -> None:
    arguments: dict[str, object] = {"base_url": BASE, "auth_token": TOKEN, **options}
    for cls in (AsyncRolloutControlClient, RolloutControlClient):
        with pytest.raises(ValueError):
            cls(**arguments)  # type: ignore[arg-type]


def test_context_managers_close_the_connections() -> None:
    with RolloutControlClient(BASE, TOKEN, transport=httpx.MockTransport(Recorder())) as sync:
        pass
    assert sync._client.is_closed

    async def go() -> AsyncRolloutControlClient:
        async with mock_client(Recorder()) as client:
            return client

    assert run(go())._client.is_closed


@pytest.fixture
def blocking_failure() -> Iterator[tuple[RolloutControlClient, Recorder]]:
    count: list[int] = []
    recorder = Recorder(lambda request: _fail_second(request, count))
    transport = httpx.MockTransport(recorder)
    with RolloutControlClient(BASE, TOKEN, batch_size=3, transport=transport) as client:
        yield client, recorder


def test_the_blocking_client_reports_a_failed_batch(
    blocking_failure: tuple[RolloutControlClient, Recorder],
) -> None:
    client, recorder = blocking_failure
    with pytest.raises(RolloutBatchError, match="delete batch 2 of 2") as caught:
        client.delete(["a", "b", "c", "d"])
    assert caught.value.remaining == ("d",) and caught.value.completed.removed == ["a", "b", "c"]
    assert client.delete(caught.value.remaining).removed == ["d"]
    assert recorder.batches() == [["a", "b", "c"], ["d"], ["d"]]


def test_the_blocking_client_against_a_real_server() -> None:
    ids = [f"t{i}" for i in range(10_000)]
    ledger = FakeLedger({"t5": sample_manifest("t5"), "t9999": RolloutManifest(rollout_id="t9999")})
    with serve(control_app(ledger, token=TOKEN)) as url, RolloutControlClient(url, TOKEN) as client:
        assert client.manifest("t5") == sample_manifest("t5")
        result = client.retire([*ids, *ids[:100]])
        with pytest.raises(RolloutRetiredError):
            client.manifest("t5")
        deleted = client.delete(["t5", "t6"])
    assert [len(batch) for method, batch in ledger.calls if method == "retire"] == [
        4096,
        4096,
        1808,
    ]
    assert result.removed == ["t5", "t9999"]
    assert len(result.absent) == 9998 and len(set(result.absent)) == 9998
    assert deleted == RolloutRemoval(removed=[], absent=["t5", "t6"])
