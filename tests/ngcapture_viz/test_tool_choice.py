"""Tool-call rows say which chat choice asked for them (``n`` > 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ngcapture_viz as ngv
from capture_core.testing import CaptureLineFactory
from tests.ngcapture_viz.conftest import write_capture


def _tool(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": '{"q": 1}'}}  # fmt: skip


@pytest.mark.parametrize("index", [False, True])
def test_tool_calls_name_their_choice(
    capture_dir: Path, line_factory: CaptureLineFactory, index: bool
) -> None:
    chat = line_factory.line(dialect="chat").model_dump(mode="json")
    chat["response_raw"] = None
    chat["response"]["choices"] = [
        {"index": 0, "message": {"role": "assistant", "tool_calls": [_tool("a", "lookup")]},
         "finish_reason": "tool_calls"},
        {"index": 1, "message": {"role": "assistant", "content": "no tool"},
         "finish_reason": "stop"},
        {"index": 2, "message": {"role": "assistant",
                                 "tool_calls": [_tool("b", "lookup"), _tool("c", "search")]},
         "finish_reason": "tool_calls"},
    ]  # fmt: skip
    # The factory's sixth responses line asks for a tool (seed 0): a dialect without choices.
    responses = [line_factory.line(dialect="responses") for _ in range(6)][-1]
    write_capture(capture_dir, "0-0", [chat, responses])
    run = ngv.open_run(capture_dir, index=index)
    tools = run.tool_calls.sort("call_index", "tool_index")
    chat_rows = tools.filter(tools["call_index"] == 0)
    assert chat_rows.select("call_id", "choice_index").rows() == [("a", 0), ("b", 2), ("c", 2)]
    other = tools.filter(tools["call_index"] == 1)
    assert other.height >= 1
    assert other["choice_index"].null_count() == other.height  # no choices: unknown, not 0
    assert ngv.TOOL_CALLS.polars["choice_index"] == run.tool_calls.schema["choice_index"]
