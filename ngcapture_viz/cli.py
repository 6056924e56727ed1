"""The analysis commands of ``ngcapture``: ``index``, ``report``, ``diff`` and ``export-wandb``.

``capture_core.cli`` lists these commands by name and imports this module only when one of
them runs, so the server commands never import Polars or Plotly and ``capture_core`` never
imports ``ngcapture_viz``. A run argument is a run folder (holding ``model-calls/`` and,
optionally, ``rollouts.jsonl``), a capture directory, or a rollout JSONL file.

A rollout file that is not what it claims (not JSON lines, binary, lines that are not
objects, empty) gives one warning line on stderr; ``--strict`` makes it an error (exit 2).
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from capture_core.cli import UserError
from ngcapture_viz import RolloutFileWarning, SourceError, VizError

__all__ = ["diff", "export_wandb", "index", "report", "resolve_run"]

F = TypeVar("F", bound=Callable[..., Any])

_RUN_PATH = click.Path(path_type=Path)


def resolve_run(path: Path) -> tuple[Path | None, Path | None]:
    """``(capture_dir, rollouts)`` for a run folder, a capture directory or a rollout file.

    A run folder holds ``model-calls/`` and/or ``rollouts.jsonl``; a capture directory holds
    ``*.capture.jsonl`` files (or nothing yet).

    Raises:
        SourceError: the path does not exist, or is a folder with neither.

    Example:
        >>> resolve_run(Path("results/demo/ckpt-100"))  # doctest: +SKIP
        (PosixPath('results/demo/ckpt-100/model-calls'), PosixPath('.../rollouts.jsonl'))
    """
    if path.is_file():
        return None, path
    if not path.is_dir():
        raise SourceError(f"{str(path.absolute())!r} does not exist")
    store = path / "model-calls"
    rollouts = path / "rollouts.jsonl"
    if store.is_dir() or rollouts.is_file():
        return (
            store if store.is_dir() else None,
            rollouts if rollouts.is_file() else None,
        )
    entries = [entry.name for entry in path.iterdir()]
    if not entries or any(name.endswith(".capture.jsonl") for name in entries):
        return path, None
    raise SourceError(
        f"{str(path.absolute())!r} is neither a run folder (model-calls/, rollouts.jsonl) nor "
        "a capture directory (*.capture.jsonl files)"
    )


@contextlib.contextmanager
def _reading(*, strict: bool) -> Iterator[None]:
    """Analysis errors as one-line user errors; rollout-file warnings as one stderr line each
    (errors with ``strict``)."""
    command = click.get_current_context().command_path

    def one_line(message: Warning | str, *args: object, **kwargs: object) -> None:
        print(f"{command}: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("error" if strict else "always", RolloutFileWarning)
        warnings.showwarning = one_line
        try:
            yield
        except RolloutFileWarning as exc:
            raise UserError(f"{exc} (--strict)") from None
        except VizError as exc:
            raise UserError(str(exc)) from None


def _quiet(function: F) -> F:
    return click.option("--quiet", is_flag=True, help="No progress bar.")(function)


def _strict(function: F) -> F:
    return click.option(
        "--strict",
        is_flag=True,
        help="A rollout file that is not what it "
        "claims (not JSON lines, lines that are not objects, empty) is an "
        "error (exit 2), not a warning.",
    )(function)


def _label(function: F) -> F:
    return click.option(
        "--label", help="Name of the run in tables and figures.  [default: the run folder's name]"
    )(function)


def _sources(function: F) -> F:
    function = click.option(
        "--rollouts",
        type=_RUN_PATH,
        metavar="FILE",
        help="Rollout JSONL written by ngcapture collect (rewards, attachments).",
    )(function)
    return click.option(
        "--capture-dir",
        type=_RUN_PATH,
        metavar="DIR",
        help="Capture directory (*.capture.jsonl files); it must exist, "
        "nothing is created in it but the index.",
    )(function)


@click.command(
    epilog="\b\nExample:\n  ngcapture index results/model-calls\n"
    "  ngcapture index /shared/run-7/model-calls --ray 10.0.0.5:6379   # on a Ray cluster"
)
@click.argument("capture_dir", type=_RUN_PATH)
@click.option(
    "--index-dir",
    type=_RUN_PATH,
    metavar="DIR",
    help="Where to keep the index.  [default: CAPTURE_DIR/.ngcapture-index]",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="auto",
    metavar="[ADDRESS]",
    help="Parse on a Ray cluster: ADDRESS (host:port), or alone the one RAY_ADDRESS or "
    "`ray start` names, else a new local one. The store and the index folder must be on a "
    "file system every node sees.",
)
@_quiet
def index(
    *,
    capture_dir: Path,
    index_dir: Path | None,
    ray_address: str | None,
    quiet: bool,
) -> int:
    """Build or refresh the sidecar index of CAPTURE_DIR, so that opening it is fast."""
    from ngcapture_viz import CaptureIndex

    engine = "ray" if ray_address is not None else "local"
    with _reading(strict=False):
        built = CaptureIndex(
            capture_dir,
            index_dir=index_dir,
            engine=engine,
            ray_address=ray_address,
        )
        stats = built.refresh(progress=not quiet, require_write=True)
    print(
        f"indexed {stats.files:,} capture files ({built.calls.height:,} calls, "
        f"{built.damaged.height:,} damaged lines): {stats.new:,} new, {stats.appended:,} "
        f"appended, {stats.reread:,} re-read, {stats.reused:,} unchanged, {stats.removed:,} "
        f"removed; parsed {stats.bytes_parsed / 1e6:,.1f} MB with {stats.workers} process(es)"
        + (" on Ray" if engine == "ray" else "")
    )
    print(f"index: {stats.location}")
    return 0


REPORT_EXAMPLE = """\b
Example:
  ngcapture report --capture-dir results/demo/ckpt-200/model-calls \\
      --rollouts results/demo/ckpt-200/rollouts.jsonl --out report.html"""


@click.command(epilog=REPORT_EXAMPLE)
@_sources
@click.option(
    "--out",
    type=_RUN_PATH,
    default=Path("report.html"),
    metavar="FILE",
    help="The HTML file to write (replaced if it exists).",
)
@_label
@click.option("--title", help="Title of the report.  [default: from the run's label]")
@click.option(
    "--tokens-dir",
    type=_RUN_PATH,
    metavar="DIR",
    help="Token-id capture store (token_id_capture.dir): adds each rollout's store state to "
    "the report's token-capture section.",
)
@_strict
@_quiet
def report(
    *,
    capture_dir: Path | None,
    rollouts: Path | None,
    tokens_dir: Path | None,
    out: Path,
    label: str | None,
    title: str | None,
    strict: bool,
    quiet: bool,
) -> int:
    """Write the self-contained HTML report of a run: one offline file, no network."""
    from ngcapture_viz import open_run, write_report

    with _reading(strict=strict):
        run = open_run(
            capture_dir, rollouts, label=label, progress=not quiet, tokens_dir=tokens_dir
        )
        path = write_report(run, out, title=title)
    print(f"report: {path.resolve()}")
    return 0


def _gates(values: Sequence[str], *, relative: bool = True) -> list[tuple[str, float, bool]]:
    """Parse ``--gate`` / ``--gate-abs`` ``METRIC=MAX_INCREASE`` values before any work."""
    from ngcapture_viz.diff import METRIC_NAMES

    flag = "--gate" if relative else "--gate-abs"
    meaning = "0.1 means +10%" if relative else "in the metric's unit: 0.02 on a rate is +2 pp"
    gates = []
    for value in values:
        metric, sep, limit = value.partition("=")
        if not sep or metric not in METRIC_NAMES:
            raise UserError(
                f"{flag} {value!r}: expected METRIC=MAX_INCREASE with METRIC one of "
                f"{', '.join(METRIC_NAMES)}"
            )
        try:
            number = float(limit)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise UserError(f"{flag} {value!r}: MAX_INCREASE must be a finite number ({meaning})")
        gates.append((metric, number, relative))
    return gates


DIFF_EXAMPLE = """\b
Example:
  ngcapture diff results/demo/ckpt-100 results/demo/ckpt-200 --gate latency_p95_ms=0.1 \\
      --gate-abs error_rate=0.02

