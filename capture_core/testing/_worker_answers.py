"""How the simulated worker answers a request: a pure function of seed, dialect and body.

:func:`compose_answer` reads the request (last user text, tools, whether reasoning was asked for,
the output-token limit) and draws the text, reasoning, tool call and usage from a
``random.Random`` seeded with the seed and a SHA-256 of the canonical request JSON without
``stream``/``stream_options``, so a streamed and a non-streamed call get the same answer.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from capture_core.testing.answers import Answer, ToolCallSpec

__all__ = ["compose_answer", "tokens_of"]

_WORDS: Final = re.compile(r"\w+|[^\w\s]")
_OPTION: Final = re.compile(r"\(([A-J])\)|^\s*([A-J])[.):]\s", re.MULTILINE)
_ID_PREFIX: Final = {"responses": "resp_", "chat": "chatcmpl-", "messages": "msg_"}


def tokens_of(text: str) -> int:
    """A rough token count of generated text: one per four characters, at least one."""
    return max(1, math.ceil(len(text) / 4))


@dataclass(frozen=True, slots=True)
class _Prompt:
    text: str  # the last user text
    after_tool: bool
    tool: tuple[str, Any] | None  # name and JSON schema of the first tool to call
    reasoning: bool
    limit: int | None  # the output-token limit asked for


def compose_answer(
    dialect: str, body: Mapping[str, Any], *, seed: int = 0, cache_rate: float = 0.3
) -> Answer:
    """The deterministic answer of the worker to ``body``.

    Example:
        >>> body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
        >>> compose_answer("chat", body, seed=1).model
        'm'
    """
    canonical = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    material = orjson.dumps([seed, dialect, canonical], option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(material).hexdigest()
    rng = random.Random(int(digest, 16))
    prompt = _prompt(dialect, body)
    topic = _topic(prompt.text)
    reasoning = _reasoning(rng, topic) if prompt.reasoning else None
    calls: tuple[ToolCallSpec, ...] = ()
    if prompt.tool is not None and not prompt.after_tool:
        call_id = ("toolu_" if dialect == "messages" else "call_") + digest[24:48]
        args = _arguments(rng, prompt.tool[1], topic)
        calls = (ToolCallSpec(prompt.tool[0], args, call_id),)
        text = rng.choice(["", "Let me look that up."])
    else:
        text = _text(rng, prompt, topic)
    input_tokens = _count_input(body)
    cached = None
    if rng.random() < cache_rate and input_tokens >= 2:
        cached = max(1, int(input_tokens * rng.choice((0.25, 0.5, 0.75))))
    think = tokens_of(reasoning) * 3 if reasoning is not None else None
    out = (tokens_of(text) if text else 0) + sum(tokens_of(c.arguments_json) + 4 for c in calls)
    answer = Answer(
        text=text,
        reasoning=reasoning,
        tool_calls=calls,
        model=str(body["model"]),
        response_id=_ID_PREFIX[dialect] + digest[:24],
        input_tokens=input_tokens,
        output_tokens=max(1, out + (think or 0)),
        reasoning_tokens=think,
        cached_tokens=cached,
    )
    return _limited(answer, prompt.limit)


def _limited(answer: Answer, limit: int | None) -> Answer:
    """Cut the answer at the output-token limit, as a model that ran out of tokens stops."""
    if limit is None or limit < 1 or answer.output_tokens <= limit:
        return answer
    think = min(answer.reasoning_tokens or 0, limit)
    reasoning = answer.reasoning
    if reasoning is not None and think < (answer.reasoning_tokens or 0):
        reasoning = reasoning[: max(1, think * len(reasoning) // (answer.reasoning_tokens or 1))]
    text = answer.text[: (limit - think) * 4]
    return replace(
        answer,
        text=text,
        reasoning=reasoning,
        tool_calls=(),
        output_tokens=limit,
        reasoning_tokens=think if answer.reasoning_tokens is not None else None,
        truncated_by_length=True,
    )


def _topic(text: str) -> str:
    """The first few words of the prompt's first sentence, before any listed option."""
    head = re.split(r"[?.!\n]|\([A-J]\)", text, maxsplit=1)[0]
    return " ".join(re.findall(r"\w+", head)[:6]) or "your question"


