"""The collector's failures file: rollouts that failed, with the reason that ended them.

``capture_core.collect`` writes a rollout that raised (a 429 the agent gave up on, a tool that
crashed...) to ``<stem>_failures.jsonl`` beside the rollout file, with its task fields, its
capture attachment and ``ng_failure: {rollout_id, attempt, error_type, error}``. ``open_run``
reads it when present: such a rollout is a row of ``run.rollouts`` with ``failed`` true and its
``failure`` reason, not a capture that "lacks a record in the rollout file".

Example:
    >>> failures_file(Path("results/ckpt/rollouts.jsonl"))
    PosixPath('results/ckpt/rollouts_failures.jsonl')
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from ngcapture_viz.load.rollouts import RolloutSource, read_rollouts

__all__ = ["FAILURES_SUFFIX", "FAILURE_KEY", "Failures", "failures_file", "read_failures"]

#: The collector's names (``capture_core.collect``: ``FAILURES_SUFFIX``, ``FAILURE_KEY``);
#: kept here so that reading never imports the collector (a test checks they agree).
FAILURES_SUFFIX: Final = "_failures.jsonl"
FAILURE_KEY: Final = "ng_failure"


@dataclass
class Failures:
    """The failures file's records and, per rollout id, why it failed."""

    source: RolloutSource
    reasons: dict[str, str]


def failures_file(rollouts: Path) -> Path:
    """The failures file beside a rollout file: ``<dir>/<stem>_failures.jsonl``."""
    return rollouts.with_name(rollouts.stem + FAILURES_SUFFIX)


def read_failures(path: Path) -> Failures | None:
    """Read a failures file; ``None`` when there is none (or it holds nothing)."""
    try:
        if path.stat().st_size == 0:
            return None
    except FileNotFoundError:
        return None
    source = read_rollouts(path)
    reasons: dict[str, str] = {}
    for line in path.read_bytes().splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # read_rollouts made it a gap
        if isinstance(row, dict) and isinstance(row.get(FAILURE_KEY), dict):
            failure = row[FAILURE_KEY]
            rollout_id = failure.get("rollout_id")
            if isinstance(rollout_id, str):
                reasons[rollout_id] = reason_text(failure)
    for record in source.records:  # a record without ng_failure still failed: it is here
        reasons.setdefault(record.rollout_id, "failed (no reason recorded)")
    return Failures(source, reasons)


def reason_text(failure: dict[str, Any]) -> str:
    """``"<error_type>: <error>"`` of an ``ng_failure`` object (whichever parts it has)."""
    kind, error = failure.get("error_type"), failure.get("error")
    parts = [str(p) for p in (kind, error) if p not in (None, "")]
    return ": ".join(parts) or "failed (no reason recorded)"