Exit status 1 when a gate fails (B is confidently worse than A by more than the limit)."""


@click.command(epilog=DIFF_EXAMPLE)
@click.argument("a", type=_RUN_PATH)
@click.argument("b", type=_RUN_PATH)
@click.option("--label-a", help="Name of run A.  [default: its folder's name]")
@click.option("--label-b", help="Name of run B.  [default: its folder's name]")
@click.option(
    "--n-boot",
    type=click.IntRange(min=100),
    default=2000,
    help="Bootstrap resamples for the 95% intervals.",
)
@click.option("--seed", type=int, default=0, help="Seed of the bootstrap.")
@click.option("--out", type=_RUN_PATH, metavar="FILE", help="Also write the diff table as CSV.")
@click.option(
    "--gate",
    multiple=True,
    metavar="METRIC=MAX_INCREASE",
    help="Exit 1 if METRIC regressed by more than MAX_INCREASE (relative: 0.1 is "
    "+10%); repeatable.",
)
@click.option(
    "--gate-abs",
    multiple=True,
    metavar="METRIC=MAX_INCREASE",
    help="The same in the metric's own unit (rates: 0.02 is +2 percentage points), "
    "for metrics that can start from 0; repeatable.",
)
@_strict
@_quiet
def diff(
    *,
    a: Path,
    b: Path,
    label_a: str | None,
    label_b: str | None,
    n_boot: int,
    seed: int,
    out: Path | None,
    gate: tuple[str, ...],
    gate_abs: tuple[str, ...],
    strict: bool,
    quiet: bool,
) -> int:
    """Compare run B with run A (checkpoints): metric by metric, with 95% bootstrap intervals
    and Holm-adjusted p-values. A and B are run folders, capture directories or rollout
    files."""
    from ngcapture_viz import assert_no_regression, open_run
    from ngcapture_viz import diff as compare

    gates = _gates(gate) + _gates(gate_abs, relative=False)
    with _reading(strict=strict):
        run_a = open_run(*resolve_run(a), label=label_a, progress=not quiet)
        run_b = open_run(*resolve_run(b), label=label_b, progress=not quiet)
        if run_a.label == run_b.label:
            raise UserError(f"both runs are labelled {run_a.label!r}: pass --label-a / --label-b")
        result = compare(run_a, run_b, n_boot=n_boot, seed=seed)
    print(result)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        result.frame.write_csv(out)
        print(f"diff table: {out.resolve()}")
    failed = 0
    for metric, limit, relative in gates:
        try:
            assert_no_regression(result, metric, limit, relative=relative)
        except AssertionError as exc:
            print(f"REGRESSION: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


WANDB_EXAMPLE = """\b
Example:
  wandb login                       # once; or set WANDB_API_KEY
  ngcapture export-wandb --capture-dir results/model-calls --rollouts results/rollouts.jsonl \\
      --project my-evals
  WANDB_MODE=offline ngcapture export-wandb ...   # no account: write locally, `wandb sync` later

