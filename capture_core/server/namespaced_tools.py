"""Namespaced Responses tools: flattened towards the worker, restored for the client.

Responses clients (Codex, for one) declare tools grouped as
``{"type": "namespace", "name": "<ns>", "tools": [...]}`` (or a single tool with a
``namespace`` field) and expect calls back as ``function_call`` items with the short ``name``
plus a separate ``namespace``. The worker only knows plain function tools, so the body it gets
names them ``<ns>__<name>`` (echoed namespaced ``function_call`` history items too), and the
worker's calls to a joined name are restored before the answer is served.

The lineage fingerprint joins ``namespace + "__" + name`` for any ``function_call`` that has a
namespace, so the served form, the client's echo of it and the worker's form all hash the same
tool identity and the next call resolves its parent.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["NamespaceMap", "flatten_request", "joined_name", "restore_output"]

_SEPARATOR: Final = "__"

NamespaceMap = dict[str, tuple[str, str]]
"""Joined name -> (namespace, short name)."""


def joined_name(namespace: str, name: str) -> str:
    """The flat name the worker sees.

    Example:
        >>> joined_name("github", "search")
        'github__search'
    """
    return f"{namespace}{_SEPARATOR}{name}"


def flatten_request(body: dict[str, Any]) -> tuple[dict[str, Any], NamespaceMap]:
    """The Responses body for the worker, and the map to restore its calls with.

    The body is returned unchanged (the same object) when it declares no namespaced tool.

    Example:
        >>> body = {"input": "hi", "tools": [{"type": "namespace", "name": "gh",
        ...     "tools": [{"type": "function", "name": "search", "parameters": {}}]}]}
        >>> flat, names = flatten_request(body)
        >>> flat["tools"]
        [{'type': 'function', 'name': 'gh__search', 'parameters': {}}]
        >>> names
        {'gh__search': ('gh', 'search')}
    """
    tools = body.get("tools")
    if not isinstance(tools, list):
        return body, {}
    names: NamespaceMap = {}
    flat_tools: list[Any] = []
    for tool in tools:
        if not isinstance(tool, dict):
            flat_tools.append(tool)
        elif tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            namespace = tool["name"]
            for inner in tool.get("tools") or ():
                if isinstance(inner, dict):
                    flat_tools.append(_flat_tool(namespace, inner, names))
        elif isinstance(tool.get("namespace"), str) and tool["namespace"]:
            flat_tools.append(_flat_tool(tool["namespace"], tool, names))
        else:
            flat_tools.append(tool)
    if not names:
        return body, {}
    flat = {**body, "tools": flat_tools}
    raw_input = body.get("input")
    if isinstance(raw_input, list):
        flat["input"] = [_flat_call(item) for item in raw_input]
    return flat, names


def _flat_tool(namespace: str, tool: dict[str, Any], names: NamespaceMap) -> dict[str, Any]:
    flat = {k: v for k, v in tool.items() if k != "namespace"}
    flat.setdefault("type", "function")
    name = tool.get("name")
    if isinstance(name, str) and name:
        flat["name"] = joined_name(namespace, name)
        names[flat["name"]] = (namespace, name)
    return flat


def _flat_call(item: object) -> object:
    """An echoed namespaced ``function_call`` as the worker saw it (joined name, no namespace)."""
    if not isinstance(item, dict) or item.get("type") != "function_call":
        return item
    namespace = item.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        return item
    flat = {k: v for k, v in item.items() if k != "namespace"}
    flat["name"] = joined_name(namespace, str(item.get("name") or ""))
    return flat


def restore_output(payload: dict[str, Any], names: NamespaceMap) -> None:
    """Give the worker's calls to a joined name their namespace and short name back, in place."""
    if not names:
        return
    output = payload.get("output")
    if not isinstance(output, list):
        return
    for item in output:
        if not isinstance(item, dict) or item.get("type") != "function_call":
            continue
        name = item.get("name")
        restored = names.get(name) if isinstance(name, str) else None
        if restored is not None:
            item["namespace"], item["name"] = restored
