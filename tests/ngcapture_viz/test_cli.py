"""The analysis commands of ``ngcapture``, run as a user runs them: a separate process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from capture_core.testing import RunSpec, write_run
from ngcapture_viz import open_run
from ngcapture_viz.cli import resolve_run
from ngcapture_viz.frames import CALLS, GAPS, ROLLOUTS, TOOL_CALLS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def ngcapture(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "capture_core.cli", *map(str, args)],
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli") / "ckpt-1"
    write_run(folder, RunSpec(tasks=6, repeats=2, seed=3))
    return folder


def test_index_builds_then_reuses(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", RunSpec(tasks=4, repeats=2))
    first = ngcapture("index", run.capture_dir, "--quiet")
    assert "8 new" in first.stdout, first.stdout
    assert f"index: {run.capture_dir / '.ngcapture-index'}" in first.stdout
    second = ngcapture("index", run.capture_dir, "--quiet")
    assert "8 unchanged" in second.stdout
    assert "parsed 0.0 MB" in second.stdout
    # open_run agrees with what the command indexed, and reuses it.
    opened = open_run(run.capture_dir)
    assert opened.index_stats is not None
    assert opened.index_stats.reused == 8
    assert opened.calls.height == run.num_calls


def test_index_of_a_missing_directory_is_one_clear_line(tmp_path: Path) -> None:
    done = ngcapture("index", tmp_path / "nowhere", check=False)
    assert done.returncode == 2
    assert "does not exist" in done.stderr
    assert "Traceback" not in done.stderr


def test_resolve_run_accepts_folder_store_and_file(run_folder: Path) -> None:
    assert resolve_run(run_folder) == (run_folder / "model-calls", run_folder / "rollouts.jsonl")
    assert resolve_run(run_folder / "model-calls") == (run_folder / "model-calls", None)
    assert resolve_run(run_folder / "rollouts.jsonl") == (None, run_folder / "rollouts.jsonl")


def test_server_commands_do_not_import_the_analysis_side() -> None:
    code = (
        "import sys; from capture_core.cli import _parser; _parser(); "
        "print('polars' in sys.modules, 'ngcapture_viz' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("schema", [CALLS, ROLLOUTS, GAPS, TOOL_CALLS], ids=lambda s: s.name)
def test_docs_list_every_column_with_its_dtype(schema) -> None:  # type: ignore[no-untyped-def]
    text = (DOCS / "frames.md").read_text()
    section = text.split(f"### `{schema.name}`", 1)[1].split("###", 1)[0]
    for column in schema.columns:
        assert f"| `{column.name}` | {column.dtype} |" in section, column.name


def test_frames_match_their_declared_schemas(run_folder: Path) -> None:
    run = open_run(run_folder / "model-calls", run_folder / "rollouts.jsonl")
    assert run.calls.schema == CALLS.polars
    assert run.gaps.schema == GAPS.polars
    assert run.tool_calls.schema == TOOL_CALLS.polars
    fixed = pl.Schema(list(run.rollouts.schema.items())[: len(ROLLOUTS.names)])
    assert fixed == ROLLOUTS.polars
