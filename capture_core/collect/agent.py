"""A simple agent that drives the official ``openai`` or ``anthropic`` SDK, and helpers for
custom agents.

Capture needs every model call of a rollout to go through ``<model_url>/ng-rollout/<id>``:
:func:`rollout_base_url` builds that base URL for any OpenAI-compatible SDK, and
:func:`~capture_core.ids.rollout_id_from_body` (re-exported here) derives the id from a run
request. :class:`SimpleAgent` sends a task row's request (:func:`task_request`: NeMo Gym
``responses_create_params``, a multiple-choice question or a prompt) with ``responses.create``
(default), ``chat.completions.create`` or Anthropic's ``messages.create``; with ``tools=True``
it offers the built-in tools and runs the calls the model makes, sending their outputs back,
until the model answers in text or ``max_turns`` is reached; with ``subagent=True`` it also
offers ``delegate``, which hands a sub-task to a child invocation of itself.

Besides its answer, every rollout returns its own evidence: ``ng_agent_observations`` (the
invocations, the model calls each made, each tool execution timed by the executor) and an
``ng_trajectory`` with one turn per invocation.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal, Protocol

from capture_core.collect.attempts import CollectError
from capture_core.collect.conversation import (
    ChatConversation,
    Conversation,
    MessagesConversation,
    ModelTurn,
    ResponsesConversation,
)
from capture_core.collect.tasks import TaskRequest, task_prompt, task_request
from capture_core.collect.tools import TOOLS, Tool, ToolFunction, execute_tool, run_tool
from capture_core.ids import rollout_id_from_body, validate_rollout_id
from capture_core.observations import (
    OBSERVATIONS_KEY,
    SCHEMA_VERSION,
    TRAJECTORY_KEY,
    InvocationRecorder,
    ObservationRecorder,
    trajectory_task_id,
)

__all__ = [
    "DEFAULT_MODEL",
    "DELEGATE",
    "ROLLOUT_PATH_PREFIX",
    "SOURCE",
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
TRAINING_SEGMENT: Final = "training-token-capture"
SOURCE: Final = "ngcapture.simple_agent"
MAIN_INVOCATION: Final = "main"
API_KEY: Final = "ngcapture"  # the capture server forwards it; a real upstream would need one
Dialect = Literal["responses", "chat", "messages"]
DIALECTS: Final[tuple[Dialect, ...]] = ("responses", "chat", "messages")
HeadersFor = Mapping[str, str] | Callable[[Mapping[str, Any], str], Mapping[str, str]]
DELEGATE: Final = Tool(
    "delegate",
    "Hand a sub-task to a helper agent that can look facts up and calculate; returns its answer.",
    {"type": "object", "additionalProperties": False,
     "properties": {"task": {"type": "string"}}, "required": ["task"]},
    lambda task: "",  # replaced per call by the child invocation that runs it
)  # fmt: skip


class Agent(Protocol):
    """What the collector runs: one rollout of one row, all model calls under ``rollout_id``."""

    def run(self, row: Mapping[str, Any], rollout_id: str) -> dict[str, Any]:
        """Run the rollout and return the fields to add to the row (``response``...)."""
        ...


def rollout_base_url(model_url: str, rollout_id: str, *, training: bool = False) -> str:
    """The base URL an OpenAI-compatible SDK uses so the rollout's calls are captured.

    ``model_url`` is the capture server's root URL (a trailing slash is fine). ``training``
    adds the training-capture segment: the server then asks the worker for token ids and
    records them (token-id capture, docs/token-store.md).

    Raises:
        InvalidRolloutIdError: the id could not safely name a capture file.

    Example:
        >>> rollout_base_url("http://127.0.0.1:8000/", "3-2-a1")
        'http://127.0.0.1:8000/ng-rollout/3-2-a1/v1'
        >>> rollout_base_url("http://127.0.0.1:8000", "3-2", training=True)
        'http://127.0.0.1:8000/ng-rollout/3-2/training-token-capture/v1'
    """
    prefix = f"{model_url.rstrip('/')}/{ROLLOUT_PATH_PREFIX}/{validate_rollout_id(rollout_id)}"
    return f"{prefix}/{TRAINING_SEGMENT}/v1" if training else f"{prefix}/v1"


@dataclass(frozen=True, slots=True)
class _Answer:
    """How an invocation ended: the last model answer and how many calls it took."""

    turn: ModelTurn
    calls: int
    started_at: float
    question: str
    invocation: InvocationRecorder


#: Opens one invocation's conversation over a rollout's client: (request, offered tools).
OpenConversation = Callable[[TaskRequest, list[dict[str, Any]]], Conversation]


class _Rollout:
    """One rollout's conversation factory, recorder and sub-agent numbering."""

    def __init__(self, open_conversation: OpenConversation, recorder: ObservationRecorder) -> None:
        self.open_conversation, self.recorder = open_conversation, recorder
        self.answers: list[_Answer] = []
        self._children: dict[str, int] = {}
        self._lock = threading.Lock()

    def child_id(self, parent: str) -> str:
        with self._lock:
            self._children[parent] = self._children.get(parent, 0) + 1
            return f"{parent}/{self._children[parent]}"


