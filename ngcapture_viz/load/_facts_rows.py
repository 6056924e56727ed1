"""Rows of lines read from their facts, built column by column (the fast path of a cold open).

A line our server wrote is decoded into a ``FastLine`` struct (envelope + facts, bodies
skipped) and kept as it is; every ``CHUNK_ROWS`` lines the structs become the ``calls`` and
``tool_calls`` columns in one pass per column, and the derived columns (outcome, cache hit,
tokens per second, microsecond timestamps) are computed by Polars over whole columns with the
same arithmetic as ``frames.calls`` applies row by row (a test checks they are equal).
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np
import polars as pl

from ngcapture_viz.frames.calls import CALLS, LENGTH_FINISH_REASONS
from ngcapture_viz.frames.tool_calls import TOOL_CALLS
from ngcapture_viz.load._line_types import FastLine, micros_series

__all__ = ["FactsRows"]


class FactsRows:
    """Accumulates ``FastLine`` structs with where each line is."""

    def __init__(self) -> None:
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

    def frames(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The ``calls`` and ``tool_calls`` rows (``run`` null, as ``CallColumns`` leaves it)."""
        lines = self.lines
        facts = [line.ngcapture_facts for line in lines]
        refs = [line.model_ref for line in lines]
        schema = CALLS.polars
        data: dict[str, Any] = {
            "rollout_id": self.rollout_ids,
            "call_index": self.call_indexes,
            "model_call_id": [line.model_call_id for line in lines],
            "response_id": [f.response_id for f in facts],  # type: ignore[union-attr]
            "model_ref_type": [None if r is None else r.type for r in refs],
            "model_ref_name": [None if r is None else r.name for r in refs],
            "model": [f.model for f in facts],  # type: ignore[union-attr]
            "dialect": [line.dialect for line in lines],
            "stream": [f.stream for f in facts],  # type: ignore[union-attr]
            "status_code": [line.status_code for line in lines],
            "response_status": [f.response_status for f in facts],  # type: ignore[union-attr]
            "finish_reason": [f.finish_reason for f in facts],  # type: ignore[union-attr]
            "started_at": [line.started_at for line in lines],
            "completed_at": [line.completed_at for line in lines],
            "latency_total_ms": [line.latency_ms for line in lines],
            "latency_ttft_ms": [line.latency_ttft_ms for line in lines],
            "tokens_in": [f.tokens_in for f in facts],  # type: ignore[union-attr]
            "tokens_out": [f.tokens_out for f in facts],  # type: ignore[union-attr]
            "tokens_reasoning": [f.tokens_reasoning for f in facts],  # type: ignore[union-attr]
            "tokens_total": [f.tokens_total for f in facts],  # type: ignore[union-attr]
            "cached_tokens": [f.cached_tokens for f in facts],  # type: ignore[union-attr]
            "cache_creation_tokens": [
                f.cache_creation_tokens  # type: ignore[union-attr]
                for f in facts
            ],
            "num_tool_calls": [len(f.tool_calls) for f in facts],  # type: ignore[union-attr]
            "reasoning_content": [f.reasoning_content for f in facts],  # type: ignore[union-attr]
            "error_category": [line.error_category for line in lines],
            "error_code": [f.error_code for f in facts],  # type: ignore[union-attr]
            "error_message": [f.error_message for f in facts],  # type: ignore[union-attr]
            "line_number": self.line_numbers,
            "byte_offset": self.offsets,
            "line_bytes": self.lengths,
            "path": self.paths,
        }
        float_columns = ("started_at", "completed_at", "latency_total_ms", "latency_ttft_ms")
        series = {
            name: pl.Series(
                name, values, dtype=pl.Float64() if name in float_columns else schema[name]
            )
            for name, values in data.items()
        }
        series["tool_names"] = _tool_names(facts)
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
        return calls, self._tools(facts)

    def _tools(self, facts: list[Any]) -> pl.DataFrame:
        rows = [
            (n, position, tool)
            for n, f in enumerate(facts)
            if f.tool_calls
            for position, tool in enumerate(f.tool_calls)
        ]
        lines = self.lines
        data: dict[str, Any] = {
            "rollout_id": [self.rollout_ids[n] for n, _, _ in rows],
            "model_call_id": [lines[n].model_call_id for n, _, _ in rows],
            "call_index": [self.call_indexes[n] for n, _, _ in rows],
            "tool_index": [position for _, position, _ in rows],
            "choice_index": [tool.choice_index for _, _, tool in rows],
            "call_id": [tool.call_id for _, _, tool in rows],
            "type": [tool.type for _, _, tool in rows],
            "name": [tool.name for _, _, tool in rows],
            "arguments": [tool.arguments for _, _, tool in rows],
            "arguments_raw": [tool.arguments_raw for _, _, tool in rows],
            "arguments_parse_error": [tool.arguments_parse_error for _, _, tool in rows],
            "source": ["store"] * len(rows),
        }
        return TOOL_CALLS.from_columns(data)


def _rates(frame: pl.DataFrame, stream: pl.Series) -> pl.Series:
    """``output_tokens_per_s`` as ``frames.calls._rate`` computes it, in numpy (Polars may turn
    a division by a constant into a multiplication, which rounds differently)."""
    latency = frame["latency_total_ms"]
    ttft = frame["latency_ttft_ms"]
    tokens = frame["tokens_out"]
    streamed = stream.to_numpy()
    decode = np.where(streamed, latency.fill_null(0).to_numpy() - ttft.fill_null(0).to_numpy(),
                      latency.fill_null(0).to_numpy())  # fmt: skip
    seconds = np.divide(decode, 1000.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rates = np.divide(tokens.fill_null(0).cast(pl.Float64).to_numpy(), seconds)
    unknown = (
        tokens.is_null().to_numpy()
        | latency.is_null().to_numpy()
        | (streamed & ttft.is_null().to_numpy())
        | ~(seconds > 0)
    )
    return pl.Series("output_tokens_per_s", rates, dtype=pl.Float64).set(pl.Series(unknown), None)


def _tool_names(facts: list[Any]) -> pl.Series:
    """``tool_names`` from flat lists (building a List column row by row is slow)."""
    rows = [n for n, f in enumerate(facts) if f.tool_calls for _ in f.tool_calls]
    names = [tool.name for f in facts if f.tool_calls for tool in f.tool_calls]
    grouped = (
        pl.DataFrame({"row": rows, "name": names}, schema={"row": pl.Int64(), "name": pl.String()})
        .group_by("row", maintain_order=True)
        .agg("name")
    )
    every = pl.DataFrame({"row": pl.int_range(len(facts), eager=True, dtype=pl.Int64)})
    joined = every.join(grouped, on="row", how="left", maintain_order="left")
    return joined["name"].fill_null([]).cast(pl.List(pl.String())).alias("tool_names")
