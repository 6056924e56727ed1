"""The analysis commands of ``ngcapture``, run as a user runs them: a separate process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from capture_core.testing import RunSpec, write_run
from ngcapture_viz import SourceError, open_run
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
        "import sys; from capture_core.cli import main; "
        "codes = [main([name, '--help']) for name in ('worker', 'serve', 'collect')]; "
        "print('polars' in sys.modules, 'ngcapture_viz' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split()[-2:] == ["False", "False"]


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


def test_report_command_writes_one_offline_file(run_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "report.html"
    done = ngcapture(
        "report",
        "--capture-dir",
        run_folder / "model-calls",
        "--rollouts",
        run_folder / "rollouts.jsonl",
        "--out",
        out,
        "--quiet",
    )
    assert done.stdout.strip() == f"report: {out.resolve()}"
    html = out.read_text()
    assert html.count("<html") == 1
    assert "<script src=" not in html
    assert "ckpt-1" in html


@pytest.fixture(scope="module")
def slower_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli") / "ckpt-2"
    write_run(folder, RunSpec(tasks=6, repeats=2, seed=4, latency_scale=2.0))
    return folder


def test_diff_command_prints_the_table_and_gates(
    run_folder: Path, slower_folder: Path, tmp_path: Path
) -> None:
    table = tmp_path / "diff.csv"
    passed = ngcapture("diff", run_folder, slower_folder, "--n-boot", "300", "--out", table)
    assert "ckpt-2 vs ckpt-1" in passed.stdout
    assert "latency_p50_ms" in passed.stdout
    frame = pl.read_csv(table)
    assert set(frame["metric"]) >= {"latency_p50_ms", "error_rate", "calls_per_rollout"}
    # Latency doubled: a 10% gate must fail with exit code 1 and say why; a 500% gate passes.
    failed = ngcapture(
        "diff", run_folder, slower_folder, "--n-boot", "300", "--gate", "latency_p50_ms=0.1",
        check=False,
    )  # fmt: skip
    assert failed.returncode == 1
    assert "REGRESSION" in failed.stderr
    assert "latency_p50_ms" in failed.stderr
    loose = ngcapture(
        "diff", run_folder, slower_folder, "--n-boot", "300", "--gate", "latency_p50_ms=5",
    )  # fmt: skip
    assert loose.returncode == 0


def test_absolute_gates_work_where_relative_ones_cannot(
    run_folder: Path, slower_folder: Path
) -> None:
    # Latency doubled: +1 ms absolute is exceeded with confidence; an error-rate rise of
    # 50 percentage points is not (relative gates on rates fail when run a has 0 errors).
    done = ngcapture(
        "diff", run_folder, slower_folder, "--n-boot", "300",
        "--gate-abs", "latency_p50_ms=1", "--gate-abs", "error_rate=0.5", check=False,
    )  # fmt: skip
    assert done.returncode == 1
    regressions = [line for line in done.stderr.splitlines() if line.startswith("REGRESSION")]
    assert len(regressions) == 1 and "latency_p50_ms" in regressions[0]
    assert "ms" in regressions[0]  # limits are shown in the metric's unit, not in %
    passed = ngcapture(
        "diff", run_folder, slower_folder, "--n-boot", "300", "--gate-abs", "error_rate=0.5"
    )
    assert passed.returncode == 0
    bad = ngcapture("diff", run_folder, slower_folder, "--gate-abs", "error_rate=2pp", check=False)
    assert bad.returncode == 2 and "--gate-abs 'error_rate=2pp'" in bad.stderr


def test_diff_of_a_run_with_itself_needs_two_labels(run_folder: Path) -> None:
    done = ngcapture("diff", run_folder, run_folder, check=False)
    assert done.returncode == 2
    assert "--label-a" in done.stderr


def test_export_wandb_command_runs_offline(
    run_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
        path = tmp_path / variable.lower()
        path.mkdir()
        monkeypatch.setenv(variable, str(path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    done = ngcapture(
        "export-wandb",
        "--capture-dir",
        run_folder / "model-calls",
        "--rollouts",
        run_folder / "rollouts.jsonl",
        "--project",
        "ngcapture-cli-test",
        "--quiet",
    )
    run = open_run(run_folder / "model-calls", run_folder / "rollouts.jsonl")
    assert f"calls: {run.calls.height:,} of {run.calls.height:,} rows logged" in done.stdout
    assert f"rollouts: {run.rollouts.height:,} of" in done.stdout
    run_dir = Path(done.stdout.strip().splitlines()[-1].split(": ", 1)[1])
    assert run_dir.is_dir()
    assert str(tmp_path) in str(run_dir)
    assert list((run_dir / "files").rglob("*.table.json"))


def test_resolve_run_takes_a_folder_with_only_a_rollout_file(tmp_path: Path) -> None:
    (tmp_path / "rollouts.jsonl").write_text("")
    assert resolve_run(tmp_path) == (None, tmp_path / "rollouts.jsonl")
    with pytest.raises(SourceError, match="does not exist"):
        resolve_run(tmp_path / "missing")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("hello")
    with pytest.raises(SourceError, match="neither a run folder"):
        resolve_run(other)


@pytest.mark.parametrize(
    ("gate", "says"),
    [("latency_p95_ms", "METRIC=MAX_INCREASE"), ("latency_p95_ms=10%", "must be a finite number"),
     ("latency_p95_ms=nan", "must be a finite number"), ("latency_p96_ms=0.1", "METRIC=MAX_INCREASE")],
)  # fmt: skip
def test_a_bad_gate_is_refused_before_any_work(run_folder: Path, gate: str, says: str) -> None:
    done = ngcapture("diff", run_folder, run_folder / "missing", "--gate", gate, check=False)
    assert done.returncode == 2
    assert says in done.stderr
    assert repr(gate) in done.stderr
