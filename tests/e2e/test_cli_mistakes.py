"""A user's mistakes: one line on stderr naming the problem, exit status 2, no traceback, and
the directory tree exactly as it was (nothing created, nothing overwritten).

Each case runs ``ngcapture`` in a fresh working directory holding a few files (a file where a
directory is expected, an earlier output, rollout files that are not JSONL...); the capture
servers are real processes on loopback (the e2e ``stack``). The commands run in-process
through ``capture_core.cli.main`` (the console script's own entry point), so that 40 cases
stay fast; ``test_cli.py`` runs the installed script itself.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from capture_core.cli import main
from tests.e2e.conftest import Stack


@dataclass(frozen=True)
class Mistake:
    name: str
    args: tuple[str, ...]
    says: tuple[str, ...]  # every one of these appears in the error line


MISTAKES = [
    # --- ngcapture serve ---------------------------------------------------------------------
    Mistake("upstream not a URL", ("serve", "--upstream", "not-a-url"), ("--upstream", "'not-a-url'", "http://")),
    Mistake("upstream ftp", ("serve", "--upstream", "ftp://127.0.0.1:21"), ("ftp://127.0.0.1:21", "http://")),
    Mistake("upstream bad port", ("serve", "--upstream", "http://host:notaport"), ("http://host:notaport", "port")),
    Mistake("upstream without host", ("serve", "--upstream", "http://:8001"), ("http://:8001", "no host")),
    Mistake("upstream credentials", ("serve", "--upstream", "http://u:p@127.0.0.1:1"), ("credentials",)),
    Mistake("upstream missing", ("serve",), ("--upstream", "Missing")),
    Mistake("capture dir is a file", ("serve", "--upstream", "http://127.0.0.1:1", "--capture-dir", "afile"), ("--capture-dir", "{cwd}/afile", "is a file")),
    Mistake("capture dir under a file", ("serve", "--upstream", "http://127.0.0.1:1", "--capture-dir", "afile/calls"), ("{cwd}/afile/calls", "{cwd}/afile is a file")),
    Mistake("serve port in use", ("serve", "--upstream", "http://127.0.0.1:1", "--capture-dir", "new-calls", "--port", "{busy}"), ("port {busy}", "in use", "--port")),
    Mistake("port out of range", ("serve", "--upstream", "http://127.0.0.1:1", "--port", "70000"), ("--port", "70000")),
    Mistake("port not a number", ("serve", "--upstream", "http://127.0.0.1:1", "--port", "http"), ("--port", "'http'")),
    Mistake("idle timeout zero", ("serve", "--upstream", "http://127.0.0.1:1", "--idle-timeout-s", "0"), ("--idle-timeout-s", "greater than 0")),
    Mistake("no client connections", ("serve", "--upstream", "http://127.0.0.1:1", "--max-client-connections", "0"), ("--max-client-connections",)),
    Mistake("lineage without token", ("serve", "--upstream", "http://127.0.0.1:1", "--lineage-dir", "ledgers"), ("NGCAPTURE_CONTROL_TOKEN",)),
    Mistake("port file is a directory", ("serve", "--upstream", "http://127.0.0.1:1", "--port-file", "adir"), ("--port-file", "{cwd}/adir", "directory")),
    Mistake("unknown option", ("serve", "--upstream", "http://127.0.0.1:1", "--captur-dir", "x"), ("--captur-dir",)),
    # --- ngcapture worker ----------------------------------------------------------------------
    Mistake("worker port in use", ("worker", "--port", "{busy}"), ("port {busy}", "in use")),
    Mistake("staging dir is a file", ("worker", "--port", "0", "--staging-dir", "afile"), ("--staging-dir", "{cwd}/afile")),
    Mistake("negative ttft", ("worker", "--ttft-ms", "-1"), ("--ttft-ms", "-1")),
    # --- ngcapture collect ---------------------------------------------------------------------
    Mistake("nothing listens", ("collect", "--model-url", "http://127.0.0.1:{dead}", "--output", "out/r.jsonl"), ("http://127.0.0.1:{dead}", "no server answers")),
    Mistake("model url not a URL", ("collect", "--model-url", "localhost:8000", "--output", "r.jsonl"), ("--model-url", "localhost:8000")),
    Mistake("output exists", ("collect", "--model-url", "{server}", "--output", "earlier.jsonl", "--no-run-id"), ("{cwd}/earlier.jsonl", "--resume", "--overwrite")),
    Mistake("resume and overwrite", ("collect", "--model-url", "{server}", "--output", "earlier.jsonl", "--resume", "--overwrite"), ("--resume", "--overwrite")),
    Mistake("capture dir missing", ("collect", "--model-url", "{server}", "--output", "r.jsonl", "--capture-dir", "nowhere"), ("--capture-dir", "{cwd}/nowhere", "does not exist")),
    Mistake("collect capture dir is a file", ("collect", "--model-url", "{server}", "--output", "r.jsonl", "--capture-dir", "afile"), ("{cwd}/afile", "is a file")),
    Mistake("capture dir mismatch", ("collect", "--model-url", "{server}", "--output", "r.jsonl", "--capture-dir", "adir"), ("{server}", "{server_dir}", "{cwd}/adir")),
    Mistake("server does not capture", ("collect", "--model-url", "{plain}", "--output", "r.jsonl", "--capture-dir", "adir"), ("{plain}", "does not capture", "{cwd}/adir")),
    Mistake("input missing", ("collect", "--model-url", "{server}", "--output", "r.jsonl", "--input", "tasks.jsonl"), ("--input", "{cwd}/tasks.jsonl")),
    Mistake("invalid run id", ("collect", "--model-url", "{server}", "--output", "r.jsonl", "--run-id", "../up"), ("'../up'", "run id")),
    Mistake("output is a directory", ("collect", "--model-url", "{server}", "--output", "adir"), ("--output", "{cwd}/adir", "directory")),
    Mistake("zero repeats", ("collect", "--model-url", "{server}", "--output", "r.jsonl", "--num-repeats", "0"), ("--num-repeats",)),
    # --- analysis commands ---------------------------------------------------------------------
    Mistake("report missing capture dir", ("report", "--capture-dir", "results/model-calls"), ("{cwd}/results/model-calls", "does not exist")),
    Mistake("report capture dir is a file", ("report", "--capture-dir", "afile"), ("{cwd}/afile",)),
    Mistake("report on nothing", ("report",), ("capture directory", "rollout file")),
    Mistake("binary rollouts", ("report", "--rollouts", "binary.jsonl", "--strict"), ("{cwd}/binary.jsonl", "binary", "line 1")),
    Mistake("rollouts not objects", ("report", "--rollouts", "array.jsonl", "--strict"), ("{cwd}/array.jsonl", "1 of 1 line", "list")),
    Mistake("empty rollouts", ("report", "--rollouts", "empty.jsonl", "--strict"), ("{cwd}/empty.jsonl", "empty")),
    Mistake("rollouts not JSONL", ("diff", "text.jsonl", "earlier.jsonl", "--strict"), ("{cwd}/text.jsonl", "2 of 2", "line 1")),
    Mistake("diff run missing", ("diff", "earlier.jsonl", "gone"), ("{cwd}/gone", "does not exist")),
    Mistake("diff bad gate", ("diff", "earlier.jsonl", "earlier.jsonl", "--gate", "latency=0.1"), ("--gate 'latency=0.1'",)),
    Mistake("diff same labels", ("diff", "earlier.jsonl", "earlier.jsonl"), ("--label-a",)),
    Mistake("index missing dir", ("index", "nowhere"), ("{cwd}/nowhere", "does not exist")),
    Mistake("unknown command", ("sreve",), ("sreve",)),
]  # fmt: skip


def test_there_are_enough_mistakes() -> None:
    assert len(MISTAKES) >= 25
    assert len({m.name for m in MISTAKES}) == len(MISTAKES)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port that is bound and listening (taken) for the whole test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port that is bound but not listening: connecting to it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _workdir(cwd: Path) -> None:
    (cwd / "afile").write_text("not a directory\n")
    (cwd / "adir").mkdir()
    (cwd / "earlier.jsonl").write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0}\n')
    (cwd / "binary.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00")
    (cwd / "array.jsonl").write_text("[1, 2, 3]\n")
    (cwd / "empty.jsonl").write_text("")
    (cwd / "text.jsonl").write_text("id,reward\n0,1.0\n")


def _tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its content's digest (directories as ``dir``)."""
    found = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        found[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.name)
