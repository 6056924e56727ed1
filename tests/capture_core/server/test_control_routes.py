"""The control routes: bearer auth first, body limits, exact statuses and reply shapes.

The ledger is an in-memory fake with the ``LedgerControl`` shape that records every call, so a
test can assert that a refused request changed nothing. One test runs a real uvicorn server.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Message

from capture_core.exceptions import InvalidRolloutIdError, RolloutRetiredError
from capture_core.ids import validate_rollout_id
from capture_core.server import CaptureSettings, control
from capture_core.server.control import (
    MAX_BODY_BYTES,
    UNAUTHORIZED_DETAIL,
    ControlTokenError,
    LedgerControl,
    control_app,
    load_control_token,
)
from capture_core.staging import CallRecord, RolloutManifest, RolloutRemoval
from tests._uvicorn import serve_in_thread
from tests.capture_core.staging.examples import call_record_json, chain_records

TOKEN = "s3cret-token"
PREFIX = "/training-token-capture/control/rollouts"
RETIRE = f"{PREFIX}/retire"
DELETE = f"{PREFIX}/delete"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FakeLedger:
    """An in-memory ledger: ``ledgers`` hold manifests, ``fences`` the retired ids.

    ``calls`` lists every call as ``(method, argument)``; ``on_loop`` notes, per call, whether it
    ran on a thread with a running event loop.
    """

    def __init__(self, ledgers: dict[str, RolloutManifest] | None = None) -> None:
        self.ledgers = dict(ledgers or {})
        self.fences: set[str] = set()
        self.calls: list[tuple[str, Any]] = []
        self.on_loop: list[bool] = []
        self.refuse: set[str] = set()  # ids this ledger alone considers invalid
        self.fail_with: Exception | None = None

    def _enter(self, method: str, argument: Any) -> None:
        self.calls.append((method, argument))
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.on_loop.append(False)
        else:
            self.on_loop.append(True)
        if self.fail_with is not None:
            raise self.fail_with

    def _batch(self, rollout_ids: Sequence[str]) -> list[str]:
        for rollout_id in rollout_ids:
            validate_rollout_id(rollout_id)
            if rollout_id in self.refuse:
                raise InvalidRolloutIdError(rollout_id, "refused by the ledger")
        return list(dict.fromkeys(rollout_ids))

    def manifest(self, rollout_id: str) -> RolloutManifest:
        self._enter("manifest", rollout_id)
        if rollout_id in self.fences:
            raise RolloutRetiredError(rollout_id)
        return self.ledgers.get(rollout_id, RolloutManifest(rollout_id=rollout_id))

    def retire(self, rollout_ids: Sequence[str]) -> RolloutRemoval:
        self._enter("retire", list(rollout_ids))
        ids = self._batch(rollout_ids)
        removed = [i for i in ids if self.ledgers.pop(i, None) is not None]
        self.fences.update(ids)
        return RolloutRemoval(removed=removed, absent=[i for i in ids if i not in removed])

    def delete(self, rollout_ids: Sequence[str]) -> RolloutRemoval:
        self._enter("delete", list(rollout_ids))
        ids = self._batch(rollout_ids)
        removed = [i for i in ids if self.ledgers.pop(i, None) is not None]
        self.fences.difference_update(ids)
        return RolloutRemoval(removed=removed, absent=[i for i in ids if i not in removed])


def _typed(ledger: FakeLedger) -> LedgerControl:
    return ledger  # mypy checks that the fake has the Protocol's shape


def sample_manifest(rollout_id: str = "r1") -> RolloutManifest:
    c1, c2 = chain_records()
    rows = [
        CallRecord.model_validate(call_record_json(c1, response_id="resp_1")),
        CallRecord.model_validate(call_record_json(c2, response_id="resp_2")),
    ]
    failures = [{"model_call_id": "c3", "reason": "uncommitted"}]
    return RolloutManifest.model_validate(
        {"rollout_id": rollout_id, "records": [r.model_dump() for r in rows], "failures": failures}
    )


@pytest.fixture
def ledger() -> FakeLedger:
    return FakeLedger({"r1": sample_manifest("r1"), "r2": RolloutManifest(rollout_id="r2")})


@pytest.fixture
def client(ledger: FakeLedger) -> Iterator[TestClient]:
    with TestClient(control_app(_typed(ledger), token=TOKEN)) as test_client:
        yield test_client


@contextmanager
def serve(app: ASGIApp) -> Iterator[str]:
    """Run ``app`` under a real uvicorn server on 127.0.0.1; yields its base URL."""
    with serve_in_thread(app) as port:
        yield f"http://127.0.0.1:{port}"


# --- authentication ------------------------------------------------------------------------

ROUTES = [("GET", f"{PREFIX}/r1/manifest"), ("POST", RETIRE), ("POST", DELETE)]
BAD_AUTH: list[dict[str, str]] = [
    {},
    {"Authorization": "Bearer wrong-token!"},  # same length as the real one
    {"Authorization": "Bearer x"},
    {"Authorization": f"Bearer {TOKEN}x"},
    {"Authorization": f"Bearer {TOKEN[:-1]}"},
    {"Authorization": f"Basic {TOKEN}"},
    {"Authorization": TOKEN},
    {"Authorization": "Bearer "},
    {"Authorization": f"Token {TOKEN}"},
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("headers", BAD_AUTH)
def test_a_missing_or_wrong_token_gets_401_and_changes_nothing(
    client: TestClient, ledger: FakeLedger, method: str, path: str, headers: dict[str, str]
) -> None:
    response = client.request(method, path, headers=headers, json={"rollout_ids": ["r1"]})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {"detail": UNAUTHORIZED_DETAIL}
    assert ledger.calls == []
    assert "r1" in ledger.ledgers


def test_a_repeated_authorization_header_is_refused(client: TestClient) -> None:
    headers = [("authorization", f"Bearer {TOKEN}"), ("authorization", f"Bearer {TOKEN}")]
    response = client.get(f"{PREFIX}/r1/manifest", headers=httpx.Headers(headers))
    assert response.status_code == 401


@pytest.mark.parametrize("body", [b"{not json", b'{"rollout_ids": []}', b"x" * 10])
def test_auth_is_checked_before_the_body_is_read(body: bytes) -> None:
    ledger = FakeLedger()
    app = control_app(ledger, token=TOKEN)
    sent: list[Message] = []

    async def receive() -> Message:
        raise AssertionError("the body was read before the token was checked")

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": RETIRE, "raw_path": RETIRE.encode(),
             "headers": [(b"authorization", b"Bearer nope")], "query_string": b""}  # fmt: skip
    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 401
    assert ledger.calls == []


def test_every_check_goes_through_hmac_compare_digest(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    assert client.get(f"{PREFIX}/r2/manifest", headers=AUTH).status_code == 200
    assert client.get(f"{PREFIX}/r2/manifest").status_code == 401  # no header: still compared
    wrong = {"Authorization": "Bearer " + "z" * 500}
    assert client.get(f"{PREFIX}/r2/manifest", headers=wrong).status_code == 401
    assert len(seen) == 3
    expected = hashlib.sha256(f"Bearer {TOKEN}".encode()).digest()
    # Both sides are fixed-length digests: neither length nor prefix can short-cut the compare.
    assert all(len(a) == len(b) == 32 for a, b in seen)
    assert seen[0] == (hashlib.sha256(f"Bearer {TOKEN}".encode()).digest(), expected)
    assert seen[2][0] == hashlib.sha256(wrong["Authorization"].encode()).digest()


def test_the_compare_result_decides(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: False)
    assert client.get(f"{PREFIX}/r2/manifest", headers=AUTH).status_code == 401


# --- removal bodies ------------------------------------------------------------------------


@pytest.mark.parametrize("path", [RETIRE, DELETE])
@pytest.mark.parametrize(
    ("body", "error_type"),
    [
        ({"rollout_ids": []}, "too_short"),
        ({"rollout_ids": [f"r{i}" for i in range(4097)]}, "too_long"),
        ({"rollout_ids": ["r1"], "force": True}, "extra_forbidden"),
        ({}, "missing"),
        ({"rollout_ids": "r1"}, "list_type"),
        ({"rollout_ids": {"r1": 1}}, "list_type"),
        ({"rollout_ids": [1]}, "string_type"),
        ({"rollout_ids": ["r1", None]}, "string_type"),
        ({"rollout_ids": [["r1"]]}, "string_type"),
        (["r1"], "model_type"),
    ],
)
def test_a_malformed_body_gets_422_and_changes_nothing(
    client: TestClient, ledger: FakeLedger, path: str, body: object, error_type: str
) -> None:
    response = client.post(path, headers=AUTH, json=body)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert error_type in {error["type"] for error in detail}
    assert all("input" not in error for error in detail)  # 4097 ids are not echoed back
    assert ledger.calls == []


def test_invalid_json_gets_422(client: TestClient, ledger: FakeLedger) -> None:
    response = client.post(RETIRE, headers=AUTH, content=b'{"rollout_ids": [')
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"
    assert ledger.calls == []


def test_4096_ids_are_accepted(client: TestClient, ledger: FakeLedger) -> None:
    ids = [f"x{i}" for i in range(4096)]
    response = client.post(RETIRE, headers=AUTH, json={"rollout_ids": ids})
    assert response.status_code == 200
    assert response.json() == {"removed": [], "absent": ids}
    assert ledger.calls == [("retire", ids)]


def test_a_too_large_body_gets_413(client: TestClient, ledger: FakeLedger) -> None:
    body = b'{"rollout_ids": ["' + b"a" * MAX_BODY_BYTES + b'"]}'
    response = client.post(RETIRE, headers=AUTH, content=body)
    assert response.status_code == 413
    assert ledger.calls == []


@pytest.mark.parametrize("path", [RETIRE, DELETE])
@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("bad", ["../r1", "..", ".hidden", "a/b", "r\u00f6", "", "a" * 201])
def test_an_invalid_id_anywhere_gets_400_and_changes_nothing(
    client: TestClient, ledger: FakeLedger, path: str, position: int, bad: str
) -> None:
    ids = ["r1", "r2"]
    ids.insert(position, bad)
    response = client.post(path, headers=AUTH, json={"rollout_ids": ids})
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert "invalid rollout id" in detail and ascii(bad)[:40] in detail
    assert ledger.calls == []
    assert set(ledger.ledgers) == {"r1", "r2"} and ledger.fences == set()


def test_an_id_the_ledger_refuses_gets_400(client: TestClient, ledger: FakeLedger) -> None:
    ledger.refuse.add("r2")
    response = client.post(RETIRE, headers=AUTH, json={"rollout_ids": ["r1", "r2"]})
    assert response.status_code == 400
    assert "'r2'" in response.json()["detail"]
    assert set(ledger.ledgers) == {"r1", "r2"}


# --- replies -------------------------------------------------------------------------------


def test_retire_replies_exactly_removed_and_absent(client: TestClient, ledger: FakeLedger) -> None:
    body = {"rollout_ids": ["r1", "never", "r2", "r1"]}
    response = client.post(RETIRE, headers=AUTH, json=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"removed": ["r1", "r2"], "absent": ["never"]}
    assert list(response.json()) == ["removed", "absent"]  # no schema_version
    assert ledger.calls == [("retire", ["r1", "never", "r2", "r1"])]
    assert ledger.on_loop == [False]  # ran in a worker thread, off the event loop
    again = client.post(RETIRE, headers=AUTH, json=body)
    assert again.json() == {"removed": [], "absent": ["r1", "never", "r2"]}


def test_manifest_is_410_after_retire_and_delete_after_retire_is_absent(
    client: TestClient, ledger: FakeLedger
) -> None:
    assert client.get(f"{PREFIX}/r1/manifest", headers=AUTH).status_code == 200
    client.post(RETIRE, headers=AUTH, json={"rollout_ids": ["r1"]})
    gone = client.get(f"{PREFIX}/r1/manifest", headers=AUTH)
    assert gone.status_code == 410
    assert "'r1'" in gone.json()["detail"] and "retired" in gone.json()["detail"]
    deleted = client.post(DELETE, headers=AUTH, json={"rollout_ids": ["r1"]})
    assert deleted.status_code == 200
    assert deleted.json() == {"removed": [], "absent": ["r1"]}
    fresh = client.get(f"{PREFIX}/r1/manifest", headers=AUTH)
    assert fresh.status_code == 200 and fresh.json()["records"] == []


def test_delete_replies_exactly(client: TestClient) -> None:
    response = client.post(DELETE, headers=AUTH, json={"rollout_ids": ["r2", "zz"]})
    assert response.status_code == 200
    assert response.json() == {"removed": ["r2"], "absent": ["zz"]}


def test_the_manifest_round_trips(client: TestClient, ledger: FakeLedger) -> None:
    response = client.get(f"{PREFIX}/r1/manifest", headers=AUTH)
    assert response.status_code == 200
    body = response.json()
    assert body == sample_manifest("r1").model_dump(mode="json")
    assert body["schema_version"] == 3 and body["records"][0]["digest_version"] == 2
    assert RolloutManifest.model_validate(body) == ledger.ledgers["r1"]
    assert ledger.on_loop == [False]


def test_an_unknown_rollout_has_an_empty_manifest(client: TestClient) -> None:
    response = client.get(f"{PREFIX}/never/manifest", headers=AUTH)
    assert response.json() == RolloutManifest(rollout_id="never").model_dump(mode="json")


@pytest.mark.parametrize("raw", [".hidden", "a..b", "a%2Fb", "r%C3%B6", "%2e%2e", "a" * 201])
def test_a_manifest_for_an_invalid_id_gets_400(
    client: TestClient, ledger: FakeLedger, raw: str
) -> None:
    response = client.get(f"{PREFIX}/{raw}/manifest", headers=AUTH)
    assert response.status_code == 400
    assert response.json()["detail"].startswith("invalid rollout id")
    assert ledger.calls == []


def test_unknown_routes_and_methods(client: TestClient) -> None:
    assert client.get(f"{PREFIX}/list", headers=AUTH).status_code == 404
    wrong = client.get(RETIRE, headers=AUTH)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    wrong = client.post(f"{PREFIX}/r1/manifest", headers=AUTH)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"
    assert client.get("/training-token-capture/control/rollouts/r1/manifest/x").status_code == 401


def test_a_ledger_failure_is_a_json_500(client: TestClient, ledger: FakeLedger) -> None:
    ledger.fail_with = OSError(28, "No space left on device")
    response = client.post(RETIRE, headers=AUTH, json={"rollout_ids": ["r1"]})
    assert response.status_code == 500
    assert "ledger retire failed: OSError" in response.json()["detail"]


# --- token -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", " s3cret", "s3cret\n", "two words", "t\u00f6ken"])
def test_training_capture_refuses_to_start_without_a_usable_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str | None
) -> None:
    monkeypatch.delenv("NGCAPTURE_CONTROL_TOKEN", raising=False)
    if value is not None:
        monkeypatch.setenv("NGCAPTURE_CONTROL_TOKEN", value)
    settings = CaptureSettings(lineage_dir=tmp_path)
    with pytest.raises(ControlTokenError, match=r"\$NGCAPTURE_CONTROL_TOKEN") as caught:
        load_control_token(settings)
    assert caught.value.env_var == "NGCAPTURE_CONTROL_TOKEN"
    assert "refusing to start" in str(caught.value)


def test_the_token_variable_name_is_configurable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NGCAPTURE_CONTROL_TOKEN_ENV", "MY_GYM_TOKEN")
    monkeypatch.setenv("MY_GYM_TOKEN", TOKEN)
    monkeypatch.setenv("NGCAPTURE_LINEAGE_DIR", str(tmp_path))
    settings = CaptureSettings()
    assert settings.control_token_env == "MY_GYM_TOKEN" and settings.lineage_dir == tmp_path
    assert load_control_token(settings) == TOKEN
    assert TOKEN not in settings.model_dump_json()  # only the variable's name is in the config
    environ = {"MY_GYM_TOKEN": ""}
    with pytest.raises(ControlTokenError, match=r"\$MY_GYM_TOKEN.*unset or empty"):
        load_control_token(settings, environ=environ)


@pytest.mark.parametrize("token", ["", "has space"])
def test_the_app_refuses_an_unusable_token(token: str) -> None:
    with pytest.raises(ControlTokenError):
        control_app(FakeLedger(), token=token)


# --- a real server -----------------------------------------------------------------------


def test_through_a_real_uvicorn_server(ledger: FakeLedger) -> None:
    with serve(control_app(ledger, token=TOKEN)) as url, httpx.Client(base_url=url) as http:
        assert http.post(RETIRE, json={"rollout_ids": ["r1"]}).status_code == 401
        response = http.get(f"{PREFIX}/r1/manifest", headers=AUTH)
        assert RolloutManifest.model_validate(response.json()) == sample_manifest("r1")
        retired = http.post(RETIRE, headers=AUTH, json={"rollout_ids": ["r1", "r9"]})
        assert retired.json() == {"removed": ["r1"], "absent": ["r9"]}
        assert http.get(f"{PREFIX}/r1/manifest", headers=AUTH).status_code == 410
        too_many = http.post(RETIRE, headers=AUTH, json={"rollout_ids": ["a"] * 4097})
        assert too_many.status_code == 422
    assert ledger.on_loop == [False, False, False]


def test_with_the_real_lineage_store(tmp_path: Path) -> None:
    from capture_core.lineage import LineageStore

    store: LedgerControl = LineageStore(tmp_path)
    manifest = sample_manifest("r1")
    for row in manifest.records:
        LineageStore(tmp_path).record("r1", row)
    with TestClient(control_app(store, token=TOKEN)) as client:
        body = client.get(f"{PREFIX}/r1/manifest", headers=AUTH).json()
        assert RolloutManifest.model_validate(body).records == manifest.records
        bad = client.post(RETIRE, headers=AUTH, json={"rollout_ids": ["r1", "../x"]})
        assert bad.status_code == 400
        assert (tmp_path / "r1.lineage.jsonl").exists()
        retired = client.post(RETIRE, headers=AUTH, json={"rollout_ids": ["r1", "r1", "r7"]})
        assert retired.json() == {"removed": ["r1"], "absent": ["r7"]}
        assert client.get(f"{PREFIX}/r1/manifest", headers=AUTH).status_code == 410
        deleted = client.post(DELETE, headers=AUTH, json={"rollout_ids": ["r1"]})
        assert deleted.json() == {"removed": [], "absent": ["r1"]}
        assert client.get(f"{PREFIX}/r1/manifest", headers=AUTH).json()["records"] == []


def test_the_docstring_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import doctest

    monkeypatch.delenv("NGCAPTURE_CONTROL_TOKEN_ENV", raising=False)
    result = doctest.testmod(control)
    assert result.attempted >= 1 and result.failed == 0
