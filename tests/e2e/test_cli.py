"""The ``ngcapture`` command as a user meets it: help, version, services that start and stop
cleanly, and collections that keep every run's data."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import httpx
import orjson
import pytest

from capture_core import CaptureStore, __version__
from capture_core.cli import COMMANDS, cli
from capture_core.store_id import read_store_id
from capture_core.testing.processes import run_capture_server, run_worker, start_service


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_worker_and_server_stop_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    worker = start_service("worker", ["worker", "--seed", "3"])
    server = start_service(
        "capture-server",
        ["serve", "--upstream", worker.url, "--capture-dir", str(tmp_path / "calls")],
    )
    try:
        assert f"listening on {worker.url}" in worker.log()
        assert f"capturing model calls into {tmp_path / 'calls'}" in server.log()
        models = httpx.get(server.url + "/ng-rollout/r-1/v1/models", timeout=10)
        assert models.status_code == 200
        assert models.json()["object"] == "list"
        health = httpx.get(server.url + "/ngcapture/health", timeout=10).json()
        assert health["status"] == "ok"
        assert health["capture"]["dir"] == str((tmp_path / "calls").resolve())
        assert health["capture"]["store_id"] == read_store_id(tmp_path / "calls")
    finally:
        codes = []
        for service in (server, worker):
            service.process.send_signal(sig)
            try:
                codes.append(service.process.wait(15))
            finally:
                service.stop()  # never leave a process behind, whatever happened
    assert codes == [0, 0], (server.log(), worker.log())
    assert "stopped" in server.log()
    assert "stopped" in worker.log()
    assert not (tmp_path / "calls" / "r-1.capture.jsonl").exists()  # /v1/models: not captured
    # Request logging is off by default: no access line, no HTTP client line per call.
    assert "/ng-rollout/r-1/v1/models" not in server.log()
    assert "HTTP Request" not in server.log()


def test_access_log_turns_on_one_line_per_request(tmp_path: Path) -> None:
    with run_worker(seed=1) as worker:
        server = start_service("capture-server", ["serve", "--upstream", worker.url,
                                                  "--access-log"])  # fmt: skip
        try:
            assert "capture is off (no --capture-dir)" in server.log()
            for _ in range(12):  # more than the rate limit of other messages lets through
                httpx.get(server.url + "/ng-rollout/r-1/v1/models", timeout=10)
            deadline = time.monotonic() + 10
            while (
                server.log().count("/ng-rollout/r-1/v1/models") < 12 and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            assert server.log().count("/ng-rollout/r-1/v1/models") == 12, server.log()
        finally:
            server.stop()


# --- every command explains itself ------------------------------------------------------------


def ngcapture(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it."""
    script = Path(sys.executable).with_name("ngcapture")
    return subprocess.run([str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, check=False)  # fmt: skip


def _commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(cli, info_name="ngcapture")
    found = []
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None, name
        found.append((name, command))
    return found


def test_help_lists_every_command_on_one_line_each_and_imports_no_command() -> None:
    done = ngcapture("--help")
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("Commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split()[0] for line in listed] == list(COMMANDS)
    for line, (_, summary) in zip(listed, COMMANDS.values(), strict=True):
        assert line.rstrip().endswith(summary)  # the whole summary on the command's line
    assert "``" not in done.stdout  # no RST markup
    code = (
        "import sys, time; t = time.perf_counter(); from capture_core.cli import main; "
        "main(['--help']); print(round(time.perf_counter() - t, 3)); "
        "print(sorted(m for m in sys.modules if m.startswith(('ngcapture_viz', "
        "'capture_core.server', 'capture_core.collect', 'capture_core.cli.'))))"
    )
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, timeout=60)  # fmt: skip
    assert imported.stdout.splitlines()[-1] == "['capture_core.cli._base']"


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str) -> None:
    done = ngcapture(flag)
    assert (done.returncode, done.stdout.strip()) == (0, f"ngcapture {__version__}")


