"""The dict fast paths of the dialect readers keep the ``Mapping`` semantics they shortcut.

Bodies and usage objects are tested first with ``type(x) is dict`` (the ABC check of
``Mapping`` is slow); any other mapping must still be read exactly like a dict, and anything
that is not a mapping must still be ignored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import pytest

from capture_core import ModelCallRecord, extract_response, token_stats
from capture_core.testing import CaptureLineFactory


class _Frozen(Mapping[str, Any]):
    """A read-only mapping that is not a dict (nor a dict subclass)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _as_mapping(value: Any) -> Any:
    """``value`` with every nested dict turned into a ``_Frozen`` mapping."""
    if isinstance(value, dict):
        return _Frozen({key: _as_mapping(item) for key, item in value.items()})
    if isinstance(value, list):
        return [_as_mapping(item) for item in value]
    return value


def _bodies() -> list[tuple[str, dict[str, Any]]]:
    lines = CaptureLineFactory(seed=29).lines(300)
    return [(ln.dialect, ln.response) for ln in lines if ln.response is not None]


@pytest.mark.parametrize("dialect", [None, "responses", "chat", "messages", "unknown"])
def test_any_mapping_is_read_like_a_dict(dialect: str | None) -> None:
    bodies = _bodies()
    assert {name for name, _ in bodies} == {"responses", "chat", "messages"}
    kinds = set()
    for name, body in bodies:
        expected = extract_response(dialect or name, body)
        assert extract_response(dialect or name, _as_mapping(body)) == expected
        kinds.add((expected.tokens.tokens_in is not None, bool(expected.tool_calls)))
    # The bodies reach tokens and tool calls, so the comparison reads nested mappings.
    assert kinds >= {(True, True), (True, False)}


def test_usage_details_read_from_any_mapping() -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 40,
        "prompt_tokens_details": {"cached_tokens": 30, "cache_write_tokens": 5},
        "completion_tokens_details": {"reasoning_tokens": 12},
    }
    expected = token_stats(usage, "chat")
    assert (expected.cached_tokens, expected.cache_creation_tokens) == (30, 5)
    assert expected.tokens_reasoning == 12
    assert token_stats(MappingProxyType(usage), "chat") == expected
    assert token_stats(_as_mapping(usage), "chat") == expected


def test_usage_lookups_keep_their_order() -> None:
    # The first count reported wins, group by group and key by key; None and bad types skip.
    usage = {
        "input_tokens": None,
        "prompt_tokens": 7,
        "output_tokens": True,
        "completion_tokens": 3,
        "input_tokens_details": {"cached_tokens": "9", "cached_input_tokens": 4},
        "prompt_tokens_details": [],
        "output_tokens_details": {"thinking_tokens": 2},
        "completion_tokens_details": {"reasoning_tokens": 1},
        "reasoning_output_tokens": 8,
    }
    stats = token_stats(usage, "responses")
    assert (stats.tokens_in, stats.tokens_out, stats.tokens_total) == (7, 3, 10)
    assert (stats.cached_tokens, stats.tokens_reasoning) == (4, 2)
    assert stats.cache_creation_tokens is None
    fallback = token_stats({"cached_input_tokens": 6, "reasoning_output_tokens": 5}, "chat")
    assert (fallback.cached_tokens, fallback.tokens_reasoning) == (6, 5)


@pytest.mark.parametrize("value", [None, "usage", 3, [{"prompt_tokens": 1}], ("a", 1)])
def test_non_mappings_are_not_usage(value: object) -> None:
    assert token_stats(value) == token_stats(None)
    assert token_stats(None).tokens_in is None


def test_non_mapping_nested_shapes_are_skipped() -> None:
    body = {
        "choices": [
            "not a choice",
            {"message": ["not a message"]},
            {
                "finish_reason": "stop",
                "message": {
                    "tool_calls": [7, {"id": "c1", "function": "not a function"}],
                    "function_call": "not a call",
                },
            },
        ],
        "error": ["not an error"],
    }
    facts = extract_response("chat", body)
    assert facts.finish_reason is None  # the first *mapping* choice has none
    assert [(t.call_id, t.name) for t in facts.tool_calls] == [("c1", None)]
    assert (facts.error_code, facts.error_message) == (None, None)
    record = ModelCallRecord(call_index=0, tool_calls=list(facts.tool_calls))
    assert record.tool_calls[0].type == "function"
