"""Several runs as one ``CaptureRun``: ``open_runs`` and ``stack_runs``.

``ngcapture_viz.run`` re-exports both. They import ``CaptureRun`` and ``open_run`` from it when
called, not at import time: ``run`` imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import polars as pl

from ngcapture_viz.exceptions import SourceError
from ngcapture_viz.load.evidence import EVIDENCE_FRAMES
from ngcapture_viz.sources import PathLike, _run_sources

if TYPE_CHECKING:
    from ngcapture_viz.run import CaptureRun


def open_runs(
    runs: Mapping[
        str, tuple[PathLike | None, PathLike | None] | Sequence[PathLike | None] | PathLike
    ],
    *,
    strict: bool = False,
    index: bool = True,
    workers: int | None = None,
    progress: bool | None = None,
    tokens_dirs: Mapping[str, PathLike] | None = None,
) -> CaptureRun:
    """Open several runs and stack their frames; the ``run`` column tells them apart.

    Args:
        runs: label → ``(capture_dir, rollouts)`` (a tuple or list; either may be ``None``) or
            a capture dir.
        tokens_dirs: label → the run's token-id capture store (see ``open_run``).

    Example:
        >>> both = open_runs({"ckpt-100": ("a/model-calls", "a/rollouts.jsonl"),  # doctest: +SKIP
        ...                   "ckpt-200": ("b/model-calls", None)})
        >>> both.calls.group_by("run").len()  # doctest: +SKIP
    """
    if not runs:
        raise SourceError("open_runs needs at least one run")
    from ngcapture_viz.run import open_run

    opened: dict[str, CaptureRun] = {}
    for label, value in runs.items():
        capture_dir, rollouts = _run_sources(label, value)
        opened[label] = open_run(
            capture_dir,
            rollouts,
            tokens_dir=(tokens_dirs or {}).get(label),
            label=label,
            strict=strict,
            index=index,
            workers=workers,
            progress=progress,
        )
    return stack_runs(list(opened.values()))


def stack_runs(runs: Sequence[CaptureRun]) -> CaptureRun:
    """Stack already opened runs (labels must differ)."""
    from ngcapture_viz.run import CaptureRun

    members: dict[str, CaptureRun] = {}
    for run in runs:
        for label, member in run.runs.items():
            if label in members:
                raise SourceError(f"two runs are labelled {label!r}; labels must differ")
            members[label] = member
    if len(members) == 1:
        return next(iter(members.values()))

    def stacked(name: str) -> pl.DataFrame:
        frames: list[pl.DataFrame] = [getattr(r, name) for r in members.values()]
        return pl.concat(frames, how="diagonal_relaxed")

    return CaptureRun(
        None,
        calls=stacked("calls"),
        rollouts=stacked("rollouts"),
        gaps=stacked("gaps"),
        tool_calls=stacked("tool_calls"),
        runs=members,
        evidence={name: stacked(name) for name in EVIDENCE_FRAMES},
        tokens=stacked("tokens"),
    )
