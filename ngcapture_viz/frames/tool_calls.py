"""The tool-calls frame: one row per tool call a response asked for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson
import polars as pl

from capture_core import ModelCallRecord
from ngcapture_viz.frames._columns import Column, FrameSchema

__all__ = ["TOOL_CALLS", "ToolCallColumns"]

_INT = pl.Int64()
_STR = pl.String()

TOOL_CALLS: Final = FrameSchema(
    "tool_calls",
    [
        Column("run", pl.Categorical(), "The run's label."),
        Column("rollout_id", _STR, "The rollout of the call that asked for the tool."),
        Column("model_call_id", _STR, "The model call that asked for the tool."),
        Column("call_index", _INT, "That call's `call_index`."),
        Column("tool_index", _INT, "Position of the tool call within the response (0-based)."),
        Column("call_id", _STR, "The tool call's id (what the tool result refers to)."),
        Column("type", pl.Categorical(), "Tool call type (function, custom, tool_use...)."),
        Column("name", pl.Categorical(), "Tool name."),
        Column("arguments", _STR, "Parsed arguments re-encoded as JSON (null if unparseable)."),
        Column("arguments_raw", _STR, "Arguments exactly as sent, when they were a string."),
        Column("arguments_parse_error", pl.Boolean(), "The raw arguments were not valid JSON."),
        Column("source", pl.Categorical(), "`store` or `attachment`."),
    ],
)


class ToolCallColumns:
    """Accumulates tool-call rows column by column."""

    _NAMES: Final = [n for n in TOOL_CALLS.names if n != "run"]

    def __init__(self) -> None:
        self.data: dict[str, list[Any]] = {name: [] for name in self._NAMES}

    def __len__(self) -> int:
        return len(self.data["tool_index"])

    def add(
        self, record: ModelCallRecord | Mapping[str, Any], *, rollout_id: str, source: str
    ) -> None:
        """Append one row per tool call of ``record`` (a record or its field dict)."""
        f = record if type(record) is dict or isinstance(record, Mapping) else vars(record)
        d = self.data
        for position, tool in enumerate(f["tool_calls"]):
            d["rollout_id"].append(rollout_id)
            d["model_call_id"].append(f["model_call_id"])
            d["call_index"].append(f["call_index"])
            d["tool_index"].append(position)
            d["call_id"].append(tool.call_id)
            d["type"].append(tool.type)
            d["name"].append(tool.name)
            d["arguments"].append(
                None if tool.arguments is None else orjson.dumps(tool.arguments).decode()
            )
            d["arguments_raw"].append(tool.arguments_raw)
            d["arguments_parse_error"].append(tool.arguments_parse_error)
            d["source"].append(source)

    def frame(self, run: str | None = None) -> pl.DataFrame:
        data: dict[str, Any] = dict(self.data)
        data["run"] = [run] * len(self)
        return TOOL_CALLS.from_columns(data)
