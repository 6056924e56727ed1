"""Where a run's data is: what ``open_runs`` is given per run, and the label a run gets from it."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ngcapture_viz.exceptions import SourceError
from ngcapture_viz.load._assemble import Sources

PathLike = str | os.PathLike[str]


def _default_label(sources: Sources) -> str:
    if sources.capture_dir is not None:
        directory = sources.capture_dir
        return directory.parent.name if directory.name == "model-calls" else directory.name
    assert sources.rollouts is not None
    return sources.rollouts.stem


def _run_sources(label: str, value: object) -> tuple[PathLike | None, PathLike | None]:
    """``(capture_dir, rollouts)`` of one ``open_runs`` entry: a pair, or a capture dir."""
    if isinstance(value, str | os.PathLike):
        return value, None
    if isinstance(value, Sequence) and len(value) == 2:
        capture_dir, rollouts = value
        if all(v is None or isinstance(v, str | os.PathLike) for v in (capture_dir, rollouts)):
            return capture_dir, rollouts
    raise SourceError(
        f"open_runs: run {label!r} is {value!r}; expected a capture directory or a "
        "(capture_dir, rollouts) pair, either of which may be None"
    )
