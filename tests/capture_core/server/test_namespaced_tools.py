"""Namespaced Responses tools: flattened for the worker, restored for the client (spec 5.6)."""

from __future__ import annotations

from typing import Any

from capture_core._fingerprint import assistant_fingerprint
from capture_core.server.namespaced_tools import flatten_request, restore_output

SEARCH = {"type": "function", "name": "search", "parameters": {"type": "object"}}


def test_group_and_field_forms_flatten_and_echoed_calls_are_joined() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "tools": [
            {"type": "namespace", "name": "gh", "tools": [SEARCH]},
            {**SEARCH, "name": "open", "namespace": "fs"},
            {"type": "function", "name": "plain"},
        ],
        "input": [
            {"role": "user", "content": "hi"},
            {
                "type": "function_call",
                "name": "search",
                "namespace": "gh",
                "call_id": "c1",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
    }
    flat, names = flatten_request(body)
    assert [t["name"] for t in flat["tools"]] == ["gh__search", "fs__open", "plain"]
    assert all("namespace" not in t for t in flat["tools"])
    assert flat["input"][1] == {
        "type": "function_call",
        "name": "gh__search",
        "call_id": "c1",
        "arguments": "{}",
    }
    assert names == {"gh__search": ("gh", "search"), "fs__open": ("fs", "open")}
    assert body["input"][1]["namespace"] == "gh"  # the client's body is left alone


def test_body_without_namespaced_tools_is_unchanged() -> None:
    body: dict[str, Any] = {"input": "hi", "tools": [SEARCH]}
    assert flatten_request(body) == (body, {})


def test_restore_gives_short_name_and_namespace_with_the_same_fingerprint() -> None:
    backend = {"type": "function_call", "name": "gh__search", "call_id": "c1", "arguments": "{}"}
    payload: dict[str, Any] = {"output": [dict(backend), {**backend, "name": "plain"}]}
    restore_output(payload, {"gh__search": ("gh", "search")})
    served, untouched = payload["output"]
    assert (served["name"], served["namespace"]) == ("search", "gh")
    assert untouched == {**backend, "name": "plain"}
    assert assistant_fingerprint([served]) == assistant_fingerprint([backend])
    other = {**served, "namespace": "other"}
    assert assistant_fingerprint([other]) != assistant_fingerprint([served])