def test_a_mistake_is_one_line_exit_2_and_changes_nothing(
    mistake: Mistake,
    stack: Stack,
    tmp_path: Path,
    busy_port: int,
    dead_port: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    _workdir(cwd)
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("NGCAPTURE_CONTROL_TOKEN", raising=False)
    values = {"cwd": str(cwd), "busy": busy_port, "dead": dead_port, "server": stack.captured.url,
              "plain": stack.uncaptured.url, "server_dir": str(stack.store.root)}  # fmt: skip
    before = _tree(tmp_path)
    code = main([arg.format(**values) for arg in mistake.args])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (out, err)
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ngcapture {mistake.args[0]}: error: ") or mistake.name == (
        "unknown command"
    ), lines[0]
    for expected in mistake.says:
        assert expected.format(**values) in lines[0], lines[0]
    assert _tree(tmp_path) == before


def test_export_without_a_wandb_key_names_login_and_offline_mode(tmp_path: Path) -> None:
    """The installed script, as a user without a W&B account runs it."""
    import subprocess
    import sys

    rollouts = tmp_path / "work" / "rollouts.jsonl"
    rollouts.parent.mkdir()
    rollouts.write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"), WANDB_DIR=str(tmp_path / "wandb-dir"),
               WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), WANDB_SILENT="true",
               NETRC=str(tmp_path / "home" / ".netrc"))  # fmt: skip
    before = _tree(rollouts.parent)
    done = subprocess.run(
        [sys.executable, "-m", "capture_core.cli", "export-wandb", "--rollouts", str(rollouts),
         "--project", "p", "--quiet"],
        capture_output=True, text=True, timeout=120, env=env, cwd=rollouts.parent, check=False,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(lines) == 1, done.stderr
    assert "wandb login" in lines[0] and "WANDB_MODE=offline" in lines[0]
    assert _tree(rollouts.parent) == before
