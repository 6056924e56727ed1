"""A scan's reads of segments: where each entry's line is (the first pass), every column of
the entries it takes (the second), and their ``calls`` and ``tool_calls`` rows, built by the
same ``facts_frames`` as rows of decoded entries (``FactsRows.frames``)."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from ngcapture_viz.load._facts_rows import FACT_COLUMNS, TOOL_FIELDS, facts_frames, tool_places
from ngcapture_viz.load.journal_segments.chain import Segment
from ngcapture_viz.load.journal_segments.schema import SEGMENT_SCHEMA, WHERE_COLUMNS

__all__ = ["SegmentTools", "complete", "read_entries", "read_where", "segment_frames"]

#: ``calls`` columns that are the entries' columns of the same name.
_ROW_COLUMNS = ("call_index", "model_call_id", "model_ref_type", "model_ref_name", "dialect",
                "status_code", "started_at", "completed_at", "latency_ttft_ms",
                "error_category", "line_number")  # fmt: skip


def read_where(chain: Sequence[Segment], facts_version: int) -> pl.LazyFrame:
    """The entries of ``chain`` with facts of ``facts_version``: where each line is, and its
    line number as ``index``."""
    return (
        read_entries(chain)
        .filter(pl.col("v") == facts_version)
        .select(*WHERE_COLUMNS, pl.col("line").alias("index"))
    )


def read_entries(chain: Sequence[Segment]) -> pl.LazyFrame:
    """Every column of the entries of ``chain``."""
    return pl.scan_parquet([segment.path for segment in chain], schema=SEGMENT_SCHEMA)


def complete(frame: pl.DataFrame, columns: Sequence[str]) -> bool:
    """Whether ``frame`` has no null in ``columns`` (of those it has): a segment ``write``
    wrote has none where an entry has a value (``schema.NEVER_NULL``)."""
    present = [name for name in columns if name in frame.columns]
    return not any(frame.select(pl.col(present).null_count()).row(0)) if present else True


class SegmentTools:
    """``ToolColumns`` of a segment's ``tool_calls`` column (a list per row, never null)."""

    def __init__(self, tool_calls: pl.Series) -> None:
        self._lists = tool_calls
        self.rows, self.positions = tool_places(tool_calls.list.len().cast(pl.Int64))

    def names(self) -> pl.Series:
        """``tool_names``: each row's tool names."""
        return (
            self._lists.list.eval(pl.element().struct.field("name"))
            .cast(pl.List(pl.String()))
            .alias("tool_names")
        )

    def fields(self) -> dict[str, pl.Series]:
        """Each tool call's fields, flat, in row order."""
        flat = self._lists.explode(empty_as_null=False).drop_nulls()
        return {name: flat.struct.field(name) for name in TOOL_FIELDS}


def segment_frames(
    entries: pl.DataFrame, rollout_ids: pl.Series, paths: pl.Series
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The ``calls`` and ``tool_calls`` rows of segment ``entries`` (their columns, with each
    row's ``call_index`` and ``line_number``), as ``FactsRows.frames`` builds them from the
    decoded entries (``rollout_ids``, ``paths``: each row's)."""
    data: dict[str, pl.Series] = {
        "rollout_id": rollout_ids,
        **{name: entries[name] for name in _ROW_COLUMNS},
        "latency_total_ms": entries["latency_ms"],
        **{name: entries[name] for name in FACT_COLUMNS},
        "num_tool_calls": entries["tool_calls"].list.len(),
        "byte_offset": entries["offset"],
        "line_bytes": entries["length"],
        "path": paths,
    }
    return facts_frames(data, SegmentTools(entries["tool_calls"]))
