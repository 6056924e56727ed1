"""A simple agent that drives the official ``openai`` SDK, and helpers for custom agents.

Capture needs every model call of a rollout to go through ``<model_url>/ng-rollout/<id>``:
:func:`rollout_base_url` builds that base URL for any OpenAI-compatible SDK, and
:func:`~capture_core.ids.rollout_id_from_body` (re-exported here) derives the id from a run
request. :class:`SimpleAgent` asks a task's question with ``responses.create`` (default) or
``chat.completions.create``; with ``tools=True`` it offers two built-in tools (``lookup``, a
small fact table, and ``calculator``, safe arithmetic) and runs the tool calls the model makes,
sending their outputs back, until the model answers in text or ``max_turns`` is reached.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, cast

import orjson

from capture_core.collect.attempts import CollectError
from capture_core.ids import rollout_id_from_body, validate_rollout_id

if TYPE_CHECKING:
    import openai

__all__ = [
    "DEFAULT_MODEL",
    "ROLLOUT_PATH_PREFIX",
    "TOOLS",
    "Agent",
    "SimpleAgent",
    "Tool",
    "rollout_base_url",
    "rollout_id_from_body",
    "run_tool",
    "task_prompt",
]

DEFAULT_MODEL: Final = "sim-model-1"
ROLLOUT_PATH_PREFIX: Final = "ng-rollout"
API_KEY: Final = "ngcapture"  # the capture server forwards it; a real upstream would need one
Dialect = Literal["responses", "chat"]
HeadersFor = Mapping[str, str] | Callable[[Mapping[str, Any], str], Mapping[str, str]]


class Agent(Protocol):
    """What the collector runs: one rollout of one row, all model calls under ``rollout_id``."""

    def run(self, row: Mapping[str, Any], rollout_id: str) -> dict[str, Any]:
        """Run the rollout and return the fields to add to the row (``response``...)."""
        ...


def rollout_base_url(model_url: str, rollout_id: str) -> str:
    """The base URL an OpenAI-compatible SDK uses so the rollout's calls are captured.

    ``model_url`` is the capture server's root URL (a trailing slash is fine).

    Raises:
        InvalidRolloutIdError: the id could not safely name a capture file.

    Example:
        >>> rollout_base_url("http://127.0.0.1:8000/", "3-2-a1")
        'http://127.0.0.1:8000/ng-rollout/3-2-a1/v1'
    """
    return f"{model_url.rstrip('/')}/{ROLLOUT_PATH_PREFIX}/{validate_rollout_id(rollout_id)}/v1"


def task_prompt(row: Mapping[str, Any]) -> str:
    """The user message for a task row: a multiple-choice question, or the row's ``prompt``.

    Raises:
        CollectError: the row has neither ``question`` + ``options`` nor a ``prompt`` string.

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
    if isinstance(question, str) and isinstance(options, Mapping) and options:
        choices = [f"({letter}) {text}" for letter, text in options.items()]
        instruction = "Answer with the letter of the correct option, as: The answer is (letter)."
        return "\n".join([question, "", *choices, "", instruction])
    prompt = row.get("prompt")
    if isinstance(prompt, str) and prompt:
        return prompt
    raise CollectError("a task row needs 'question' and 'options', or a 'prompt' string")


# ---------------------------------------------------------------------------------------------
# Built-in tools


@dataclass(frozen=True, slots=True)
class Tool:
    """A built-in tool: its name, description, JSON-schema parameters and implementation."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., str]

    def responses_spec(self) -> dict[str, Any]:
        return {"type": "function", "name": self.name, "description": self.description,
                "parameters": self.parameters}  # fmt: skip

    def chat_spec(self) -> dict[str, Any]:
        function = {"name": self.name, "description": self.description,
                    "parameters": self.parameters}  # fmt: skip
        return {"type": "function", "function": function}


FACTS: Final = {
    "speed of light": "The speed of light in vacuum is 299,792,458 metres per second.",
    "boiling point of water": "Water boils at 100 degrees Celsius at sea level.",
    "largest planet": "Jupiter is the largest planet in the Solar System.",
    "closest planet to the sun": "Mercury is the planet closest to the Sun.",
    "capital of australia": "Canberra is the capital of Australia.",
    "chemical symbol for gold": "The chemical symbol for gold is Au.",
    "longest river": "The Nile and the Amazon are the two longest rivers.",
    "hardest natural substance": "Diamond is the hardest natural substance.",
}
_MAX_EXPRESSION: Final = 200
_MAX_MAGNITUDE: Final = 1e100
_BINARY: Final[dict[type[ast.operator], Callable[[Any, Any], Any]]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}  # fmt: skip
_UNARY: Final[dict[type[ast.unaryop], Callable[[Any], Any]]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def lookup(query: str) -> str:
    """The fact whose key words all occur in ``query``, or a note that there is none.

    Example:
        >>> lookup("What is the speed of light?")
        'The speed of light in vacuum is 299,792,458 metres per second.'
    """
    words = set(str(query).lower().replace("?", " ").split())
    for key, fact in FACTS.items():
        if set(key.split()) <= words:
            return fact
    return f"No entry for {str(query)[:100]!r}. Known topics: {', '.join(FACTS)}."


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / // % **, parentheses) safely.

    Example:
        >>> calculator("(2 + 3) * 4 ** 2")
        '80'
    """
    text = str(expression)
    if len(text) > _MAX_EXPRESSION:
        return f"error: the expression is longer than {_MAX_EXPRESSION} characters"
    try:
        value = _evaluate(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, ArithmeticError) as exc:
        return f"error: {exc}"
    return str(value)


