"""The frames a warm open returns, made from the index's saved tables as they are read.

The thread that reads the tables makes them while the main thread still waits for the
directory's ``stat`` calls (the core those leave idle): the calls and damaged rows with
absolute paths, and the calls' per-rollout totals. They serve the open only while the index's
rows are still those tables' (:meth:`Prepared.holds`); after an append only the appended
rollouts' totals are made again (:meth:`Prepared.appended`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import polars as pl

from ngcapture_viz.frames.rollouts import call_totals
from ngcapture_viz.load._index_files import ORDER, IndexTables, is_ordered

__all__ = ["Prepared", "with_paths"]


class _Rows(Protocol):
    calls: pl.DataFrame
    damaged: pl.DataFrame


def with_paths(frame: pl.DataFrame, root: Path) -> pl.DataFrame:
    """``frame`` with its ``path`` values (relative to ``root``, as the index keeps them)
    made absolute."""
    prefix = str(root) + os.sep
    return frame.with_columns(pl.concat_str([pl.lit(prefix), pl.col("path")]).alias("path"))


@dataclass(frozen=True)
class Prepared:
    """The saved tables' frames as a warm open returns them, made as they are read."""

    calls_read: pl.DataFrame  # the tables as read: the rows are still these, or this is stale
    damaged_read: pl.DataFrame
    calls: pl.DataFrame  # with absolute paths
    damaged: pl.DataFrame
    totals: pl.DataFrame

    def holds(self, rows: _Rows) -> bool:
        """Whether ``rows`` (the index's calls and damaged rows) are still the ones these
        frames were made of (no file moved since)."""
        return self.calls_read is rows.calls and self.damaged_read is rows.damaged

    @classmethod
    def of(cls, tables: IndexTables, root: Path) -> Prepared:
        calls = with_paths(tables.calls, root)
        if (
            calls.height
            and not calls["rollout_id"].has_nulls()
            and is_ordered(calls, ORDER["calls"])
        ):
            # As a generation keeps them: the totals then group runs of rows, not hashed ids.
            calls = calls.with_columns(pl.col("rollout_id").set_sorted())
        return cls(
            tables.calls,
            tables.damaged,
            calls,
            with_paths(tables.damaged, root),
            call_totals(calls),
        )

    def appended(
        self, calls: pl.DataFrame, damaged: pl.DataFrame, added: pl.DataFrame, root: Path
    ) -> Prepared:
        """The same for ``calls`` and ``damaged``: these rows and the ``added`` calls, which
        only append to their rollouts; the totals of the other rollouts stay as they are."""
        touched = added["rollout_id"].unique().implode()
        totals = pl.concat(
            [
                self.totals.filter(~pl.col("rollout_id").is_in(touched)),
                call_totals(calls.filter(pl.col("rollout_id").is_in(touched))),
            ]
        )
        return Prepared(calls, damaged, with_paths(calls, root), with_paths(damaged, root), totals)
