"""``ngcapture sweep``: remove the pending marks of capture servers that died, name the calls
they lost."""

from __future__ import annotations

from pathlib import Path

import click

from capture_core.cli._base import CONTEXT_SETTINGS, existing_dir

__all__ = ["sweep"]

EXAMPLE = """\b
Example:
  ngcapture sweep --capture-dir "$PWD/results/model-calls" --dry-run
  ngcapture sweep --capture-dir "$PWD/results/model-calls"

A server that is killed (or loses its machine) leaves the calls it was capturing marked as
pending; their lines never land. Readers already report them as model_call_capture_lost gaps;
sweeping removes the marks (and the dead server's lock and slots files) once you have noted
them. Marks of running servers are never touched; failure logs are always kept."""


@click.command(context_settings=CONTEXT_SETTINGS, epilog=EXAMPLE)
@click.option(
    "--capture-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Capture directory to sweep (it must exist).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def sweep(*, capture_dir: Path, dry_run: bool) -> int:
    """Remove the pending marks of dead capture servers and say which calls they lost."""
    from capture_core.pending import pending_calls, sweep_markers
    from capture_core.store import CaptureStore

    root = existing_dir(capture_dir, "--capture-dir")
    store = CaptureStore(root)
    lost_rollouts = sorted({call.rollout_id for call in pending_calls(root) if call.lost})
    landed = {
        (rollout_id, entry.data.get("model_call_id"))
        for rollout_id in lost_rollouts
        for entry in store.read(rollout_id).entries
    }
    report = sweep_markers(root, landed=landed, dry_run=dry_run)  # type: ignore[arg-type]
    verb = "would remove" if dry_run else "removed"
    for call, was_landed in report.removed:
        what = "its line had landed" if was_landed else "its capture is lost"
        click.echo(f"{verb} mark of call {call.model_call_id} in rollout {call.rollout_id} "
                   f"(server {call.writer}): {what}")  # fmt: skip
    click.echo(
        f"{root}: {verb} {len(report.removed)} mark(s) of {len(report.writers_removed)} dead "
        f"server(s), {len(report.lost)} lost call(s); left {report.live} mark(s) of running "
        f"servers" + (f" and {report.unknown} of older versions" if report.unknown else "")
    )
    return 0
