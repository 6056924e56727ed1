from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from capture_core.server import CaptureSettings, benchmark_capture_settings, route_path


@pytest.mark.parametrize(
    ("raw", "rollout_id", "valid", "path", "dialect"),
    [
        (b"/ng-rollout/3-2/v1/responses", "3-2", True, "/v1/responses", "responses"),
        (b"/ng-rollout/3-2/v1/chat/completions?x=1", "3-2", True, "/v1/chat/completions", "chat"),
        (b"/ng-rollout/a.b_c/v1/messages", "a.b_c", True, "/v1/messages", "messages"),
        (b"/ng-rollout/3-2/v1/models", "3-2", True, "/v1/models", None),
        (b"/ng-rollout/../v1/responses", "..", False, "/v1/responses", "responses"),
        (b"/ng-rollout/.hidden/v1/responses", ".hidden", False, "/v1/responses", "responses"),
        (b"/ng-rollout/%2e%2e/v1/responses", "..", False, "/v1/responses", "responses"),
        (b"/ng-rollout/a%2Fb/v1/responses", "a/b", False, "/v1/responses", "responses"),
        (b"/ng-rollout/r%C3%B6llout/v1/responses", "r\u00f6llout", False, "/v1/responses",
         "responses"),
        (b"/ng-rollout/x/../../v1/responses", "x", True, "/../../v1/responses", None),
        (b"/ng-rollout/3-2/training-token-capture/v1/responses", "3-2", True, "/v1/responses",
         "responses"),
    ],
)  # fmt: skip
def test_route_path(
    raw: bytes, rollout_id: str, valid: bool, path: str, dialect: str | None
) -> None:
    route = route_path(raw)
    assert route is not None
    assert route.rollout_id == rollout_id
    assert route.valid is valid
    assert route.path == path
    assert (route.dialect.name if route.dialect else None) == dialect
    assert route.raw_path.decode().split("?")[0] == path or "%" in raw.decode()


@pytest.mark.parametrize(
    "raw", [b"/v1/responses", b"/ng-rollout/", b"/ng-rollout/id", b"/ng-rollout//v1/responses"]
)
def test_unprefixed_paths_are_not_routes(raw: bytes) -> None:
    assert route_path(raw) is None


def test_a_long_id_is_refused() -> None:
    route = route_path(b"/ng-rollout/" + b"a" * 10_000 + b"/v1/responses")
    assert route is not None
    assert not route.valid
    assert route.path == "/v1/responses"


def test_settings_capture_is_opt_in_and_needs_an_absolute_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("NGCAPTURE_OBSERVABILITY_ENABLED", "NGCAPTURE_MODEL_CALL_CAPTURE_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert CaptureSettings().capture_dir is None
    with pytest.raises(ValidationError, match="required"):
        CaptureSettings(observability_enabled=True)
    with pytest.raises(ValidationError, match="absolute"):
        CaptureSettings(observability_enabled=True, model_call_capture_dir="rel/dir")
    monkeypatch.setenv("NGCAPTURE_OBSERVABILITY_ENABLED", "true")
    monkeypatch.setenv("NGCAPTURE_MODEL_CALL_CAPTURE_DIR", str(tmp_path))
    monkeypatch.setenv("NGCAPTURE_UPSTREAM_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("NGCAPTURE_UPSTREAM_MESSAGES_URL", "http://127.0.0.1:10")
    settings = CaptureSettings()
    assert settings.capture_dir == tmp_path
    assert settings.upstream_for("chat") == "http://127.0.0.1:9"
    assert settings.upstream_for("messages") == "http://127.0.0.1:10"
    assert settings.upstream_for(None) == "http://127.0.0.1:9"


def test_benchmark_jobs_capture_by_default_under_the_job_dir(tmp_path: Path) -> None:
    assert benchmark_capture_settings(tmp_path).capture_dir == tmp_path / "model-calls"
    off = benchmark_capture_settings(tmp_path, {"observability_enabled": False})
    assert off.capture_dir is None
    moved = benchmark_capture_settings(tmp_path, {"model_call_capture_dir": str(tmp_path / "x")})
    assert moved.capture_dir == tmp_path / "x"
    with pytest.raises(ValueError, match="absolute"):
        benchmark_capture_settings(tmp_path, {"model_call_capture_dir": "relative/calls"})
    with pytest.raises(ValueError, match="true or false"):
        benchmark_capture_settings(tmp_path, {"observability_enabled": "no"})
