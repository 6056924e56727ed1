"""``ngcapture watch``: follow a training run's store and log what is new to W&B.

Kept apart from :mod:`ngcapture_viz.cli` (the one-shot analysis commands) because it is the one
command that runs until stopped: Ctrl-C or SIGTERM ends it after the poll in progress, finishes
the W&B run and exits 0.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import click

from ngcapture_viz.cli import _RUN_PATH, _reading, _wandb_errors

__all__ = ["watch"]

WATCH_EXAMPLE = """\b
Example:
  ngcapture watch --capture-dir /shared/run-7/model-calls --rollouts /shared/run-7/rollouts.jsonl \\
      --project rl-run-7 --step-field step --interval 60
  WANDB_MODE=offline ngcapture watch ...   # no account: write locally, `wandb sync` later

Only new calls and rollouts are logged at each poll, payload-free; a restart resumes from the
state file and logs nothing twice."""


@click.command(epilog=WATCH_EXAMPLE)
@click.option(
    "--capture-dir",
    type=_RUN_PATH,
    required=True,
    metavar="DIR",
    help="Capture directory being written (*.capture.jsonl files).",
)
@click.option(
    "--rollouts",
    type=_RUN_PATH,
    metavar="FILE",
    help="Rollout JSONL being written; without it only calls are logged.",
)
@click.option("--project", required=True, help="W&B project to log to.")
@click.option("--entity", help="W&B entity (user or team).  [default: your default entity]")
@click.option("--name", help="Name of the W&B run.  [default: chosen by W&B]")
@click.option("--label", help="Name of the run in the tables.  [default: the folder's name]")
@click.option(
    "--interval",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds between polls.",
)
@click.option("--step-field", metavar="FIELD", help="Rollout field holding the training step.")
@click.option(
    "--checkpoint", metavar="LABEL", help="Checkpoint label whose trailing number is the step."
)
@click.option(
    "--state",
    type=_RUN_PATH,
    metavar="FILE",
    help="What was logged, for restarts.  [default: DIR/.ngcapture-watch/PROJECT.json]",
)
@click.option("--once", is_flag=True, help="Poll once (catching up fully) and exit.")
def watch(
    *,
    capture_dir: Path,
    rollouts: Path | None,
    project: str,
    entity: str | None,
    name: str | None,
    label: str | None,
    interval: float,
    step_field: str | None,
    checkpoint: str | None,
    state: Path | None,
    once: bool,
) -> int:
    """Follow a growing run and log its new calls and rollouts to W&B at each poll."""
    from ngcapture_viz.export.watch import PollResult
    from ngcapture_viz.export.watch import watch as follow

    def report(result: PollResult) -> None:
        if result.batch is not None:
            print(
                f"batch {result.batch} at step {result.step}: {result.calls:,} calls, "
                f"{result.rollouts:,} rollouts, {result.gaps:,} gaps"
                + (" (more waiting)" if result.behind else ""),
                flush=True,
            )
        if once and not result.behind:
            stop.set()

    with _stopping() as stop, _reading(strict=False), _wandb_errors():
        if not capture_dir.is_dir():
            raise click.UsageError(f"--capture-dir {str(capture_dir)!r} is not a directory")
        batches = follow(
            capture_dir,
            rollouts,
            project=project,
            entity=entity,
            name=name,
            label=label,
            step_field=step_field,
            checkpoint=checkpoint,
            state=state,
            interval=interval,
            stop=stop,
            on_poll=report,
        )
    print(f"stopped: {batches:,} batch(es) logged")
    return 0


@contextmanager
def _stopping() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM (the poll in progress finishes first)."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