Request and response payloads never leave the machine; --payload-digests adds their hashes."""


@click.command(epilog=WANDB_EXAMPLE)
@_sources
@click.option("--project", required=True, help="W&B project to log to.")
@click.option("--entity", help="W&B entity (user or team).  [default: your default entity]")
@click.option("--name", help="Name of the W&B run.  [default: chosen by W&B]")
@_label
@click.option(
    "--payload-digests",
    is_flag=True,
    help="Add a SHA-256 digest of each call's request and response (never the "
    "payloads themselves).",
)
@_strict
@_quiet
def export_wandb(
    *,
    capture_dir: Path | None,
    rollouts: Path | None,
    project: str,
    entity: str | None,
    name: str | None,
    label: str | None,
    payload_digests: bool,
    strict: bool,
    quiet: bool,
) -> int:
    """Log payload-free tables of a run (calls, rollouts, gaps, tool calls) and its summary
    metrics to Weights & Biases."""
    from ngcapture_viz import export_to_wandb, open_run

    with _reading(strict=strict):
        run = open_run(capture_dir, rollouts, label=label, progress=not quiet)
        with _wandb_errors():
            result = export_to_wandb(
                run, project=project, entity=entity, name=name, payload_digests=payload_digests
            )
    for table, rows in result.rows.items():
        print(f"{table}: {rows:,} of {result.total_rows[table]:,} rows logged")
    for note in result.notes:
        print(f"note: {note}")
    print(f"W&B run {result.run_id}: {result.run_dir}")
    return 0


@contextlib.contextmanager
def _wandb_errors() -> Iterator[None]:
    """W&B's login and network refusals as one line that says what to do."""
    try:
        yield
    except Exception as exc:
        if not type(exc).__module__.startswith("wandb."):
            raise
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UserError(
            f"W&B refused the export: {reason} Log in with `wandb login` (or set "
            "WANDB_API_KEY), or export without an account with WANDB_MODE=offline and upload "
            "later with `wandb sync`"
        ) from None
