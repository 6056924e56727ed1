"""The token_id_capture block, configured and installed sinks and sources (reference §11.1,
§11.4 and the config part of §12.3)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from capture_core.exceptions import CaptureDirNotFoundError, TokenCaptureConfigError
from capture_core.tokens import (
    TokenCaptureStore,
    TokenIdCaptureConfig,
    TokenIdCaptureSettings,
    build_token_sink,
    install_token_sink,
    install_token_source,
    installed_token_sink,
    installed_token_source,
    make_token_store,
    resolve_token_sink,
    resolve_token_source,
    token_id_capture_dirs,
    token_id_capture_enabled_for_agent,
)
from tests.capture_core.tokens.sinks import FakeSource, RecordingSink, StrictKwargsSink

SINKS = "tests.capture_core.tokens.sinks"


@pytest.fixture(autouse=True)
def _nothing_installed() -> Iterator[None]:
    install_token_sink(None)
    install_token_source(None)
    yield
    install_token_sink(None)
    install_token_source(None)


def _config(**block: Any) -> TokenIdCaptureConfig:
    top = block.pop("model_call_capture_dir", None)
    return TokenIdCaptureConfig.from_global_config(
        {"token_id_capture": block, "model_call_capture_dir": top, "unrelated_key": 1}
    )


# --- the block -----------------------------------------------------------------------------


def test_defaults() -> None:
    block = TokenIdCaptureSettings()
    assert (block.enabled, block.all_agents, block.dir, block.sink, block.sink_kwargs) == (
        False, False, None, None, {},
    )  # fmt: skip
    assert (block.rebuild_response, block.max_mask_fraction) == (True, None)
    assert block.mask_fraction_min_samples == 50


def test_disabled_needs_no_directory_and_keeps_its_settings() -> None:
    config = _config(enabled=False, dir="relative/dir", max_mask_fraction=0.2)
    assert config.settings.dir == Path("relative/dir")  # not checked while off
    assert config.settings.max_mask_fraction == 0.2
    assert token_id_capture_dirs(config) == []
    assert make_token_store(config) is None
    assert resolve_token_sink(config) is None
    assert resolve_token_source(config) is None


def test_enabled_requires_a_directory_or_a_sink() -> None:
    with pytest.raises(TokenCaptureConfigError, match="requires a directory or sink") as info:
        _config(enabled=True)
    assert info.value.key == "token_id_capture"


def test_the_directory_must_be_absolute() -> None:
    with pytest.raises(TokenCaptureConfigError, match="absolute"):
        _config(enabled=True, dir="relative/tokens")
    with pytest.raises(TokenCaptureConfigError, match="absolute"):
        _config(enabled=True, model_call_capture_dir="relative/mc")


def test_the_directory_falls_back_to_model_call_capture_dir(tmp_path: Path) -> None:
    config = _config(enabled=True, model_call_capture_dir=str(tmp_path))
    assert config.resolved_dir == tmp_path
    assert token_id_capture_dirs(config) == [tmp_path]
    own = _config(enabled=True, dir=str(tmp_path / "t"), model_call_capture_dir=str(tmp_path))
    assert token_id_capture_dirs(own) == [tmp_path / "t"]


@pytest.mark.parametrize("key", ["dirr", "source", "source_kwargs"])
def test_unknown_keys_are_refused_naming_the_key(key: str, tmp_path: Path) -> None:
    with pytest.raises(TokenCaptureConfigError, match=f"token_id_capture.{key}") as info:
        _config(enabled=True, dir=str(tmp_path), **{key: "x"})
    assert info.value.key == f"token_id_capture.{key}"
    assert "Extra inputs are not permitted" in info.value.reason
    with pytest.raises(ValidationError):
        TokenIdCaptureSettings.model_validate({key: "x"})


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_mask_fraction", 1.5), ("max_mask_fraction", -0.1), ("max_mask_fraction", float("nan")),
     ("mask_fraction_min_samples", 0)],
)  # fmt: skip
def test_mask_limits_must_make_sense(field: str, value: float) -> None:
    """Stricter than upstream: a fraction outside [0, 1] never or always aborts, and a minimum
    of 0 divides by zero."""
    with pytest.raises(TokenCaptureConfigError, match=field):
        _config(enabled=False, **{field: value})


def test_a_sink_is_accepted_without_a_directory_and_a_directory_beside_it_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert _config(enabled=True, sink=f"{SINKS}:RecordingSink").settings.sink is not None
    with caplog.at_level(logging.WARNING, "capture_core.tokens"):
        config = _config(enabled=True, sink=f"{SINKS}:RecordingSink", dir=str(tmp_path))
    assert "will not be written to" in caplog.text
    assert token_id_capture_dirs(config) == []  # the sink replaces the file store


def test_no_destination_is_fine_without_rebuilding() -> None:
    """External staging: nothing is written in this process and nothing rebuilt."""
    config = _config(enabled=True, rebuild_response=False)
    assert resolve_token_sink(config) is None
    assert resolve_token_source(config) is None


def test_an_installed_sink_stands_in_for_the_directory() -> None:
    sink = RecordingSink()
    install_token_sink(sink)
    config = _config(enabled=True)
    assert installed_token_sink() is sink
    assert resolve_token_sink(config) is sink


# --- agents --------------------------------------------------------------------------------


def _global(enabled: bool, all_agents: bool, flag: bool | None) -> dict[str, Any]:
    agent: dict[str, Any] = {"entrypoint": "app.py"}
    if flag is not None:
        agent["token_id_capture"] = flag
    return {
        "token_id_capture": {"enabled": enabled, "all_agents": all_agents, "dir": "/abs/t"},
        "math_agent": {"responses_api_agents": {"simple_agent": agent}},
    }


@pytest.mark.parametrize(
    ("enabled", "all_agents", "flag", "expected"),
    [(True, False, True, True), (True, False, False, False), (True, False, None, False),
     (True, True, None, True), (False, True, True, False), (False, False, True, False)],
)  # fmt: skip
def test_agent_participation(
    enabled: bool, all_agents: bool, flag: bool | None, expected: bool
) -> None:
    config = _global(enabled, all_agents, flag)
    assert token_id_capture_enabled_for_agent(config, "math_agent") is expected
    assert token_id_capture_enabled_for_agent(config, "other_agent") is (enabled and all_agents)


# --- configured sinks ----------------------------------------------------------------------


def test_a_configured_sink_gets_its_kwargs_and_wins_over_an_installed_one(tmp_path: Path) -> None:
    install_token_sink(RecordingSink(origin="installed"))
    config = _config(enabled=True, sink=f"{SINKS}:StrictKwargsSink",
                     sink_kwargs={"endpoint": "grpc://stage"}, dir=str(tmp_path))  # fmt: skip
    sink = resolve_token_sink(config)
    assert isinstance(sink, StrictKwargsSink)
    assert sink.kwargs == {"endpoint": "grpc://stage"}
    assert build_token_sink(_config(enabled=False, sink=f"{SINKS}:RecordingSink")) is None


@pytest.mark.parametrize(
    ("target", "kwargs", "key", "message"),
    [
        (f"{SINKS}:StrictKwargsSink", {"endpont": "x"}, "sink_kwargs", "sink_kwargs"),
        (f"{SINKS}.RecordingSink", {}, "sink", "must be 'module.path:ClassName'"),
        (f"{SINKS}:Missing", {}, "sink", "could not load"),
        ("no_such_module_xyz:Sink", {}, "sink", "could not load"),
        (f"{SINKS}:NoMarkSink", {}, "sink", "does not satisfy TokenSink: mark_incomplete"),
        (f"{SINKS}:NonCallablePutSink", {}, "sink", "does not satisfy TokenSink: put"),
        (f"{SINKS}:SyncPutSink", {}, "sink", r"put \(not async\)"),
        (f"{SINKS}:ExplodingSink", {}, "sink", "cannot reach the staging service"),
    ],
)
def test_a_sink_that_cannot_work_is_refused_at_start_up(
    target: str, kwargs: dict[str, Any], key: str, message: str
) -> None:
    config = _config(enabled=True, sink=target, sink_kwargs=kwargs)
    with pytest.raises(TokenCaptureConfigError, match=message) as info:
        build_token_sink(config)
    assert info.value.key == key


# --- the file store and sources --------------------------------------------------------------


def test_the_file_store_is_the_default_sink_and_source(tmp_path: Path) -> None:
    config = _config(enabled=True, dir=str(tmp_path / "tokens"))
    with pytest.raises(CaptureDirNotFoundError):
        resolve_token_source(config)  # the collector never creates the directory
    sink = resolve_token_sink(config)  # a model server does
    assert isinstance(sink, TokenCaptureStore)
    assert sink.root == tmp_path / "tokens"
    source = resolve_token_source(config)
    assert isinstance(source, TokenCaptureStore)


def test_an_installed_source_wins_and_rebuild_off_means_no_source(tmp_path: Path) -> None:
    source = FakeSource({})
    install_token_source(source)
    assert installed_token_source() is source
    assert resolve_token_source(_config(enabled=True, dir=str(tmp_path))) is source
    assert resolve_token_source(_config(enabled=True, rebuild_response=False)) is None


def _report_installed(conn: Any) -> None:
    from capture_core.tokens import installed_token_sink as seen

    conn.send(seen() is None)
    conn.close()


@pytest.mark.slow
def test_an_installed_sink_does_not_reach_a_spawned_process() -> None:
    install_token_sink(RecordingSink())
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_report_installed, args=(sender,))
    process.start()
    sender.close()
    try:
        assert receiver.poll(120)
        assert receiver.recv() is True
    finally:
        process.join(60)
        if process.is_alive():
            process.kill()
            process.join()
    assert process.exitcode == 0


def test_the_package_imports_no_server_or_heavy_module() -> None:
    heavy = ("starlette", "uvicorn", "httpx", "anyio", "fastapi", "aiohttp", "requests",
             "torch", "ray", "polars", "plotly", "wandb")  # fmt: skip
    code = (
        "import sys, json, capture_core.tokens; "
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout) == []