def _evaluate(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return cast(int | float, node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return cast(int | float, _UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise ValueError("the power is too large")
        value = cast(int | float, _BINARY[type(node.op)](left, right))
        if abs(value) > _MAX_MAGNITUDE:
            raise ValueError("the result is too large")
        return value
    raise ValueError(f"unsupported expression element {type(node).__name__}")


_OBJECT: Final = {"type": "object", "additionalProperties": False}
TOOLS: Final = (
    Tool(
        "lookup",
        "Look up a short fact about a science or geography topic.",
        {**_OBJECT, "properties": {"query": {"type": "string"}}, "required": ["query"]},
        lookup,
    ),
    Tool(
        "calculator",
        "Evaluate an arithmetic expression such as (2 + 3) * 4.",
        {**_OBJECT, "properties": {"expression": {"type": "string"}},
         "required": ["expression"]},
        calculator,
    ),
)  # fmt: skip
_BY_NAME: Final = {tool.name: tool for tool in TOOLS}


def run_tool(name: str, arguments: str) -> str:
    """Run a built-in tool on the model's JSON arguments; problems come back as its output.

    Example:
        >>> run_tool("calculator", '{"expression": "6 * 7"}')
        '42'
    """
    tool = _BY_NAME.get(name)
    if tool is None:
        return f"error: unknown tool {name!r}"
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError as exc:
        return f"error: the arguments are not valid JSON: {exc}"
    if not isinstance(args, dict):
        return "error: the arguments must be a JSON object"
    try:
        return tool.function(**args)
    except TypeError as exc:
        return f"error: {exc}"


# ---------------------------------------------------------------------------------------------
# The agent


class SimpleAgent:
    """Ask a task's question through the capture server with the official ``openai`` SDK.

    Args:
        model_url: the capture server's root URL.
        model: the model name sent in requests.
        dialect: ``responses`` (``responses.create``) or ``chat`` (``chat.completions.create``).
        tools: offer the built-in tools and run the calls the model makes.
        max_turns: at most this many model calls per rollout.
        timeout_s: the SDK's request timeout.
        headers: extra request headers, or a function of (row, rollout id) returning them.

    Example:
        >>> agent = SimpleAgent("http://127.0.0.1:8000", tools=True)
        >>> agent.run({"question": "2+2?", "options": {"A": "3", "B": "4"}}, "0-0")["turns"]
        2
    """

    def __init__(
        self,
        model_url: str,
        *,
        model: str = DEFAULT_MODEL,
        dialect: Dialect = "responses",
        tools: bool = False,
        max_turns: int = 4,
        timeout_s: float = 60.0,
        headers: HeadersFor | None = None,
    ) -> None:
        if dialect not in ("responses", "chat"):
            raise CollectError(f"dialect must be 'responses' or 'chat', got {dialect!r}")
        if max_turns < 1:
            raise CollectError(f"max_turns must be at least 1, got {max_turns}")
        self.model_url = model_url
        self.model = model
        self.dialect: Dialect = dialect
        self.tools = tools
        self.max_turns = max_turns
        self.timeout_s = timeout_s
        self.headers = headers

    def run(self, row: Mapping[str, Any], rollout_id: str) -> dict[str, Any]:
        """One rollout: ``{"response": <last response>, "output_text": ..., "turns": n}``."""
        import openai

        prompt = task_prompt(row)
        headers = self.headers(row, rollout_id) if callable(self.headers) else self.headers
        client = openai.OpenAI(
            base_url=rollout_base_url(self.model_url, rollout_id),
            api_key=API_KEY,
            max_retries=0,
            timeout=self.timeout_s,
            default_headers=dict(headers or {}),
        )
        with client:
            if self.dialect == "responses":
                return self._responses(client, prompt)
            return self._chat(client, prompt)

    def _responses(self, client: openai.OpenAI, prompt: str) -> dict[str, Any]:
        import openai

        items: list[Any] = [{"role": "user", "content": prompt}]
        tools: Any = [tool.responses_spec() for tool in TOOLS] if self.tools else openai.omit
        turn = 0
        while True:
            turn += 1
            response = client.responses.create(model=self.model, input=items, tools=tools)
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls or turn >= self.max_turns:
                break
            items += [item.model_dump(mode="json", exclude_none=True) for item in response.output]
            items += [
                {"type": "function_call_output", "call_id": call.call_id,
                 "output": run_tool(call.name, call.arguments)}
                for call in calls
            ]  # fmt: skip
        return {
            "response": response.model_dump(mode="json"),
            "output_text": response.output_text,
            "turns": turn,
        }

    def _chat(self, client: openai.OpenAI, prompt: str) -> dict[str, Any]:
        import openai

        messages: list[Any] = [{"role": "user", "content": prompt}]
        tools: Any = [tool.chat_spec() for tool in TOOLS] if self.tools else openai.omit
        turn = 0
        while True:
            turn += 1
            completion = client.chat.completions.create(
                model=self.model, messages=messages, tools=tools
            )
            message = completion.choices[0].message
            calls = [c for c in message.tool_calls or () if getattr(c, "function", None)]
            if not calls or turn >= self.max_turns:
                break
            requested: list[dict[str, Any]] = []
            outputs: list[dict[str, Any]] = []
            for call in calls:
                function = call.function  # type: ignore[union-attr]  # filtered above
                requested.append({"id": call.id, "type": "function",
                                  "function": {"name": function.name,
                                               "arguments": function.arguments}})  # fmt: skip
                output = run_tool(function.name, function.arguments)
                outputs.append({"role": "tool", "tool_call_id": call.id, "content": output})
            messages.append({"role": "assistant", "content": message.content,
                             "tool_calls": requested})  # fmt: skip
            messages += outputs
        return {
            "response": completion.model_dump(mode="json"),
            "output_text": message.content or "",
            "turns": turn,
        }
