"""A capture store's calls as a Polars ``LazyFrame``: ``scan_calls``, to filter big stores first."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from ngcapture_viz.exceptions import SourceError
from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.load._assemble import Sources
from ngcapture_viz.load._index_files import table_paths
from ngcapture_viz.load.index import CaptureIndex
from ngcapture_viz.sources import PathLike, _default_label


def scan_calls(
    capture_dir: PathLike,
    *,
    label: str | None = None,
    index_dir: PathLike | None = None,
    progress: bool | None = None,
) -> pl.LazyFrame:
    """The calls of a capture store as a ``LazyFrame``: for filtering a large store first.

    The sidecar index is brought up to date (appended bytes are parsed, as ``open_run``
    does), then its Parquet tables are scanned lazily: a filter or a column selection is
    pushed down to them, so only the rows and columns asked for are ever read into memory.
    The rows are those of ``open_run(capture_dir).calls`` (store calls only: attachment calls
    need the rollout file, which ``open_run`` reads).

    Example:
        >>> import polars as pl  # doctest: +SKIP
        >>> slow = (ngv.scan_calls("results/model-calls")  # doctest: +SKIP
        ...         .filter(pl.col("latency_total_ms") > 10_000)
        ...         .select("rollout_id", "model_call_id", "latency_total_ms")
        ...         .collect())
    """
    root = Path(capture_dir).absolute()
    if not root.is_dir():
        raise SourceError(f"capture directory {str(root)!r} does not exist")
    index = CaptureIndex(root, index_dir=index_dir)
    stats = index.refresh(progress=progress)
    paths = table_paths(stats.location, "calls") if stats.location is not None else None
    lazy = pl.scan_parquet(paths) if paths else index.calls.lazy()
    name = label if label is not None else _default_label(Sources(root, None))
    prefix = str(root) + os.sep
    return (
        lazy.with_columns(
            pl.lit(name).alias("run"), pl.concat_str([pl.lit(prefix), pl.col("path")]).alias("path")
        )
        .select([pl.col(column).cast(dtype) for column, dtype in CALLS.polars.items()])
        .sort("rollout_id", "call_index")
    )