def test_every_option_has_help_text_and_shows_its_default() -> None:
    """Every subcommand's --help: an example, help text for every option, the defaults shown."""
    for name, command in _commands():
        parent = click.Context(cli, info_name="ngcapture", show_default=True)
        ctx = click.Context(command, info_name=name, parent=parent, terminal_width=400,
                            max_content_width=400)  # fmt: skip
        text = command.get_help(ctx)
        assert "Example" in text and f"ngcapture {name} " in text, name
        assert command.help and command.help.strip(), name
        for param in command.params:
            if not isinstance(param, click.Option) or param.name == "help":
                continue
            assert param.help and param.help.strip(), f"ngcapture {name} {param.opts[0]}"
            default = param.default
            unset = default is None or type(default).__name__ == "Sentinel"  # Click's UNSET
            if unset or default is False or param.multiple:
                continue
            shown = "no-" + param.secondary_opts[0][5:] if param.secondary_opts else default
            assert f"default: {shown}" in text, f"ngcapture {name} {param.opts[0]}: {default!r}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_subcommand_help_runs_as_a_user_runs_it(name: str) -> None:
    done = ngcapture(name, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: ngcapture {name} [OPTIONS]")
    assert "Example" in done.stdout and not done.stderr


# --- collect keeps every run's data ------------------------------------------------------------


def _records(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file()}  # fmt: skip


def _collected(done: subprocess.CompletedProcess[str], output: Path, store: CaptureStore) -> str:
    """Check one finished collect: complete, its own run id, one capture file per rollout."""
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split("run id: ", 1)[1].split()[0]
    records = _records(output)
    assert len(records) == 8 and "rollouts: 8 ok, 0 failed" in done.stdout
    for record in records:
        capture = record["ng_model_call_capture"]
        assert isinstance(capture, dict) and record["_ng_run_id"] == run_id
        assert (
            capture["rollout_id"]
            == f"{run_id}.{record['_ng_task_index']}-{record['_ng_rollout_index']}"
        )
        lines = store.path_for(capture["rollout_id"]).read_bytes().splitlines()
        assert capture["metrics"]["num_calls"] == len(lines) >= 1
        assert "gaps" not in capture
    return run_id


def test_two_collects_share_a_server_and_a_directory_without_mixing(tmp_path: Path) -> None:
    capture_dir = tmp_path / "model-calls"
    with (
        run_worker(seed=5, ttft_ms=1, ms_per_token=0.01) as worker,
        run_capture_server(worker.url, capture_dir) as server,
    ):
        store = CaptureStore(capture_dir)
        args = ["collect", "--model-url", server.url, "--capture-dir", capture_dir,
                "--limit", "4", "--num-repeats", "2"]  # fmt: skip
        first = ngcapture(*args, "--output", "one/rollouts.jsonl", cwd=tmp_path)
        first_id = _collected(first, tmp_path / "one" / "rollouts.jsonl", store)
        assert f"output: {tmp_path / 'one' / 'rollouts.jsonl'}" in first.stdout  # resolved
        # The server's facts journal grows with every call, whichever run made it.
        kept = {k: v for k, v in _files(capture_dir).items() if not k.startswith(".facts/")}
        second = ngcapture(*args, "--output", "two/rollouts.jsonl", cwd=tmp_path)
        second_id = _collected(second, tmp_path / "two" / "rollouts.jsonl", store)
        assert second_id != first_id
        after = _files(capture_dir)
        assert {k: v for k, v in after.items() if k in kept} == kept  # run one untouched
        assert len(store.rollout_ids()) == 16
        assert not [name for name in after if name.startswith((".cleared", "overwritten-"))]

        # Resuming run one finds it complete, under its own run id.
        resumed = ngcapture(*args, "--output", "one/rollouts.jsonl", "--resume", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
        assert f"run id: {first_id}" in resumed.stdout
        assert "dispatched 0; 8 already finished" in resumed.stdout

        # A collect that reads another directory than the server writes stops before dispatch.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        before = _files(capture_dir)
        wrong = ngcapture("collect", "--model-url", server.url, "--capture-dir", elsewhere,
                          "--output", "three/rollouts.jsonl", cwd=tmp_path)  # fmt: skip
        assert wrong.returncode == 2
        assert str(capture_dir) in wrong.stderr and str(elsewhere) in wrong.stderr
        assert not (tmp_path / "three").exists()
        assert _files(capture_dir) == before  # no call was made
        metrics = httpx.get(server.url + "/ngcapture/metrics", timeout=10).text
        assert "Traceback" not in wrong.stderr and len(wrong.stderr.splitlines()) == 1
        assert metrics  # the server is still serving


def test_overwrite_moves_earlier_data_to_a_dated_folder_it_prints(tmp_path: Path) -> None:
    capture_dir = tmp_path / "model-calls"
    output = tmp_path / "rollouts.jsonl"
    with (
        run_worker(seed=6, ttft_ms=1, ms_per_token=0.01) as worker,
        run_capture_server(worker.url, capture_dir) as server,
    ):
        args = ["collect", "--model-url", server.url, "--capture-dir", capture_dir,
                "--output", output, "--limit", "3", "--no-run-id"]  # fmt: skip
        assert ngcapture(*args).returncode == 0
        earlier_output, earlier_capture = output.read_bytes(), _files(capture_dir)
        refused = ngcapture(*args)
        assert refused.returncode == 2 and "--overwrite" in refused.stderr
        assert output.read_bytes() == earlier_output
        done = ngcapture(*args, "--overwrite")
        assert done.returncode == 0, done.stderr
    moved = [Path(line.split(": ", 1)[1]) for line in done.stdout.splitlines()
             if line.startswith("earlier data moved to: ")]  # fmt: skip
    assert [p.parent for p in moved] == [tmp_path, capture_dir]
    assert all(p.is_dir() and p.name.startswith("overwritten-20") for p in moved)
    assert (moved[0] / "rollouts.jsonl").read_bytes() == earlier_output
    archived = {name.split(".")[0]: data for name, data in _files(moved[1]).items()}
    for name, data in earlier_capture.items():
        if name.endswith(".capture.jsonl"):
            assert archived[name.split(".")[0]] == data
    assert len(_records(output)) == 3
    # The analysis side reads the directory as before: the archive folder is no stray file.
    import ngcapture_viz as ngv

    run = ngv.open_run(capture_dir, output, progress=False)
    assert run.rollouts.height == 3
    assert "capture_dir_foreign_file" not in run.gaps["code"].cast(str).to_list()


def test_serving_logs_one_summary_line_per_interval_with_activity(tmp_path: Path) -> None:
    with run_worker(seed=1) as worker:
        server = start_service("capture-server", ["serve", "--upstream", worker.url,
                                                  "--capture-dir", str(tmp_path / "calls"),
                                                  "--summary-interval-s", "1"])  # fmt: skip
        try:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            for _ in range(3):
                httpx.post(server.url + "/ng-rollout/s-1/v1/chat/completions", json=body,
                           timeout=10)  # fmt: skip
            deadline = time.monotonic() + 15
            while _summarised(server.log()) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(2.5)  # two quiet intervals: they must add no line
        finally:
            server.stop()
    summaries = [line for line in server.log().splitlines() if "call(s) captured" in line]
    assert _summarised(server.log()) == 3, server.log()  # every call counted once
    assert all("0 capture failure(s)" in line for line in summaries)
    assert len(summaries) <= 3  # a line per interval with activity, none for quiet ones


def _summarised(log: str) -> int:
    return sum(int(n) for n in re.findall(r"last 1 s: (\d+) call\(s\) captured", log))
