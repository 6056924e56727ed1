"""How a checkpoint diff matches two runs: rollout keys, the pairing column, units, leftovers.

Rollouts are matched on ``task_id`` when every rollout of both runs has one, else on
``task_index``, else on a mixed key (task id, task index, or the rollout id itself). A *unit* is
a task (``by="task"``) or a task and repeat (``by="rollout"``); units present in one run only are
reported, never dropped silently.

Example:
    >>> keys = pl.DataFrame({"task_id": ["t1"], "task_index": [0]})
    >>> pair_key(keys, keys)
    'task_id'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import polars as pl

if TYPE_CHECKING:
    from ngcapture_viz.run import CaptureRun

__all__ = ["pair_key", "rollout_keys", "unmatched", "with_units"]

_KEY_COLUMNS: Final = ("rollout_id", "task_id", "task_index", "rollout_index", "num_gaps")


def rollout_keys(run: CaptureRun) -> pl.DataFrame:
    """Every rollout of the run (rollouts frame, plus any rollout only its calls name)."""
    schema = pl.Schema({name: run.rollouts.schema[name] for name in _KEY_COLUMNS})
    base = run.rollouts.select(_KEY_COLUMNS)
    extra = run.calls.select("rollout_id").unique().join(base, on="rollout_id", how="anti")
    return pl.concat([base, extra], how="diagonal").cast(schema).sort("rollout_id")


def pair_key(a: pl.DataFrame, b: pl.DataFrame) -> str:
    """The column both runs fill for every rollout: ``task_id``, ``task_index`` or ``mixed``."""
    for column in ("task_id", "task_index"):
        if a[column].null_count() == 0 and b[column].null_count() == 0:
            return column
    return "mixed"


def with_units(base: pl.DataFrame, key: str, by: str) -> pl.DataFrame:
    """``base`` with its ``task`` and ``unit`` (task, or task#repeat) keys."""
    rollout_id = pl.lit("rollout_id=") + pl.col("rollout_id")
    if key == "task_id":
        task = pl.col("task_id")
    elif key == "task_index":
        task = pl.col("task_index").cast(pl.String)
    else:
        index = pl.lit("task_index=") + pl.col("task_index").cast(pl.String)
        task = pl.coalesce(pl.col("task_id"), index, rollout_id)
    repeat = pl.coalesce(pl.col("rollout_index").cast(pl.String), rollout_id)
    unit = task if by == "task" else task + pl.lit("#") + repeat
    return base.with_columns(task.alias("task"), unit.alias("unit"))


def unmatched(base: pl.DataFrame, shared: set[str], by: str) -> tuple[str, ...]:
    """Tasks (or rollout ids) of ``base`` whose unit the other run lacks."""
    alone = base.filter(~pl.col("unit").is_in(list(shared)))
    column = "task" if by == "task" else "rollout_id"
    return tuple(sorted(set(alone[column].to_list())))
