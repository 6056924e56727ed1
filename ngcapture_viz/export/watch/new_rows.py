"""What is new since the last batch: store calls past their file's watermark, rollout records
past the last line logged from their file."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import polars as pl

from ngcapture_viz.export.watch.state import _State
from ngcapture_viz.run import CaptureRun

logger = logging.getLogger(__name__)


def _new_calls(
    run: CaptureRun, state: _State, *, max_rows: int
) -> tuple[pl.DataFrame, dict[str, list[Any]], bool]:
    """Store calls not logged yet (``rollout_id``, ``call_index``, ``file``), the file
    watermarks after logging them, and whether rows were left for later."""
    store = run.calls.filter(pl.col("source") == "store").select(
        "rollout_id",
        "call_index",
        "model_call_id",
        pl.col("path").str.split("/").list.last().alias("file"),
    )
    firsts = store.sort("call_index").group_by("file", maintain_order=True).first()
    known = pl.DataFrame(
        [(name, first, nxt) for name, (first, nxt) in state.files.items()],
        schema={"file": pl.String(), "known_first": pl.String(), "next": pl.Int64()},
        orient="row",
    )
    current = firsts.select("file", pl.col("model_call_id").alias("first")).join(
        known, on="file", how="left"
    )
    # A file whose first call is not the one recorded was replaced: it starts over.
    current = current.with_columns(
        pl.when(pl.col("known_first") == pl.col("first"))
        .then(pl.col("next"))
        .otherwise(0)
        .alias("next")
    )
    new = (
        store.join(current.select("file", "next"), on="file", how="left")
        .filter(pl.col("call_index") >= pl.col("next"))
        .sort("file", "call_index")
    )
    behind = new.height > max_rows
    new = new.head(max_rows).drop("next")
    files = dict(state.files)
    for name, first in current.select("file", "first").iter_rows():
        if files.get(name, [None])[0] != first:
            files[name] = [first, 0]
    for name, last in new.group_by("file").agg(pl.col("call_index").max()).iter_rows():
        files[name] = [files[name][0], last + 1]
    return new, files, behind


def _new_rollouts(
    run: CaptureRun, state: _State, *, max_rows: int
) -> tuple[pl.DataFrame, dict[str, dict[str, Any]], bool]:
    """Rollout rows whose record lies after the last logged line of its file."""
    records = dict(state.records)
    if run.rollouts_path is None:
        return run.rollouts.clear().select("rollout_id"), records, False
    sources = {"rollouts": run.rollouts_path, "failures": run.failures_path}
    starts: dict[str, int] = {}
    for kind, path in sources.items():
        mark = _file_mark(path)
        known = records.get(kind)
        if mark is None:
            starts[kind] = 1 if known is None else known["next_line"]
            continue
        if known is None:
            known = {**mark, "next_line": 1}
        elif known["head"] is None:  # its first line was not whole when last seen
            known = {**known, **mark}
        elif (known["inode"], known["head"]) != (mark["inode"], mark["head"]):
            logger.warning("%s was replaced: logging its records from the start", path)
            known = {**mark, "next_line": 1}
        records[kind] = known
        starts[kind] = known["next_line"]
    rows = run.rollouts.filter(pl.col("rollouts_line").is_not_null()).with_columns(
        pl.when(pl.col("failure").is_not_null())
        .then(pl.lit("failures"))
        .otherwise(pl.lit("rollouts"))
        .alias("_from")
    )
    start = pl.col("_from").replace_strict(starts, default=1, return_dtype=pl.Int64)
    new = rows.filter(pl.col("rollouts_line") >= start).sort("_from", "rollouts_line")
    behind = new.height > max_rows
    new = new.head(max_rows)
    for kind, last in new.group_by("_from").agg(pl.col("rollouts_line").max()).iter_rows():
        known = records.get(kind, {"inode": None, "head": None})
        records[kind] = {**known, "next_line": last + 1}
    return new.select("rollout_id", "_from", "rollouts_line"), records, behind


def _file_mark(path: Path | None) -> dict[str, Any] | None:
    """Inode and a hash of the first line of a records file (``None``: no whole line yet)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            head = file.read(65536)
            inode = os.fstat(file.fileno()).st_ino
    except OSError:
        return None
    end = head.find(b"\n")
    if end < 0:
        return None
    return {"inode": inode, "head": hashlib.blake2b(head[:end], digest_size=12).hexdigest()}
