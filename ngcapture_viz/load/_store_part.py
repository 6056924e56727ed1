"""The capture store's part of a run: its call rows (through the sidecar index), a row per
rollout it holds, and a gap row for every problem its directory shows (unreadable, foreign and
empty files, incomplete markers, pending or lost calls, failed captures)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from capture_core import MARKER_SUFFIX
from capture_core.writers import FAILURE_LOG_SUFFIX, FAILURES_DIR
from ngcapture_viz.frames.gaps import AnalysisGap, GapRows
from ngcapture_viz.load.index import CaptureIndex, IndexStats

__all__ = ["STORE_SCHEMA", "StorePart", "read_store_part"]

PathLike = str | os.PathLike[str]

STORE_SCHEMA = pl.Schema(
    {
        "rollout_id": pl.String(),
        "incomplete": pl.Boolean(),
        "pending_writes": pl.Int64(),
        "path": pl.String(),
    }
)


@dataclass(frozen=True)
class StorePart:
    """What a capture directory gives a run."""

    calls: pl.DataFrame  # with absolute paths
    tool_calls: pl.DataFrame
    damaged: pl.DataFrame  # damaged-line gap rows
    rollouts: pl.DataFrame  # STORE_SCHEMA: every rollout with a capture file or a marker
    stats: IndexStats
    #: The calls' per-rollout totals (``frames.rollouts.call_totals``), when the index made
    #: them as it read its saved tables (a warm open); ``None``: the run computes them.
    totals: pl.DataFrame | None


def read_store_part(
    root: Path,
    gaps: GapRows,
    *,
    index: bool,
    index_dir: PathLike | None,
    workers: int | None,
    progress: bool | None,
    verify: bool = False,
) -> StorePart:
    """Refresh the index of ``root`` and read its part of a run; the directory's problems are
    added to ``gaps``.

    Example:
        >>> gaps = GapRows()
        >>> part = read_store_part(Path("/abs/results/model-calls"), gaps, index=True,
        ...                        index_dir=None, workers=None, progress=False)  # doctest: +SKIP
        >>> part.rollouts.columns  # doctest: +SKIP
        ['rollout_id', 'incomplete', 'pending_writes', 'path']
    """
    idx = CaptureIndex(root, index_dir=index_dir, workers=workers, verify=verify)
    stats = idx.refresh(progress=progress, write=index, reuse=index)
    calls, damaged = idx.frames_with_paths()
    listing = idx.listing
    for name, reason in idx.unreadable:
        gaps.add(
            AnalysisGap.FILE_UNREADABLE,
            source="store",
            rollout_id=name.removesuffix(".capture.jsonl"),
            detail=reason,
            path=str(root / name),
        )
    for name in listing.foreign:
        gaps.add(
            AnalysisGap.FOREIGN_FILE,
            source="store",
            detail="not a <rollout_id>.capture.jsonl file or marker",
            path=str(root / name),
        )
    # The calls that landed, asked of only when a mark or a failure names a call (a set of
    # every call of a large store costs ~1 s).
    named = {(m.rollout_id, m.model_call_id) for m in listing.pending if m.lost}
    named |= {(f.rollout_id, f.model_call_id) for f in listing.failures}
    landed = _landed(calls, named)
    # A rollout whose failed calls the failure logs name call by call needs no rollout-level
    # gap as well (as in the collector's attachment).
    explained = {f.rollout_id for f in listing.failures
                 if (f.rollout_id, f.model_call_id) not in landed}  # fmt: skip
    for rollout_id in sorted(listing.markers - explained):
        gaps.add(
            "model_call_capture_incomplete",
            source="store",
            rollout_id=rollout_id,
            detail="the capture server failed to record at least one call",
            path=str(root / f"{rollout_id}{MARKER_SUFFIX}"),
        )
    for marker in listing.pending:
        if marker.lost and (marker.rollout_id, marker.model_call_id) in landed:
            continue  # a stale marker: its server died after the line landed
        gaps.add(
            "model_call_capture_lost" if marker.lost else "model_call_capture_pending",
            source="store",
            rollout_id=marker.rollout_id,
            model_call_id=marker.model_call_id,
            detail=(
                f"its server (writer {marker.writer}) died before the line landed"
                if marker.lost
                else "the capture write had not landed when the run was opened"
            ),
            path=str(marker.path),
        )
    for failure in listing.failures:
        if (failure.rollout_id, failure.model_call_id) in landed:
            continue
        gaps.add(
            "model_call_capture_failed",
            source="store",
            rollout_id=failure.rollout_id,
            model_call_id=failure.model_call_id,
            detail=f"the capture line could not be written: {failure.reason}",
            path=str(root / FAILURES_DIR / f"{failure.writer}{FAILURE_LOG_SUFFIX}"),
        )
    data = listing.data_frame
    with_lines = pl.concat([calls.select("rollout_id"), damaged.select("rollout_id")])
    unreadable = [name for name, _ in idx.unreadable]
    empty = data.join(with_lines, on="rollout_id", how="anti").filter(
        ~pl.col("name").is_in(unreadable)
    )
    for rollout_id, name in empty.sort("rollout_id").iter_rows():
        gaps.add(
            AnalysisGap.EMPTY_FILE,
            source="store",
            rollout_id=rollout_id,
            detail="the capture file holds no line",
            path=str(root / name),
        )
    pending: dict[str, int] = {}
    for marker in listing.pending:
        if not marker.lost:
            pending[marker.rollout_id] = pending.get(marker.rollout_id, 0) + 1
    # Rollouts with a capture file, then those with only a marker: columns built by
    # Polars from the listing's frame (Python lists cost ~0.3 s at 358k files).
    asked = sorted(listing.markers | set(pending))
    with_files = set(data.filter(pl.col("rollout_id").is_in(asked))["rollout_id"].to_list())
    others = [rollout_id for rollout_id in asked if rollout_id not in with_files]
    stem = pl.col("rollout_id")
    with_file = data.select(
        "rollout_id",
        stem.is_in(sorted(listing.markers)).alias("incomplete"),
        stem.replace_strict(pending, default=0, return_dtype=pl.Int64()).alias("pending_writes")
        if pending
        else pl.lit(0, pl.Int64()).alias("pending_writes"),
        pl.concat_str(pl.lit(str(root) + os.sep), pl.col("name")).alias("path"),
    )
    without_file = pl.DataFrame(
        {
            "rollout_id": others,
            "incomplete": [r in listing.markers for r in others],
            "pending_writes": [pending.get(r, 0) for r in others],
            "path": [None] * len(others),
        },
        schema=STORE_SCHEMA,
    )
    rollouts = pl.concat([with_file.cast(STORE_SCHEMA), without_file])
    return StorePart(calls, idx.tool_calls, damaged, rollouts, stats, idx.saved_totals())


def _landed(calls: pl.DataFrame, named: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of the ``(rollout_id, model_call_id)`` pairs ``named`` have a row in ``calls``."""
    if not named:
        return set()
    asked = pl.DataFrame(
        list(named), schema={"rollout_id": pl.String(), "model_call_id": pl.String()}, orient="row"
    )
    found = asked.join(calls.select("rollout_id", "model_call_id"), on=asked.columns, how="semi")
    return set(found.iter_rows())
