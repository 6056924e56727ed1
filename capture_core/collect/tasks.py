"""Task rows: what the simple agent sends for each kind of row, or why it cannot use one.

Three kinds of row are understood:

* NeMo Gym data set rows, ``{"responses_create_params": {"input": ..., ...}, <task fields>}``:
  the params are the request (Responses input items, tools, sampling options); every other
  field is the task's (``expected_answer``, ``options``, ``task_id``...) and is kept;
* multiple-choice rows, ``{"question": str, "options": {...} or [{"A": ...}, ...]}``;
* free prompts, ``{"prompt": str}``.

Anything else raises :class:`TaskRowError` with the reason, which the collector writes to the
failures file for that row. For the Chat Completions dialect the Responses params are
translated (:func:`chat_request`); what has no Chat equivalent is refused, never dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from capture_core.collect.attempts import CollectError
from capture_core.collect.mcqa import check_mcqa_row, is_mcqa_row, option_pairs

__all__ = [
    "PARAMS_KEY",
    "ChatRequest",
    "TaskRequest",
    "TaskRowError",
    "chat_request",
    "task_prompt",
    "task_request",
]

PARAMS_KEY: Final = "responses_create_params"
INSTRUCTION: Final = "Answer with the letter of the correct option, as: The answer is (letter)."
#: Params the agent sets itself: it never streams, and it picks the model unless the row does.
_TRANSPORT: Final = frozenset({"stream", "stream_options"})
#: Responses params with a Chat Completions equivalent (name there).
_CHAT_PARAMS: Final = {
    "temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_completion_tokens",
    "parallel_tool_calls": "parallel_tool_calls", "user": "user", "metadata": "metadata",
    "top_logprobs": "top_logprobs", "service_tier": "service_tier", "store": "store",
}  # fmt: skip


class TaskRowError(CollectError):
    """A task row the agent cannot turn into a request; the message says why."""


@dataclass(frozen=True)
class TaskRequest:
    """What to send for a row, in the Responses shape.

    Attributes:
        input: the Responses input items.
        params: the other request params (sampling, instructions...), nulls dropped.
        tools: the row's own tool specs (Responses function tools).
        model: the model the row asks for, if any.
        question: the last user text, for the trajectory's turn.
        kind: where it came from.
    """

    input: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None
    question: str = ""
    kind: Literal["responses_create_params", "question", "prompt"] = "prompt"

    @classmethod
    def from_text(cls, text: str) -> TaskRequest:
        """A one-message request (a sub-agent's task, a prompt)."""
        return cls(input=[{"role": "user", "content": text}], question=text)


def task_prompt(row: Mapping[str, Any]) -> str:
    """The user message for a multiple-choice or prompt row.

    Raises:
        TaskRowError: the row has neither ``question`` + ``options`` nor a ``prompt`` string.

    Example:
        >>> print(task_prompt({"question": "2+2?", "options": {"A": "3", "B": "4"}}))
        2+2?
        <BLANKLINE>
        (A) 3
        (B) 4
        <BLANKLINE>
        Answer with the letter of the correct option, as: The answer is (letter).
    """
    question, options = row.get("question"), row.get("options")
    pairs = option_pairs(options)
    if isinstance(question, str) and pairs:
        choices = [f"({letter}) {text}" for letter, text in pairs]
        return "\n".join([question, "", *choices, "", INSTRUCTION])
    prompt = row.get("prompt")
    if isinstance(prompt, str) and prompt:
        return prompt
    raise TaskRowError(
        f"a task row needs {PARAMS_KEY!r} with 'input', 'question' and 'options', or a "
        "'prompt' string"
    )


def task_request(row: Mapping[str, Any]) -> TaskRequest:
    """The request for a task row.

    Raises:
        TaskRowError: the row cannot be used; the message names the field and the problem.

    Example:
        >>> task_request({"responses_create_params": {"input": "Hi", "temperature": 0.2}}).params
        {'temperature': 0.2}
    """
    if is_mcqa_row(row):
        problem = check_mcqa_row(row)
        if problem is not None:
            raise TaskRowError(problem)
    if PARAMS_KEY not in row:
        prompt = task_prompt(row)
        kind: Literal["question", "prompt"] = "question" if "question" in row else "prompt"
        return TaskRequest(input=[{"role": "user", "content": prompt}], question=prompt,
                           kind=kind)  # fmt: skip
    params = row[PARAMS_KEY]
    if not isinstance(params, Mapping):
        raise TaskRowError(f"{PARAMS_KEY} must be a JSON object, got {_kind(params)}")
    rest = {k: v for k, v in params.items() if v is not None and k not in _TRANSPORT}
    items = _input_items(rest.pop("input", None))
    tools = rest.pop("tools", None) or []
    if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
        raise TaskRowError(f"{PARAMS_KEY}.tools must be a list of tool objects")
    model = rest.pop("model", None)
    if model is not None and not isinstance(model, str):
        raise TaskRowError(f"{PARAMS_KEY}.model must be a string, got {_kind(model)}")
    return TaskRequest(input=items, params=rest, tools=[dict(t) for t in tools], model=model,
                       question=_last_user_text(items), kind=PARAMS_KEY)  # fmt: skip


def _input_items(value: object) -> list[dict[str, Any]]:
    if value is None:
        raise TaskRowError(f"{PARAMS_KEY} has no 'input'")
    if isinstance(value, str):
        if not value:
            raise TaskRowError(f"{PARAMS_KEY}.input is an empty string")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise TaskRowError(
            f"{PARAMS_KEY}.input must be a string or a non-empty list of input items, "
            f"got {_kind(value)}"
        )
    for index, item in enumerate(value):
        has_shape = isinstance(item, Mapping) and (
            isinstance(item.get("role"), str) or isinstance(item.get("type"), str)
        )
        if not has_shape:
            raise TaskRowError(f"{PARAMS_KEY}.input[{index}] is not an input item (an object "
                               "with a 'role' or a 'type')")  # fmt: skip
    return [dict(item) for item in value]


def _last_user_text(items: list[dict[str, Any]]) -> str:
    for item in reversed(items):
        if item.get("role") == "user":
            return _text(item.get("content"))
    return ""


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    texts = [p.get("text") for p in parts if isinstance(p, Mapping)]
    return "\n".join(t for t in texts if isinstance(t, str))


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


# ---------------------------------------------------------------------------------------------
# Chat Completions translation


@dataclass(frozen=True)
class ChatRequest:
    """A :class:`TaskRequest` as Chat Completions messages, tools and params."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    params: dict[str, Any]


def chat_request(request: TaskRequest) -> ChatRequest:
    """Translate a Responses-shaped request to Chat Completions.

    Raises:
        TaskRowError: an item, content part, tool or param has no Chat equivalent.

    Example:
        >>> chat_request(TaskRequest(input=[{"role": "user", "content": "Hi"}],
        ...                          params={"max_output_tokens": 50})).params
        {'max_completion_tokens': 50}
    """
    params: dict[str, Any] = {}
    messages: list[dict[str, Any]] = []
    for key, value in request.params.items():
        if key == "instructions":
            messages.append({"role": "system", "content": _text(value) or str(value)})
        elif key in _CHAT_PARAMS:
            params[_CHAT_PARAMS[key]] = value
        else:
            raise TaskRowError(f"{PARAMS_KEY}.{key} has no Chat Completions equivalent; "
                               "run this row with the responses dialect")  # fmt: skip
    for index, item in enumerate(request.input):
        messages += _chat_messages(item, index)
    return ChatRequest(messages, [_chat_tool(t) for t in request.tools], params)


def _chat_messages(item: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    kind = item.get("type")
    if kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
        }
        return [{"role": "assistant", "content": None, "tool_calls": [call]}]  # fmt: skip
    if kind == "function_call_output":
        return [{"role": "tool", "tool_call_id": item.get("call_id"),
                 "content": _text(item.get("output")) or str(item.get("output"))}]  # fmt: skip
    role = item.get("role")
    if kind not in (None, "message") or role not in ("user", "system", "developer", "assistant"):
        raise TaskRowError(f"{PARAMS_KEY}.input[{index}] (type {kind!r}, role {role!r}) has "
                           "no Chat Completions equivalent")  # fmt: skip
    content = item.get("content")
    if isinstance(content, list):
        content = [_chat_part(part, index) for part in content]
    return [{"role": role, "content": content}]


def _chat_part(part: object, index: int) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, Mapping) else None
    if isinstance(part, Mapping) and kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": part.get("text")}
    if isinstance(part, Mapping) and kind == "input_image" and part.get("image_url"):
        image: dict[str, Any] = {"url": part["image_url"]}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise TaskRowError(f"{PARAMS_KEY}.input[{index}] has a content part of type {kind!r} "
                       "with no Chat Completions equivalent")  # fmt: skip


def _chat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise TaskRowError(f"{PARAMS_KEY}.tools: only function tools translate to Chat "
                           f"Completions, got {tool.get('type')!r}")  # fmt: skip
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": function}
