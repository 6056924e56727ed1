"""The tool-calls frame: one row per tool call a response asked for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson
import polars as pl

from capture_core import ModelCallRecord
from capture_core.facts import tool_choice_indices
from ngcapture_viz.frames._columns import Column, FrameSchema

if TYPE_CHECKING:
    from ngcapture_viz.load._call_values import CallValues

__all__ = ["TOOL_CALLS", "ToolCallColumns", "tool_choice_indices"]

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
        Column(
            "choice_index",
            _INT,
            "The chat choice that asked for it (several when `n` > 1; null: not a chat "
            "completion, or not known from an attachment).",
        ),
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
        self,
        record: ModelCallRecord | Mapping[str, Any],
        *,
        rollout_id: str,
        source: str,
        choices: list[int] | None = None,
    ) -> None:
        """Append one row per tool call of ``record`` (a record or its field dict).

        ``choices``: the chat choice of each tool call (``tool_choice_indices``), if known.
        """
        f = record if type(record) is dict or isinstance(record, Mapping) else vars(record)
        d = self.data
        if choices is not None and len(choices) != len(f["tool_calls"]):
            choices = None  # the response does not line up with the record: say unknown
        for position, tool in enumerate(f["tool_calls"]):
            d["choice_index"].append(None if choices is None else choices[position])
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

    def add_values(self, v: CallValues, *, rollout_id: str, call_index: int) -> None:
        """Append one row per tool call of a store line read by ``load._decode``."""
        d = self.data
        for position, (call_id, kind, name, arguments, raw, failed, choice) in enumerate(v.tools):
            d["choice_index"].append(choice)
            d["rollout_id"].append(rollout_id)
            d["model_call_id"].append(v.model_call_id)
            d["call_index"].append(call_index)
            d["tool_index"].append(position)
            d["call_id"].append(call_id)
            d["type"].append(kind)
            d["name"].append(name)
            d["arguments"].append(arguments)
            d["arguments_raw"].append(raw)
            d["arguments_parse_error"].append(failed)
            d["source"].append("store")

    def frame(self, run: str | None = None) -> pl.DataFrame:
        data: dict[str, Any] = dict(self.data)
        data["run"] = [run] * len(self)
        return TOOL_CALLS.from_columns(data)
