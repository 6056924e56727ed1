"""The control plane inside ``create_app``: on with training capture, refused without a token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from capture_core.server import CaptureSettings, create_app
from capture_core.server.control import ControlTokenError
from capture_core.staging import CallRecord, build_staged_call_record

PREFIX = "/training-token-capture/control/rollouts"


def call(app: object, method: str, path: str, **kwargs: object) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
            return await client.request(method, path, **kwargs)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_training_capture_refuses_to_start_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NGCAPTURE_CONTROL_TOKEN", raising=False)
    with pytest.raises(ControlTokenError, match="NGCAPTURE_CONTROL_TOKEN"):
        create_app(CaptureSettings(lineage_dir=tmp_path))


def test_control_routes_are_served_by_the_capture_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NGCAPTURE_CONTROL_TOKEN", "s3cret-token")
    app = create_app(CaptureSettings(lineage_dir=tmp_path, upstream_url="http://127.0.0.1:9"))
    assert app.lineage is not None
    record = build_staged_call_record(
        rollout_id="r-1", model_call_id="c" * 32, prompt_token_ids=[1, 2],
        generated_token_ids=[3], generated_logprobs=[-0.5], weight_version=1,
    )  # fmt: skip
    keep = set(CallRecord.model_fields) & set(type(record).model_fields) - {"rollout_id"}
    row = CallRecord(staging_key="r-1/c", response_id="resp-1",
                     **{k: getattr(record, k) for k in keep})  # fmt: skip
    app.lineage.record("r-1", row)
    auth = {"authorization": "Bearer s3cret-token"}
    assert call(app, "GET", f"{PREFIX}/r-1/manifest").status_code == 401
    manifest = call(app, "GET", f"{PREFIX}/r-1/manifest", headers=auth)
    assert manifest.status_code == 200
    assert [r["model_call_id"] for r in manifest.json()["records"]] == ["c" * 32]
    retired = call(app, "POST", f"{PREFIX}/retire", headers=auth, json={"rollout_ids": ["r-1"]})
    assert retired.json() == {"removed": ["r-1"], "absent": []}
    assert call(app, "GET", f"{PREFIX}/r-1/manifest", headers=auth).status_code == 410


def test_control_paths_are_never_forwarded_when_training_is_off() -> None:
    app = create_app(CaptureSettings(upstream_url="http://127.0.0.1:9"))
    response = call(app, "POST", f"{PREFIX}/retire", json={"rollout_ids": ["r-1"]})
    assert response.status_code == 404
