"""``ngcapture compact``: write the columnar segments of a capture directory's facts journals.

A capture server runs this itself, in a separate process, as its journal grows and when it
stops; the command is for stores whose server could not (it was killed) or that were copied
without their segments. See :mod:`ngcapture_viz.load.journal_segments`.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from capture_core.cli import UserError

__all__ = ["compact"]

COMPACT_EXAMPLE = """\b
Example:
  ngcapture compact results/demo/ckpt-200/model-calls

Only the part of each journal no segment holds yet is read; running it again writes nothing
new. Deleting the segments (.facts/*.parquet) loses nothing."""


@click.command(epilog=COMPACT_EXAMPLE)
@click.argument("target", type=click.Path(exists=True, path_type=Path), metavar="CAPTURE_DIR")
@click.option("--quiet", is_flag=True, help="Print nothing.")
@click.option(
    "--low-priority",
    is_flag=True,
    help="Run at a lower CPU priority (nice +10), as the capture server starts it.",
)
def compact(*, target: Path, quiet: bool, low_priority: bool) -> int:
    """Write columnar segments of the facts journals of CAPTURE_DIR (or of one journal file),
    so that the first open of the store reads them instead of decoding every entry."""
    from ngcapture_viz.load.journal_segments import journal_files, write_segments

    if low_priority:
        os.nice(10)

    journals = journal_files(str(target))
    if not journals:
        raise UserError(f"{target}: no facts journal here (.facts/*.jsonl, written by ngcapture's "
                        "capture server)")  # fmt: skip
    written = [path for journal in journals for path in write_segments(journal)]
    if not quiet:
        print(f"wrote {len(written)} segment(s) for {len(journals)} journal(s) in {target}")
    return 0