class SimpleAgent:
    """Run a task row through the capture server with the official ``openai`` or ``anthropic``
    SDK.

    Args:
        model_url: the capture server's root URL.
        model: the model name sent in requests (a row's ``responses_create_params.model``
            wins).
        dialect: ``responses`` (``responses.create``), ``chat`` (``chat.completions.create``)
            or ``messages`` (the ``anthropic`` SDK's ``messages.create``); for the last two a
            NeMo Gym row's Responses params are translated, and what has no equivalent fails
            the row before any call.
        tools: offer the built-in tools and run the calls the model makes.
        subagent: also offer ``delegate``, run as a child invocation (needs ``tools``).
        max_turns: at most this many model calls per invocation.
        timeout_s: the SDK's request timeout.
        headers: extra request headers, or a function of (row, rollout id) returning them.
        model_server: the capture server's model-server name (its ``model_ref``), used to
            name the calls in the observations.
        token_capture: call the training-capture route, so the server records each call's
            token ids (token-id capture).

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
        subagent: bool = False,
        max_turns: int = 4,
        timeout_s: float = 60.0,
        headers: HeadersFor | None = None,
        model_server: str = "policy_model",
        token_capture: bool = False,
    ) -> None:
        if dialect not in DIALECTS:
            raise CollectError(f"dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}")
        if max_turns < 1:
            raise CollectError(f"max_turns must be at least 1, got {max_turns}")
        if subagent and not tools:
            raise CollectError("subagent=True needs tools=True (the sub-agent is a tool)")
        self.model_url = model_url
        self.model = model
        self.dialect: Dialect = dialect
        self.tools = tools
        self.subagent = subagent
        self.max_turns = max_turns
        self.timeout_s = timeout_s
        self.headers = headers
        self.model_server = model_server
        self.token_capture = token_capture

    def run(self, row: Mapping[str, Any], rollout_id: str) -> dict[str, Any]:
        """One rollout: ``{"response", "output_text", "turns", "ng_agent_observations",
        "ng_trajectory"}`` (``turns``: the root invocation's model calls).

        Raises:
            TaskRowError: the row cannot be turned into a request (no model call is made).
        """
        request = task_request(row)
        headers = self.headers(row, rollout_id) if callable(self.headers) else self.headers
        base_url = rollout_base_url(self.model_url, rollout_id, training=self.token_capture)
        with contextlib.ExitStack() as clients:
            opener = self._opener(clients, base_url, dict(headers or {}))
            rollout = _Rollout(opener, ObservationRecorder(SOURCE, model_server=self.model_server))
            answer = self._invoke(rollout, request, rollout.recorder.invocation(MAIN_INVOCATION))
        return {
            "response": answer.turn.response,
            "output_text": answer.turn.text,
            "turns": answer.calls,
            OBSERVATIONS_KEY: rollout.recorder.to_json(),
            **_producer_trajectory(row, rollout_id, rollout.answers),
        }

    def _opener(
        self, clients: contextlib.ExitStack, base_url: str, headers: dict[str, str]
    ) -> OpenConversation:
        """The dialect's SDK client (closed with ``clients``) and its conversation class."""
        options: dict[str, Any] = {"api_key": API_KEY, "max_retries": 0,
                                   "timeout": self.timeout_s,
                                   "default_headers": headers}  # fmt: skip
        if self.dialect == "messages":
            import anthropic

            # The anthropic SDK adds /v1/messages itself.
            claude = clients.enter_context(
                anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), **options)
            )
            return partial(MessagesConversation, claude, self.model)
        import openai

        client = clients.enter_context(openai.OpenAI(base_url=base_url, **options))
        kind = ResponsesConversation if self.dialect == "responses" else ChatConversation
        return partial(kind, client, self.model)

    def _offered(self, *, child: bool) -> list[Tool]:
        if not self.tools:
            return []
        return [DELEGATE, *TOOLS] if self.subagent and not child else list(TOOLS)

    def _invoke(
        self, rollout: _Rollout, request: TaskRequest, invocation: InvocationRecorder
    ) -> _Answer:
        """One invocation's loop: ask, run the tools asked for, until a text answer."""
        started = time.time()
        offered = self._offered(child=invocation.invocation_id != MAIN_INVOCATION)
        talk = rollout.open_conversation(request, [tool.responses_spec() for tool in offered])
        calls = 0
        try:
            while True:
                calls += 1
                turn = talk.ask()
                if turn.response_id:
                    invocation.model_call(response_id=turn.response_id)
                if not turn.calls or calls >= self.max_turns:
                    break
                outputs = []
                for call in turn.calls:
                    functions = self._functions(rollout, invocation, call.call_id, offered)
                    run = execute_tool(call.name, call.arguments, functions=functions)
                    invocation.tool_call(call.call_id, tool_name=call.name,
                                         started_at=run.started_at, completed_at=run.completed_at,
                                         status=run.status, error_type=run.error_type,
                                         timing_source="executor")  # fmt: skip
                    outputs.append((call.call_id, run.output))
                talk.send(outputs)
        except Exception as exc:
            invocation.finish("failed", conversation=talk.history(), error_type=type(exc).__name__)
            raise
        invocation.finish("incomplete" if turn.calls else "completed", conversation=talk.history())
        answer = _Answer(turn, calls, started, request.question, invocation)
        rollout.answers.append(answer)
        return answer

    def _functions(self, rollout: _Rollout, parent: InvocationRecorder, call_id: str,
                   offered: list[Tool]) -> dict[str, ToolFunction]:  # fmt: skip
        functions = {tool.name: tool.function for tool in offered}
        if DELEGATE.name in functions:
            functions[DELEGATE.name] = partial(self._delegate, rollout, parent, call_id)
        return functions

    def _delegate(self, rollout: _Rollout, parent: InvocationRecorder, call_id: str,
                  task: str) -> str:  # fmt: skip
        """Run ``task`` as a child invocation; its answer is the tool's output."""
        child = rollout.recorder.invocation(
            rollout.child_id(parent.invocation_id),
            parent_invocation_id=parent.invocation_id,
            spawned_by_tool_call_id=call_id,
        )
        return self._invoke(rollout, TaskRequest.from_text(str(task)), child).turn.text


def _producer_trajectory(
    row: Mapping[str, Any], rollout_id: str, answers: list[_Answer]
) -> dict[str, Any]:
    """``{"ng_trajectory": ...}`` with one turn per invocation, or ``{}`` without a task id."""
    try:
        task_id = trajectory_task_id(row)
    except ValueError:
        return {}
    turns = [
        {"invocation_id": a.invocation.invocation_id, "task_id": task_id,
         "rollout_id": rollout_id, "turn_no": 1, "timestamp": a.started_at,
         "question": a.question, "answer": a.turn.text, "step_count": a.calls,
         "model_calls": [ref.model_dump(mode="json") for ref in a.invocation.model_calls]}
        for a in answers
    ]  # fmt: skip
    trajectory = {"schema_version": SCHEMA_VERSION, "task_id": task_id,
                  "rollout_id": rollout_id, "turns": turns}  # fmt: skip
    return {TRAJECTORY_KEY: trajectory}
