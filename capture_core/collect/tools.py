"""The simple agent's built-in tools, and the executor that runs and times a tool call.

``lookup`` answers from a small fact table; ``calculator`` evaluates arithmetic safely.
:func:`execute_tool` runs one call the model asked for and measures, around the tool itself,
when it started and ended (Unix seconds, comparable with the capture server's timestamps), so
the agent's ``tool_call`` observations carry executor-measured times.
"""

from __future__ import annotations

import ast
import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import orjson

__all__ = [
    "FACTS",
    "TOOLS",
    "Tool",
    "ToolExecution",
    "calculator",
    "execute_tool",
    "lookup",
    "run_tool",
]

ToolFunction = Callable[..., str]
ERROR_PREFIX: Final = "error:"


@dataclass(frozen=True, slots=True)
class Tool:
    """A built-in tool: its name, description, JSON-schema parameters and implementation."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: ToolFunction

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
        return f"{ERROR_PREFIX} the expression is longer than {_MAX_EXPRESSION} characters"
    try:
        value = _evaluate(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, ArithmeticError) as exc:
        return f"{ERROR_PREFIX} {exc}"
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
_BUILT_IN: Final[Mapping[str, ToolFunction]] = {tool.name: tool.function for tool in TOOLS}


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """What running one tool call gave: its output, outcome, and when it ran (Unix seconds).

    ``status`` is ``failed`` when the output reports an error (``error_type`` says which).
    """

    output: str
    status: Literal["completed", "failed"]
    started_at: float
    completed_at: float
    error_type: str | None = None

    @property
    def duration_ms(self) -> float:
        return (self.completed_at - self.started_at) * 1000


def execute_tool(
    name: str, arguments: str, *, functions: Mapping[str, ToolFunction] | None = None
) -> ToolExecution:
    """Run a tool call on the model's JSON arguments, timing it; problems become its output.

    Args:
        name: the tool the model called.
        arguments: the model's arguments, a JSON object as text.
        functions: the tools by name (default: the built-in ones).

    Example:
        >>> execute_tool("calculator", '{"expression": "6 * 7"}').output
        '42'
    """
    table = _BUILT_IN if functions is None else functions
    started = time.time()
    output, error_type = _run(table, name, arguments)
    completed = max(time.time(), started)
    status: Literal["completed", "failed"] = "completed"
    if error_type is not None or output.startswith(ERROR_PREFIX):
        status, error_type = "failed", error_type or "tool_error"
    return ToolExecution(output, status, started, completed, error_type)


def _run(table: Mapping[str, ToolFunction], name: str, arguments: str) -> tuple[str, str | None]:
    function = table.get(name)
    if function is None:
        return f"{ERROR_PREFIX} unknown tool {name!r}", "unknown_tool"
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError as exc:
        return f"{ERROR_PREFIX} the arguments are not valid JSON: {exc}", "invalid_arguments"
    if not isinstance(args, dict):
        return f"{ERROR_PREFIX} the arguments must be a JSON object", "invalid_arguments"
    try:
        return str(function(**args)), None
    except TypeError as exc:
        return f"{ERROR_PREFIX} {exc}", "invalid_arguments"


def run_tool(name: str, arguments: str) -> str:
    """Run a built-in tool on the model's JSON arguments; problems come back as its output.

    Example:
        >>> run_tool("calculator", '{"expression": "6 * 7"}')
        '42'
    """
    return execute_tool(name, arguments).output
