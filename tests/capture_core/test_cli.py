"""How ``ngcapture`` ends: a bug says it is one, an interrupt is quiet, the machine's refusals are
one line (the user's mistakes are in ``tests/e2e/test_cli_mistakes.py``)."""

from __future__ import annotations

import pytest

from capture_core.cli import EXIT_BUG, EXIT_USAGE, main, servers


def _raising(exc: BaseException):  # type: ignore[no-untyped-def]
    def callback(**options: object) -> int:
        raise exc

    return callback


def test_a_bug_prints_its_traceback_then_says_it_is_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(servers.worker, "callback", _raising(RuntimeError("boom")))
    code = main(["worker", "--port", "0"])
    err = capsys.readouterr().err
    assert code == EXIT_BUG == 70
    assert "Traceback (most recent call last)" in err and "RuntimeError: boom" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("ngcapture worker: internal error: this is a bug in ngcapture")


def test_an_interrupt_is_one_line_and_status_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(servers.worker, "callback", _raising(KeyboardInterrupt()))
    assert main(["worker", "--port", "0"]) == 130
    assert capsys.readouterr().err.strip() == "ngcapture worker: interrupted"


def test_the_machine_refusing_is_one_line_not_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = PermissionError(13, "Permission denied", "/srv/results/report.html")
    monkeypatch.setattr(servers.worker, "callback", _raising(refused))
    assert main(["worker", "--port", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/srv/results/report.html" in err and "Traceback" not in err


def test_no_arguments_shows_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "") and "Commands:" in out and out.startswith("Usage: ngcapture")
