"""Rows of lines read from their facts, built column by column (the fast path of a cold open).

A line our server wrote is decoded into a ``FastLine`` struct (envelope + facts, bodies
skipped) and kept as it is; every ``CHUNK_ROWS`` lines the structs become the ``calls`` and
``tool_calls`` columns in one pass per column, and the derived columns (outcome, cache hit,
tokens per second, microsecond timestamps) are computed by Polars over whole columns with the
same arithmetic as ``frames.calls`` applies row by row (a test checks they are equal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain, repeat
from typing import Any, Final, Protocol

import msgspec
import polars as pl
from msgspec.structs import astuple

from ngcapture_viz.frames.calls import CALLS, LENGTH_FINISH_REASONS
from ngcapture_viz.frames.tool_calls import TOOL_CALLS
from ngcapture_viz.load._line_types import FastLine, _Facts, _Tool, micros_series

__all__ = [
    "FACT_COLUMNS",
    "TOOL_FIELDS",
    "FactsRows",
    "FlatTools",
    "ToolColumns",
    "columns_of",
    "facts_frames",
    "tool_places",
]


class FactsRows:
    """Accumulates ``FastLine`` structs with where each line is."""

    def __init__(self, kind: type[FastLine] = FastLine) -> None:
        self.kind = kind  # FastLine, or a subclass (journal entries)
        self.lines: list[FastLine] = []
        self.rollout_ids: list[str] = []
        self.call_indexes: list[int] = []
        self.line_numbers: list[int] = []
        self.offsets: list[int] = []
        self.lengths: list[int] = []
        self.paths: list[str] = []

    def __len__(self) -> int:
        return len(self.lines)

    def add(  # noqa: PLR0917 - positional: it runs once per line
        self,
        line: FastLine,
        rollout_id: str,
        call_index: int,
        line_number: int,
        offset: int,
        length: int,
        path: str,
    ) -> None:
        self.lines.append(line)
        self.rollout_ids.append(rollout_id)
        self.call_indexes.append(call_index)
        self.line_numbers.append(line_number)
        self.offsets.append(offset)
        self.lengths.append(length)
        self.paths.append(path)

    def extend(  # noqa: PLR0917 - positional, as ``add``
        self,
        lines: list[FastLine],
        rollout_id: str,
        call_index: int,
        line_number: int,
        offsets: list[int],
        lengths: list[int],
        path: str,
    ) -> None:
        """``add`` of consecutive lines of one file (call indexes and line numbers counting up
        from the first line's)."""
        count = len(lines)
        self.lines += lines
        self.rollout_ids += repeat(rollout_id, count)
        self.call_indexes += range(call_index, call_index + count)
        self.line_numbers += range(line_number, line_number + count)
        self.offsets += offsets
        self.lengths += lengths
        self.paths += repeat(path, count)

    def extend_rows(  # noqa: PLR0917 - positional, as ``add``
        self,
        lines: list[FastLine],
        rollout_ids: list[str],
        call_indexes: list[int],
        line_numbers: list[int],
        offsets: list[int],
        lengths: list[int],
        paths: list[str],
    ) -> None:
        """``add`` of many lines at once, each with its own place."""
        self.lines += lines
        self.rollout_ids += rollout_ids
        self.call_indexes += call_indexes
        self.line_numbers += line_numbers
        self.offsets += offsets
        self.lengths += lengths
        self.paths += paths

    def frames(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The ``calls`` and ``tool_calls`` rows (``run`` null, as ``CallColumns`` leaves it)."""
        line = columns_of(self.lines, self.kind)
        facts = line["ngcapture_facts"]
        fact = columns_of(facts, _Facts)
        refs = line["model_ref"]
        data: dict[str, Any] = {
            "rollout_id": self.rollout_ids,
            "call_index": self.call_indexes,
            "model_call_id": line["model_call_id"],
            "model_ref_type": [None if r is None else r.type for r in refs],
            "model_ref_name": [None if r is None else r.name for r in refs],
            "dialect": line["dialect"],
            "status_code": line["status_code"],
            "started_at": line["started_at"],
            "completed_at": line["completed_at"],
            "latency_total_ms": line["latency_ms"],
            "latency_ttft_ms": line["latency_ttft_ms"],
            "error_category": line["error_category"],
            **{name: fact[name] for name in FACT_COLUMNS},
            "num_tool_calls": list(map(len, fact["tool_calls"])),
            "line_number": self.line_numbers,
            "byte_offset": self.offsets,
            "line_bytes": self.lengths,
            "path": self.paths,
        }
        return facts_frames(data, FlatTools(fact["tool_calls"]))


class ToolColumns(Protocol):
    """The tool calls of a chunk of rows, flat: the row and position of each, its fields."""

    rows: pl.Series
    positions: pl.Series

    def names(self) -> pl.Series: ...
    def fields(self) -> Mapping[str, Sequence[Any] | pl.Series]: ...


def tool_places(counts: pl.Series) -> tuple[pl.Series, pl.Series]:
    """The row and the position in its row of each tool call, flat, of rows holding
    ``counts`` tool calls each."""
    places = pl.DataFrame({"count": counts}).select(
        pl.int_range(pl.len(), dtype=pl.Int64).repeat_by("count").alias("row"),
        pl.int_ranges(0, "count", dtype=pl.Int64).alias("position"),
    )
    return (
        places["row"].explode(empty_as_null=False),
        places["position"].explode(empty_as_null=False),
    )


def facts_frames(
    data: Mapping[str, Sequence[Any] | pl.Series], tools: ToolColumns
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The ``calls`` and ``tool_calls`` frames of rows given column by column (``data``: the
    ``calls`` columns a line's envelope, facts and place give, as values or Series; the
    timestamps in seconds), whichever way they were read: from structs (``FactsRows``) or
    from a journal's columnar segments."""
    schema = CALLS.polars
    float_columns = ("started_at", "completed_at", "latency_total_ms", "latency_ttft_ms")
    series = {
        name: pl.Series(name, values, dtype=pl.Float64() if name in float_columns else schema[name])
        for name, values in data.items()
    }
    series["tool_names"] = tools.names()
    series["started_at"] = micros_series(series["started_at"])
    series["completed_at"] = micros_series(series["completed_at"])
    frame = pl.DataFrame(list(series.values()))
    finish, category = pl.col("finish_reason"), pl.col("error_category")
    stream = frame["stream"].fill_null(False)
    frame = frame.with_columns(
        pl.lit(None, pl.Categorical()).alias("run"),
        pl.lit("store").alias("source"),
        pl.when(
            finish.is_in(list(LENGTH_FINISH_REASONS))
            & (category.is_null() | (category == "incomplete"))
        )
        .then(pl.lit("length"))
        .when(category.is_not_null())
        .then(category)
        .otherwise(pl.lit("ok"))
        .alias("outcome"),
        (pl.col("cached_tokens") > 0).alias("cache_hit"),
        _rates(frame, stream),
    )
    calls = CALLS.conform(frame)
    return calls, _tools(tools, series)


def _tools(tools: ToolColumns, series: dict[str, pl.Series]) -> pl.DataFrame:
    rows = tools.rows
    fields = tools.fields()
    data: dict[str, Any] = {
        "rollout_id": series["rollout_id"].gather(rows),
        "model_call_id": series["model_call_id"].gather(rows),
        "call_index": series["call_index"].gather(rows),
        "tool_index": tools.positions,
        **{name: fields[name] for name in TOOL_FIELDS},
        "source": ["store"] * len(rows),
    }
    return TOOL_CALLS.from_columns(data)


class FlatTools:
    """The tool calls of every row in one list, with the row and position of each."""

    def __init__(self, per_row: Sequence[list[_Tool]]) -> None:
        self.count = len(per_row)
        self.flat: list[_Tool] = list(chain.from_iterable(per_row))
        self.rows, self.positions = tool_places(
            pl.Series(list(map(len, per_row)), dtype=pl.Int64())
        )

    def fields(self) -> dict[str, Sequence[Any]]:
        return columns_of(self.flat, _Tool)

    def names(self) -> pl.Series:
        """``tool_names``."""
        names = pl.Series(values=[tool.name for tool in self.flat], dtype=pl.String())
        return self.per_row(names).alias("tool_names")

    def per_row(self, values: pl.Series) -> pl.Series:
        """``values`` (one per tool call, in order) as a list per row, empty for a row
        without tool calls (building a List column row by row is slow)."""
        grouped = (
            pl.DataFrame({"row": self.rows, "value": values})
            .group_by("row", maintain_order=True)
            .agg("value")
        )
        every = pl.DataFrame({"row": pl.int_range(self.count, eager=True, dtype=pl.Int64)})
        joined = every.join(grouped, on="row", how="left", maintain_order="left")
        return joined["value"].fill_null([]).cast(pl.List(values.dtype))


#: The fields of a tool call (``_Tool``'s) that ``tool_calls`` has.
TOOL_FIELDS: Final = ("choice_index", "call_id", "type", "name", "arguments", "arguments_raw",
                      "arguments_parse_error")  # fmt: skip
#: The facts (``_Facts``' fields) that are ``calls`` columns of the same name.
FACT_COLUMNS: Final = ("response_id", "model", "stream", "response_status", "finish_reason",
                       "tokens_in", "tokens_out", "tokens_reasoning", "tokens_total",
                       "cached_tokens", "cache_creation_tokens", "reasoning_content",
                       "error_code", "error_message")  # fmt: skip


def columns_of(items: Sequence[Any], kind: type[msgspec.Struct]) -> dict[str, Sequence[Any]]:
    """The fields of ``items`` (structs of type ``kind``) as columns, transposed in C."""
    names = kind.__struct_fields__
    if not items:
        return dict.fromkeys(names, ())
    return dict(zip(names, zip(*map(astuple, items), strict=True), strict=True))


def _rates(frame: pl.DataFrame, stream: pl.Series) -> pl.Series:
    """``output_tokens_per_s`` as ``frames.calls._rate`` computes it. Both divisions are of
    one column by another: Polars turns a division by a constant into a multiplication by its
    inverse, which rounds differently, so the 1000 is a column too."""
    latency = pl.col("latency_total_ms")
    ttft = pl.col("latency_ttft_ms")
    tokens = pl.col("tokens_out")
    streamed = pl.col("streamed")
    seconds = pl.when(streamed).then(latency - ttft).otherwise(latency) / pl.col("thousand")
    unknown = tokens.is_null() | latency.is_null() | (streamed & ttft.is_null()) | ~(seconds > 0)
    return (
        frame.select(latency, ttft, tokens)
        .with_columns(
            stream.alias("streamed"),
            pl.Series("thousand", [1000.0], dtype=pl.Float64()).new_from_index(0, frame.height),
        )
        .select(
            pl.when(unknown)
            .then(None)
            .otherwise(tokens.cast(pl.Float64) / seconds)
            .alias("output_tokens_per_s")
        )
        .to_series()
    )
