"""The token_id_capture block from a JSON file: ``load_token_capture_config``, the capture
server's setting (``--token-id-capture-config`` / ``NGCAPTURE_TOKEN_ID_CAPTURE_CONFIG``) and
the collector's option; a bad file is refused at start-up naming the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from capture_core.cli import main
from capture_core.exceptions import TokenCaptureConfigError
from capture_core.server.settings import CaptureSettings
from capture_core.tokens import load_token_capture_config


def write(tmp_path: Path, data: Any, name: str = "tokens.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_file_with_a_block_and_the_fallback_dir(tmp_path: Path) -> None:
    path = write(tmp_path, {"token_id_capture": {"enabled": True, "max_mask_fraction": 0.1},
                            "other_run_keys": {"ignored": True}})  # fmt: skip
    config = load_token_capture_config(path, model_call_capture_dir="/abs/calls")
    assert config.settings.enabled and config.settings.max_mask_fraction == 0.1
    assert config.resolved_dir == Path("/abs/calls")
    own = write(tmp_path, {"token_id_capture": {"enabled": True},
                           "model_call_capture_dir": "/abs/own"}, "own.json")  # fmt: skip
    assert load_token_capture_config(own, model_call_capture_dir="/x").resolved_dir == Path(
        "/abs/own"
    )


@pytest.mark.parametrize(
    ("data", "key", "says"),
    [
        ({"token_id_capture": {"enabled": True, "dirr": "/t"}}, "token_id_capture.dirr",
         "Extra inputs"),
        ({"token_id_capture": {"enabled": True, "dir": "/t", "source": "m:C"}},
         "token_id_capture.source", "Extra inputs"),
        ({"token_id_capture": {"enabled": True, "dir": "relative/t"}}, "token_id_capture",
         "absolute"),
        ({"token_id_capture": {"enabled": True, "dir": "/t", "max_mask_fraction": 2}},
         "token_id_capture.max_mask_fraction", "less than or equal to 1"),
        ({"token_id_capture": {"enabled": True}}, "token_id_capture", "requires a directory"),
        ({"model_call_capture_dir": "/abs"}, "token_id_capture", "has no 'token_id_capture'"),
        ([1, 2], "token_id_capture", "must hold a JSON object"),
        ("{not json", "token_id_capture", "is not valid JSON"),
    ],
    ids=["unknown-key", "source", "relative", "fraction", "no-dir", "no-block", "array", "json"],
)  # fmt: skip
def test_bad_files_are_refused_naming_the_key(
    tmp_path: Path, data: Any, key: str, says: str
) -> None:
    path = write(tmp_path, data)
    with pytest.raises(TokenCaptureConfigError) as caught:
        load_token_capture_config(path)
    assert caught.value.key == key
    assert says in str(caught.value) and str(path) in str(caught.value)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenCaptureConfigError, match="cannot read"):
        load_token_capture_config(tmp_path / "nowhere.json")


def test_disabled_block_is_kept_unchecked(tmp_path: Path) -> None:
    path = write(tmp_path, {"token_id_capture": {"enabled": False, "dir": "relative"}})
    assert load_token_capture_config(path).settings.dir == Path("relative")


def test_server_settings_read_the_file_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, {"token_id_capture": {"enabled": True}})
    monkeypatch.setenv("NGCAPTURE_TOKEN_ID_CAPTURE_CONFIG", str(path))
    values: dict[str, Any] = {"observability_enabled": True, "model_call_capture_dir": tmp_path,
                              "lineage_dir": tmp_path / "lineage"}  # fmt: skip
    settings = CaptureSettings(**values)
    assert settings.token_capture is not None
    assert settings.token_capture.resolved_dir == tmp_path  # the server's capture directory
    with pytest.raises(ValidationError, match="requires a directory"):
        CaptureSettings(lineage_dir=tmp_path / "lineage")  # no capture dir to fall back on
    monkeypatch.delenv("NGCAPTURE_TOKEN_ID_CAPTURE_CONFIG")
    assert CaptureSettings(**values).token_capture is None


def test_server_refuses_token_capture_without_training_capture(tmp_path: Path) -> None:
    path = write(tmp_path, {"token_id_capture": {"enabled": True, "dir": str(tmp_path)}})
    with pytest.raises(ValidationError, match="set lineage_dir"):
        CaptureSettings(token_id_capture_config=path)
    off = write(tmp_path, {"token_id_capture": {"enabled": False}}, "off.json")
    assert CaptureSettings(token_id_capture_config=off).token_capture is not None


def test_server_refuses_an_unknown_key_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NGCAPTURE_CONTROL_TOKEN", "t")
    path = write(tmp_path, {"token_id_capture": {"enabled": True, "dirr": "/t"}})
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(["serve", "--upstream", "http://127.0.0.1:1", "--lineage-dir", "ledgers",
                 "--token-id-capture-config", str(path), "--port", "0"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "token_id_capture.dirr" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_serve_refuses_token_capture_without_lineage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, {"token_id_capture": {"enabled": True, "dir": str(tmp_path / "t")}})
    code = main(["serve", "--upstream", "http://127.0.0.1:1",
                 "--token-id-capture-config", str(path), "--port", "0"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "lineage_dir" in err and "--lineage-dir" in err
    assert not (tmp_path / "t").exists()


def test_collect_refuses_an_unknown_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, {"token_id_capture": {"enabled": True, "dir": "/t", "sinkk": "x"}})
    code = main(["collect", "--model-url", "http://127.0.0.1:1", "--output",
                 str(tmp_path / "out.jsonl"), "--token-id-capture-config", str(path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "token_id_capture.sinkk" in err
    assert not (tmp_path / "out.jsonl").exists()