def _text(rng: random.Random, prompt: _Prompt, topic: str) -> str:
    letters = sorted({a or b for a, b in _OPTION.findall(prompt.text)})
    if letters:
        pick = rng.choice(letters)
        # NeMo Gym's MCQA prompts ask for the letter in \boxed{}: follow the instruction.
        chosen = f"\\boxed{{{pick}}}" if "\\boxed" in prompt.text else f"({pick})"
        if prompt.after_tool:
            return f"Given the tool result, the answer is {chosen}."
        return f"The answer is {chosen}."
    if prompt.after_tool:
        return rng.choice(
            [
                "Thanks, that settles it: the result confirms the expected value.",
                "According to the tool result, the answer is yes.",
                "The lookup returned what we needed; the answer is 42.",
            ]
        )
    return rng.choice(
        [
            f"Here is a short answer about {topic}: it depends, but usually yes.",
            f"In short, {topic} comes down to the first option.",
            "The answer is (B).",
            f"I looked at {topic}; the most likely answer is the simplest one.",
        ]
    )


def _reasoning(rng: random.Random, topic: str) -> str:
    step = rng.choice(
        ["Compare each option with the facts.", "Check the units first.", "Eliminate the extremes."]
    )
    return f"The question is about {topic}. {step} One option remains consistent."


def _arguments(rng: random.Random, schema: Any, topic: str) -> dict[str, Any]:
    """Small arguments named after the schema's properties (``query`` when it declares none)."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or not props:
        return {"query": topic}
    args: dict[str, Any] = {}
    for name, raw in list(props.items())[:4]:
        spec = raw if isinstance(raw, dict) else {}
        kind = spec.get("type")
        kind = next((k for k in kind if k != "null"), None) if isinstance(kind, list) else kind
        if isinstance(spec.get("enum"), list) and spec["enum"]:
            args[name] = rng.choice(spec["enum"])
        elif kind == "integer":
            args[name] = rng.randint(1, 10)
        elif kind == "number":
            args[name] = round(rng.uniform(0, 100), 2)
        elif kind == "boolean":
            args[name] = rng.random() < 0.5
        elif kind == "array":
            args[name] = [topic]
        elif kind == "object":
            args[name] = {}
        else:
            args[name] = topic
    return args


def _prompt(dialect: str, body: Mapping[str, Any]) -> _Prompt:
    if dialect == "responses":
        raw = body["input"]
        items = [{"role": "user", "content": raw}] if isinstance(raw, str) else _dicts(raw)
        last = items[-1] if items else {}
        after_tool = last.get("type") == "function_call_output"
        tools = [(t.get("name"), t.get("parameters")) for t in _dicts(body.get("tools"))]
        reasoning = body.get("reasoning") is not None
        limit = body.get("max_output_tokens")
    elif dialect == "chat":
        items = _dicts(body["messages"])
        last = items[-1] if items else {}
        after_tool = last.get("role") == "tool"
        functions = [t.get("function") for t in _dicts(body.get("tools"))]
        tools = [(f.get("name"), f.get("parameters")) for f in _dicts(functions)]
        model = str(body["model"]).lower()
        reasoning = body.get("reasoning_effort") is not None or "reason" in model
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        items = _dicts(body["messages"])
        last = items[-1] if items else {}
        results = [b for b in _dicts(last.get("content")) if b.get("type") == "tool_result"]
        after_tool = bool(results)
        tools = [(t.get("name"), t.get("input_schema")) for t in _dicts(body.get("tools"))]
        thinking = body.get("thinking")
        reasoning = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
        limit = body.get("max_tokens")
    choice = body.get("tool_choice")
    callable_ = [(n, s) for n, s in tools if isinstance(n, str) and n]
    use_tool = choice != "none" and not (isinstance(choice, dict) and choice.get("type") == "none")
    return _Prompt(
        text=_last_user_text(items),
        after_tool=after_tool,
        tool=callable_[0] if callable_ and use_tool else None,
        reasoning=reasoning,
        limit=limit if type(limit) is int else None,
    )


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _last_user_text(items: list[dict[str, Any]]) -> str:
    """The text of the last user message that has some (tool results have none)."""
    for item in reversed(items):
        text = _content_text(item.get("content")) if item.get("role") == "user" else ""
        if text:
            return text
    return ""


def _content_text(content: object) -> str:
    """The text of a message's content: a string or a list of parts with ``text``."""
    if isinstance(content, str):
        return content
    parts = [p.get("text") for p in _dicts(content)]
    return " ".join(p for p in parts if isinstance(p, str))


def _count_input(body: Mapping[str, Any]) -> int:
    """Word-ish tokens of every string in the request except the model name, 4 per message."""
    words = messages = 0
    skip = ("model", "stream", "stream_options")
    stack: list[object] = [v for k, v in body.items() if k not in skip]
    for value in _walk(stack):
        if isinstance(value, str):
            words += len(_WORDS.findall(value))
        elif isinstance(value, dict) and ("role" in value or "type" in value):
            messages += 1
    return max(1, words + 4 * messages)


def _walk(stack: list[object]) -> Iterator[object]:
    while stack:  # iterative: request JSON may be nested deeper than the recursion limit
        value = stack.pop()
        yield value
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
