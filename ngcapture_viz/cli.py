"""The analysis commands of ``ngcapture``: ``index``, ``report``, ``diff`` and ``export-wandb``.

``capture_core.cli`` hands these commands over here, so the server commands never import
Polars or Plotly. A run argument is a run folder (holding ``model-calls/`` and, optionally,
``rollouts.jsonl``), a capture directory, or a rollout JSONL file.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from capture_core.cli import ANALYSIS_COMMANDS
from ngcapture_viz.exceptions import SourceError, VizError

__all__ = ["COMMANDS", "main", "resolve_run"]

COMMANDS = ANALYSIS_COMMANDS  # one list, owned by the entry point that dispatches on it


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
        raise SourceError(f"{str(path)!r} does not exist")
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
        f"{str(path)!r} is neither a run folder (model-calls/, rollouts.jsonl) nor a capture "
        "directory (*.capture.jsonl files)"
    )


def _index(args: argparse.Namespace) -> int:
    from ngcapture_viz.load import CaptureIndex

    index = CaptureIndex(args.capture_dir, index_dir=args.index_dir, workers=args.workers)
    stats = index.refresh(progress=not args.quiet, require_write=True)
    print(
        f"indexed {stats.files:,} capture files ({index.calls.height:,} calls, "
        f"{index.damaged.height:,} damaged lines): {stats.new:,} new, {stats.appended:,} "
        f"appended, {stats.reread:,} re-read, {stats.reused:,} unchanged, {stats.removed:,} "
        f"removed; parsed {stats.bytes_parsed / 1e6:,.1f} MB with {stats.workers} process(es)"
    )
    print(f"index: {stats.location}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from ngcapture_viz.report import write_report
    from ngcapture_viz.run import open_run

    run = open_run(args.capture_dir, args.rollouts, label=args.label, progress=not args.quiet)
    path = write_report(run, args.out, title=args.title)
    print(f"report: {path.resolve()}")
    return 0


def _open(path: Path, label: str | None, *, quiet: bool):  # type: ignore[no-untyped-def]
    from ngcapture_viz.run import open_run

    capture_dir, rollouts = resolve_run(path)
    return open_run(capture_dir, rollouts, label=label, progress=not quiet)


def _gates(values: Sequence[str], *, relative: bool = True) -> list[tuple[str, float, bool]]:
    """Parse ``--gate`` / ``--gate-abs`` ``METRIC=MAX_INCREASE`` values before any work."""
    from ngcapture_viz.diff import METRIC_NAMES

    flag = "--gate" if relative else "--gate-abs"
    meaning = "0.1 means +10%" if relative else "in the metric's unit: 0.02 on a rate is +2 pp"
    gates = []
    for value in values:
        metric, sep, limit = value.partition("=")
        if not sep or metric not in METRIC_NAMES:
            raise VizError(
                f"{flag} {value!r}: expected METRIC=MAX_INCREASE with METRIC one of "
                f"{', '.join(METRIC_NAMES)}"
            )
        try:
            number = float(limit)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise VizError(f"{flag} {value!r}: MAX_INCREASE must be a finite number ({meaning})")
        gates.append((metric, number, relative))
    return gates


def _diff(args: argparse.Namespace) -> int:
    from ngcapture_viz.diff import assert_no_regression, diff

    gates = _gates(args.gate) + _gates(args.gate_abs, relative=False)
    run_a = _open(args.a, args.label_a, quiet=args.quiet)
    run_b = _open(args.b, args.label_b, quiet=args.quiet)
    if run_a.label == run_b.label:
        raise VizError(f"both runs are labelled {run_a.label!r}: pass --label-a / --label-b")
    result = diff(run_a, run_b, n_boot=args.n_boot, seed=args.seed)
    print(result)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result.frame.write_csv(args.out)
        print(f"diff table: {args.out.resolve()}")
    failed = 0
    for metric, limit, relative in gates:
        try:
            assert_no_regression(result, metric, limit, relative=relative)
        except AssertionError as exc:
            print(f"REGRESSION: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _export_wandb(args: argparse.Namespace) -> int:
    from ngcapture_viz.export import export_to_wandb
    from ngcapture_viz.run import open_run

    run = open_run(args.capture_dir, args.rollouts, label=args.label, progress=not args.quiet)
    result = export_to_wandb(
        run,
        project=args.project,
        entity=args.entity,
        name=args.name,
        payload_digests=args.payload_digests,
    )
    for table, rows in result.rows.items():
        print(f"{table}: {rows:,} of {result.total_rows[table]:,} rows logged")
    for note in result.notes:
        print(f"note: {note}")
    print(f"W&B run {result.run_id}: {result.run_dir}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ngcapture", description="Analyse capture stores and rollout files."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def quiet(command: argparse.ArgumentParser) -> None:
        command.add_argument("--quiet", action="store_true", help="no progress bar")

    index = sub.add_parser("index", help="build or refresh the sidecar index of a capture dir")
    index.add_argument("capture_dir", type=Path)
    index.add_argument("--index-dir", type=Path, help="where to keep the index")
    index.add_argument("--workers", type=int, help="processes for a cold build (default: cores)")
    quiet(index)
    index.set_defaults(handler=_index)

    report = sub.add_parser("report", help="write the self-contained HTML report of a run")
    report.add_argument("--capture-dir", type=Path)
    report.add_argument("--rollouts", type=Path)
    report.add_argument("--out", type=Path, default=Path("report.html"))
    report.add_argument("--label")
    report.add_argument("--title")
    quiet(report)
    report.set_defaults(handler=_report)

    diff = sub.add_parser("diff", help="compare two runs (checkpoints) with bootstrap CIs")
    diff.add_argument("a", type=Path, help="run folder, capture dir or rollout file")
    diff.add_argument("b", type=Path)
    diff.add_argument("--label-a")
    diff.add_argument("--label-b")
    diff.add_argument("--n-boot", type=int, default=2000)
    diff.add_argument("--seed", type=int, default=0)
    diff.add_argument("--out", type=Path, help="write the diff table as CSV")
    diff.add_argument(
        "--gate",
        action="append",
        default=[],
        metavar="METRIC=MAX_INCREASE",
        help="exit 1 if METRIC regressed by more than MAX_INCREASE (relative); repeatable",
    )
    diff.add_argument(
        "--gate-abs",
        action="append",
        default=[],
        metavar="METRIC=MAX_INCREASE",
        help="the same in the metric's own unit (rates: 0.02 is +2 percentage points); "
        "for metrics that can start from 0",
    )
    quiet(diff)
    diff.set_defaults(handler=_diff)

    export = sub.add_parser("export-wandb", help="log payload-free tables to Weights & Biases")
    export.add_argument("--capture-dir", type=Path)
    export.add_argument("--rollouts", type=Path)
    export.add_argument("--project", required=True)
    export.add_argument("--entity")
    export.add_argument("--name")
    export.add_argument("--label")
    export.add_argument("--payload-digests", action="store_true")
    quiet(export)
    export.set_defaults(handler=_export_wandb)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one analysis command; errors print one clear line and exit with status 2."""
    args = _parser().parse_args(argv)
    try:
        result: int = args.handler(args)
    except (VizError, ValueError, KeyError) as exc:
        print(f"ngcapture {args.command}: {exc}", file=sys.stderr)
        return 2
    return result
