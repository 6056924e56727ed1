"""A task's Responses-shaped request as an Anthropic Messages request, or why it cannot be one.

Used only when the collector is asked for the Messages dialect (``--dialect messages``). The
mapping (anything not listed is refused with a :class:`~capture_core.collect.TaskRowError`
naming it, and the row fails before any model call):

* ``instructions`` and ``system``/``developer`` messages → ``system`` (joined by blank lines);
* user and assistant messages → ``messages`` (string content kept; ``input_text``,
  ``output_text`` and ``text`` parts → ``text`` blocks; ``input_image`` with a ``data:`` URL →
  a base64 ``image`` block, with an ``http(s)`` URL → a ``url`` image block);
* ``function_call`` → an assistant ``tool_use`` block (arguments must be a JSON object),
  ``function_call_output`` → a user ``tool_result`` block; consecutive turns of one role are
  merged into one message, as the Messages API expects;
* ``max_output_tokens`` → ``max_tokens`` (:data:`DEFAULT_MAX_TOKENS` when absent: Messages
  requires it), ``temperature``, ``top_p``, ``tool_choice`` (``auto``, ``none``, ``required`` →
  ``any``, a named function → ``tool``), ``parallel_tool_calls: false`` →
  ``disable_parallel_tool_use``;
* function tools → tools with ``input_schema`` (``parameters``, or an empty object schema).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from capture_core.collect.tasks import PARAMS_KEY, TaskRequest, TaskRowError

__all__ = ["DEFAULT_MAX_TOKENS", "MessagesRequest", "messages_request"]

#: ``max_tokens`` sent when the row gives no ``max_output_tokens`` (Messages requires one).
DEFAULT_MAX_TOKENS: Final = 4096
_SAME: Final = ("temperature", "top_p")
_DATA_URL: Final = re.compile(r"data:(?P<media>[\w.+-]+/[\w.+-]+);base64,(?P<data>.+)", re.S)
_TEXT_PARTS: Final = ("input_text", "output_text", "text")


@dataclass(frozen=True)
class MessagesRequest:
    """A :class:`~capture_core.collect.TaskRequest` as Messages ``system``, ``messages``,
    ``tools``, ``max_tokens`` and the other params."""

    system: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int
    params: dict[str, Any]


def messages_request(request: TaskRequest) -> MessagesRequest:
    """Translate a Responses-shaped request to Anthropic Messages.

    Raises:
        TaskRowError: an item, content part, tool or param has no Messages equivalent.

    Example:
        >>> done = messages_request(TaskRequest(input=[{"role": "user", "content": "Hi"}],
        ...                                     params={"instructions": "Be brief."}))
        >>> done.system, done.messages, done.max_tokens
        ('Be brief.', [{'role': 'user', 'content': 'Hi'}], 4096)
    """
    params = dict(request.params)
    system = [_system_text(params.pop("instructions"), "instructions")] if (
        "instructions" in params) else []  # fmt: skip
    max_tokens = params.pop("max_output_tokens", DEFAULT_MAX_TOKENS)
    if type(max_tokens) is not int or max_tokens < 1:
        raise TaskRowError(f"{PARAMS_KEY}.max_output_tokens must be a positive integer")
    choice = _tool_choice(params.pop("tool_choice", None), params.pop("parallel_tool_calls", None))
    sent: dict[str, Any] = {key: params.pop(key) for key in _SAME if key in params}
    if choice is not None:
        sent["tool_choice"] = choice
    if params:
        raise TaskRowError(f"{PARAMS_KEY}.{next(iter(params))} has no Anthropic Messages "
                           "equivalent; run this row with the responses dialect")  # fmt: skip
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(request.input):
        if item.get("role") in ("system", "developer") and item.get("type") in (None, "message"):
            system.append(_system_text(item.get("content"), f"input[{index}]"))
        else:
            _append(messages, _message(item, index))
    if not messages:
        raise TaskRowError(f"{PARAMS_KEY}.input has no user or assistant message to send")
    tools = [_tool(tool) for tool in request.tools]
    return MessagesRequest("\n\n".join(system) or None, messages, tools, max_tokens, sent)


def _append(messages: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Add ``message``, merged into the last one when it has the same role."""
    if not messages or messages[-1]["role"] != message["role"]:
        messages.append(message)
        return
    last = messages[-1]
    last["content"] = [*_blocks(last["content"]), *_blocks(message["content"])]


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _message(item: Mapping[str, Any], index: int) -> dict[str, Any]:
    kind, where = item.get("type"), f"{PARAMS_KEY}.input[{index}]"
    if kind == "function_call":
        block = {"type": "tool_use", "id": item.get("call_id"), "name": item.get("name"),
                 "input": _arguments(item.get("arguments"), where)}  # fmt: skip
        return {"role": "assistant", "content": [block]}
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _joined_text(output, where)
        result = {"type": "tool_result", "tool_use_id": item.get("call_id"), "content": text}
        return {"role": "user", "content": [result]}
    role = item.get("role")
    if kind not in (None, "message") or role not in ("user", "assistant"):
        raise TaskRowError(f"{where} (type {kind!r}, role {role!r}) has no Anthropic Messages "
                           "equivalent")  # fmt: skip
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise TaskRowError(f"{where}.content must be a string or a list of content parts")
    return {"role": role, "content": [_part(part, where) for part in content]}


