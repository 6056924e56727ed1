"""Lineage fingerprints, version 3: how a continuation finds the call it continues.

Two hashes over a conversation's items (chat messages, Anthropic messages or Responses items):

* :func:`assistant_fingerprint` covers only what the model wrote (assistant messages and
  ``function_call`` items; reasoning is left out). A parent's ledger row stores the fingerprint
  of its request plus its response; a child's request replays that history, so hashing the
  child's request items gives the same value.
* :func:`conversation_digest` covers every item's role and, except for ``system`` and
  ``developer`` items, its content, tool calls and tool results. It confirms that the context a
  parent saw is the prefix of the child's request.

Each field is hashed as a one-byte tag, the UTF-8 length as a big-endian u64, then the bytes.
A namespaced Responses tool is named ``<namespace>__<name>`` so two tools that differ only by
namespace never collide.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import orjson

__all__ = [
    "FINGERPRINT_VERSION",
    "assistant_fingerprint",
    "conversation_digest",
    "lineage_request_items",
]

FINGERPRINT_VERSION: Final = 3
_OUTPUT_DOMAIN: Final = b"nemo-gym-lineage"
_CONTEXT_DOMAIN: Final = b"nemo-gym-lineage-context"
_ENVELOPE_ROLE: Final = "_ng_request_envelope"
_TEXT_TYPES: Final = frozenset({"", "text", "input_text", "output_text"})
_SKIPPED_BLOCKS: Final = frozenset({"tool_use", "tool_result"})
_CONTENT_ONLY_BY_POSITION: Final = frozenset({"system", "developer"})

Item = Mapping[str, Any]


def assistant_fingerprint(items: Sequence[Item]) -> str:
    """Hash the model-authored items of a conversation; ``""`` when there are none.

    Example:
        >>> assistant_fingerprint([{"role": "user", "content": "hi"}])
        ''
        >>> len(assistant_fingerprint([{"role": "assistant", "content": "hello"}]))
        64
    """
    digest = hashlib.sha256(_OUTPUT_DOMAIN)
    authored = False
    for item in items:
        if item.get("role") != "assistant" and item.get("type") != "function_call":
            continue
        authored = True
        for ctype, payload in _content_parts(item.get("content")):
            digest.update(_field(0x00, ctype) + _field(0x01, payload))
        for call_id, name, args in _tool_calls(item):
            digest.update(_field(0x02, call_id) + _field(0x03, name) + _field(0x04, args))
    return digest.hexdigest() if authored else ""


def conversation_digest(items: Sequence[Item]) -> str:
    """Hash a conversation's roles and content, tool calls and tool results.

    ``system`` and ``developer`` items count by position only: their content is not hashed.

    Example:
        >>> a = conversation_digest([{"role": "system", "content": "be brief"}])
        >>> a == conversation_digest([{"role": "system", "content": "be long"}])
        True
    """
    digest = hashlib.sha256(_CONTEXT_DOMAIN)
    for item in items:
        role = _role(item)
        digest.update(_field(0x00, role))
        if role in _CONTENT_ONLY_BY_POSITION:
            continue
        for ctype, payload in _content_parts(item.get("content")):
            digest.update(_field(0x01, ctype) + _field(0x02, payload))
        for call_id, name, args in _tool_calls(item):
            digest.update(_field(0x03, call_id) + _field(0x04, name) + _field(0x05, args))
        for call_id, output in _tool_results(item):
            digest.update(_field(0x06, call_id) + _field(0x07, output))
    return digest.hexdigest()


def lineage_request_items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The items of a request body that lineage hashes, in order.

    Chat and Anthropic bodies use ``messages``, Responses bodies ``input`` (a bare string input
    is read as one user message). An Anthropic top-level ``system`` becomes a leading ``system``
    item, like a Chat system message. When the body has ``instructions`` or ``tools``, a pseudo-turn
    holding both (as sorted-key JSON) comes first, so a changed tool list changes the context.

    Example:
        >>> lineage_request_items({"input": "hi"})
        [{'role': 'user', 'content': 'hi'}]
    """
    raw = body["messages"] if "messages" in body else body.get("input")
    if raw is None:
        items: list[dict[str, Any]] = []
    elif isinstance(raw, str):
        items = [{"role": "user", "content": raw}]
    else:
        items = [dict(item) for item in raw]
    if body.get("system") is not None:
        items.insert(0, {"role": "system", "content": body["system"]})
    if "instructions" in body or "tools" in body:
        envelope = {"instructions": body.get("instructions"), "tools": body.get("tools")}
        content = json.dumps(envelope, sort_keys=True, default=str)
        items.insert(0, {"role": _ENVELOPE_ROLE, "content": content})
    return items


def _field(tag: int, value: str) -> bytes:
    data = value.encode("utf-8")
    return bytes((tag,)) + len(data).to_bytes(8, "big") + data


def _canonical(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")


def _text(value: object) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else _canonical(value)


def _arguments(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            return _canonical(orjson.loads(value))
        except orjson.JSONDecodeError:
            return value.strip()
    return _canonical(value)


def _role(item: Item) -> str:
    for key in ("role", "type"):
        value = item.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _content_parts(content: object) -> Iterator[tuple[str, str]]:
    if content is None:
        return
    if isinstance(content, str):
        if content:
            yield "text", content
        return
    if not isinstance(content, list):
        yield type(content).__name__, _canonical(content)
        return
    for block in content:
        if isinstance(block, str):
            if block:
                yield "text", block
            continue
        if not isinstance(block, Mapping):
            yield type(block).__name__, _canonical(block)
            continue
        if "type" not in block:
            raise ValueError(f"content block without a type: {sorted(block)}")
        btype = block["type"]
        if btype in _SKIPPED_BLOCKS:
            continue
        text = block.get("text")
        if btype in _TEXT_TYPES and isinstance(text, str):
            if text:
                yield "text", text
            continue
        yield str(btype), _canonical(block)


def _tool_calls(item: Item) -> Iterator[tuple[str, str, str]]:
    if item.get("type") == "function_call":
        name = _text(item.get("name"))
        namespace = item.get("namespace")
        if namespace:
            name = f"{namespace}__{name}"
        call_id = item.get("call_id") or item.get("id")
        yield _text(call_id), name, _arguments(item.get("arguments"))
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                yield (
                    _text(block.get("id")),
                    _text(block.get("name")),
                    _arguments(block.get("input")),
                )
    for call in item.get("tool_calls") or ():
        function = call.get("function") or {}
        yield (
            _text(call.get("id")),
            _text(function.get("name")),
            _arguments(function.get("arguments")),
        )


def _tool_results(item: Item) -> Iterator[tuple[str, str]]:
    if item.get("type") == "function_call_output":
        yield _text(item.get("call_id") or item.get("id")), _text(item.get("output"))
    if item.get("role") == "tool":
        yield _text(item.get("tool_call_id")), _text(item.get("content"))
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                call_id = block.get("tool_use_id") or block.get("id")
                yield _text(call_id), _text(block.get("content"))
