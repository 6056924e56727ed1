"""The files of the sidecar index: their schema, and reading and writing one generation.

A generation is four Parquet files (``files``, ``calls``, ``tool_calls``, ``damaged``) named
``<table>-<generation>.parquet``; ``meta.json`` names the current one. Writers hold ``lock``,
write the new generation, replace ``meta.json`` atomically, then remove older generations, so
a reader sees either the old index or the new one. Anything unreadable reads as "no index".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Final

import orjson
import polars as pl

from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.frames.gaps import GAPS
from ngcapture_viz.frames.tool_calls import TOOL_CALLS

__all__ = ["FILE_SCHEMA", "FORMAT", "IndexTables", "read_tables", "write_tables"]

#: Bumped whenever a table's meaning changes: an index of another format is rebuilt.
FORMAT: Final = 4  # 4: tool_calls.choice_index
TABLES: Final = ("files", "calls", "tool_calls", "damaged")
FILE_SCHEMA: Final = pl.Schema(
    {
        "name": pl.String(),
        "rollout_id": pl.String(),
        "size": pl.Int64(),
        "mtime_ns": pl.Int64(),
        "inode": pl.Int64(),
        "consumed": pl.Int64(),
        "next_call_index": pl.Int64(),
        "next_line": pl.Int64(),
        "head_hash": pl.String(),
        "tail_hash": pl.String(),
        "scanned_ns": pl.Int64(),
        "full_hash": pl.String(),
    }
)


@dataclass
class IndexTables:
    """One generation of the index."""

    files: pl.DataFrame
    calls: pl.DataFrame
    tool_calls: pl.DataFrame
    damaged: pl.DataFrame


def read_tables(place: Path) -> IndexTables | None:
    """The current generation in ``place``, or ``None`` (missing, other format or version,
    half-deleted or unreadable: the caller rebuilds)."""
    try:
        meta = orjson.loads((place / "meta.json").read_bytes())
        if meta.get("format") != FORMAT or meta.get("version") != _version():
            return None
        generation = meta["generation"]
        frames = {t: pl.read_parquet(place / f"{t}-{generation}.parquet") for t in TABLES}
        return IndexTables(
            files=frames["files"].cast(dict(FILE_SCHEMA)),  # type: ignore[arg-type]
            calls=CALLS.conform(frames["calls"]),
            tool_calls=TOOL_CALLS.conform(frames["tool_calls"]),
            damaged=GAPS.conform(frames["damaged"]),
        )
    except (OSError, ValueError, KeyError, pl.exceptions.PolarsError):
        return None


def write_tables(place: Path, tables: IndexTables) -> None:
    """Write a new generation into ``place`` and make it current.

    Raises:
        OSError: ``place`` cannot be created or written.
    """
    place.mkdir(parents=True, exist_ok=True)
    with _locked(place / "lock"):
        generation = uuid.uuid4().hex[:12]
        for table in TABLES:
            frame: pl.DataFrame = getattr(tables, table)
            frame.write_parquet(place / f"{table}-{generation}.parquet", compression="zstd")
        meta = {"format": FORMAT, "version": _version(), "generation": generation}
        temporary = place / f"meta.json.{generation}"
        temporary.write_bytes(orjson.dumps(meta))
        os.replace(temporary, place / "meta.json")
        for stale in place.iterdir():
            if stale.suffix == ".parquet" and not stale.stem.endswith(generation):
                with contextlib.suppress(OSError):
                    stale.unlink()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _version() -> str:
    try:
        return metadata.version("ngcapture")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"