def _part(part: object, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, Mapping) else None
    if isinstance(part, Mapping) and kind in _TEXT_PARTS and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    url = part.get("image_url") if isinstance(part, Mapping) and kind == "input_image" else None
    if isinstance(url, str) and (found := _DATA_URL.fullmatch(url)):
        source = {"type": "base64", "media_type": found["media"], "data": found["data"]}
        return {"type": "image", "source": source}
    if isinstance(url, str) and url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise TaskRowError(f"{where} has a content part of type {kind!r} with no Anthropic "
                       "Messages equivalent (text, and images given by a data: or http(s) URL, "
                       "translate)")  # fmt: skip


def _system_text(content: object, where: str) -> str:
    return content if isinstance(content, str) else _joined_text(content, f"{PARAMS_KEY}.{where}")


def _joined_text(content: object, where: str) -> str:
    """The text of a list of text parts; anything else is refused."""
    parts = content if isinstance(content, list) else [content]
    texts = [_part(part, where) for part in parts]
    if any(block["type"] != "text" for block in texts):
        raise TaskRowError(f"{where} must be text to translate to Anthropic Messages")
    return "\n".join(block["text"] for block in texts)


def _arguments(arguments: object, where: str) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise TaskRowError(f"{where}.arguments must be a JSON object to become a tool_use input")
    return parsed


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise TaskRowError(f"{PARAMS_KEY}.tools: only function tools translate to Anthropic "
                           f"Messages, got {tool.get('type')!r}")  # fmt: skip
    spec = {"name": tool["name"], "input_schema": tool.get("parameters") or {"type": "object"}}
    spec |= {key: tool[key] for key in ("description", "strict") if tool.get(key) is not None}
    return spec


def _tool_choice(choice: object, parallel: object) -> dict[str, Any] | None:
    if choice is None and parallel in (None, True):
        return None
    named = {"auto": "auto", "none": "none", "required": "any", None: "auto"}
    if isinstance(choice, Mapping) and choice.get("type") == "function" and choice.get("name"):
        spec: dict[str, Any] = {"type": "tool", "name": choice["name"]}
    elif isinstance(choice, str | None) and choice in named:
        spec = {"type": named[choice]}
    else:
        raise TaskRowError(f"{PARAMS_KEY}.tool_choice {choice!r} has no Anthropic Messages "
                           "equivalent (auto, none, required or a named function "
                           "translate)")  # fmt: skip
    if parallel is False and spec["type"] != "none":
        spec["disable_parallel_tool_use"] = True
    elif parallel not in (None, True, False):
        raise TaskRowError(f"{PARAMS_KEY}.parallel_tool_calls must be true or false")
    return spec
