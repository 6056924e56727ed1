"""One agent conversation over one API dialect: ask the model, send tool outputs back.

:class:`ResponsesConversation` speaks ``responses.create``; :class:`ChatConversation` speaks
``chat.completions.create`` and :class:`MessagesConversation` the ``anthropic`` SDK's
``messages.create``, each translating the task's Responses-shaped request. All keep the history
as Responses input items, which is what an invocation's ``conversation`` holds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from capture_core.collect.messages_request import messages_request
from capture_core.collect.tasks import TaskRequest, chat_request

if TYPE_CHECKING:
    import anthropic
    import openai

__all__ = [
    "ChatConversation",
    "Conversation",
    "MessagesConversation",
    "ModelTurn",
    "RequestedCall",
    "ResponsesConversation",
]


@dataclass(frozen=True, slots=True)
class RequestedCall:
    """A tool call the model asked for."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """One model answer: the response (JSON), its id, its text and the tool calls it asks."""

    response: dict[str, Any]
    response_id: str | None
    text: str
    calls: list[RequestedCall]


class Conversation(Protocol):
    """What the agent loop needs of a dialect."""

    def ask(self) -> ModelTurn:
        """Send the conversation so far; return the model's answer."""
        ...

    def send(self, outputs: Sequence[tuple[str, str]]) -> None:
        """Add the answer's tool calls and their ``(call id, output)`` to the conversation."""
        ...

    def history(self) -> list[dict[str, Any]]:
        """The conversation as Responses input items, the last answer included."""
        ...


def _omit_empty(value: Any) -> Any:
    import openai

    return value if value else openai.omit


class ResponsesConversation:
    """A conversation over the Responses API (``client.responses.create``)."""

    def __init__(
        self, client: openai.OpenAI, model: str, request: TaskRequest, tools: list[dict[str, Any]]
    ) -> None:
        self.client, self.model, self.request = client, request.model or model, request
        self.items: list[dict[str, Any]] = list(request.input)
        self.tools = [*request.tools, *tools]
        self.last: list[dict[str, Any]] = []

    def ask(self) -> ModelTurn:
        response = self.client.responses.create(
            model=self.model,
            input=self.items,  # type: ignore[arg-type]  # Responses input items, as JSON
            tools=_omit_empty(self.tools),
            extra_body=self.request.params or None,
        )
        self.last = [item.model_dump(mode="json", exclude_none=True) for item in response.output]
        calls = [RequestedCall(item.call_id, item.name, item.arguments)
                 for item in response.output if item.type == "function_call"]  # fmt: skip
        return ModelTurn(response.model_dump(mode="json"), response.id, response.output_text, calls)

    def send(self, outputs: Sequence[tuple[str, str]]) -> None:
        self.items += self.last
        self.items += [{"type": "function_call_output", "call_id": call_id, "output": output}
                       for call_id, output in outputs]  # fmt: skip
        self.last = []

    def history(self) -> list[dict[str, Any]]:
        return [*self.items, *self.last]


def _answer_items(content: str | None, calls: Sequence[RequestedCall]) -> list[dict[str, Any]]:
    """A model answer (its text and tool calls) as Responses input items."""
    items: list[dict[str, Any]] = []
    if content:
        items.append({"role": "assistant", "content": content})
    items += [{"type": "function_call", "call_id": c.call_id, "name": c.name,
               "arguments": c.arguments} for c in calls]  # fmt: skip
    return items


def _output_items(outputs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"type": "function_call_output", "call_id": call_id, "output": output}
            for call_id, output in outputs]  # fmt: skip


class ChatConversation:
    """A conversation over Chat Completions (``client.chat.completions.create``)."""

    def __init__(
        self, client: openai.OpenAI, model: str, request: TaskRequest, tools: list[dict[str, Any]]
    ) -> None:
        chat = chat_request(TaskRequest(input=request.input, params=request.params,
                                        tools=[*request.tools, *tools]))  # fmt: skip
        self.client, self.model = client, request.model or model
        self.messages, self.tools, self.params = chat.messages, chat.tools, chat.params
        self.items: list[dict[str, Any]] = list(request.input)
        self.last: tuple[str | None, list[RequestedCall]] = (None, [])

    def ask(self) -> ModelTurn:
        completion = self.client.chat.completions.create(
            model=self.model,
            messages=self.messages,  # type: ignore[arg-type]  # chat messages, as JSON
            tools=_omit_empty(self.tools),
            extra_body=self.params or None,
        )
        message = completion.choices[0].message
        calls = [
            RequestedCall(c.id, c.function.name, c.function.arguments)  # type: ignore[union-attr]
            for c in message.tool_calls or ()
            if getattr(c, "function", None)
        ]
        self.last = (message.content, calls)
        return ModelTurn(completion.model_dump(mode="json"), completion.id,
                         message.content or "", calls)  # fmt: skip

    def send(self, outputs: Sequence[tuple[str, str]]) -> None:
        content, calls = self.last
        requested = [
            {"id": c.call_id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]  # fmt: skip
        self.messages.append({"role": "assistant", "content": content, "tool_calls": requested})
        self.messages += [{"role": "tool", "tool_call_id": call_id, "content": output}
                          for call_id, output in outputs]  # fmt: skip
        self.items += [*_answer_items(content, calls), *_output_items(outputs)]
        self.last = (None, [])

    def history(self) -> list[dict[str, Any]]:
        return [*self.items, *_answer_items(*self.last)]


class MessagesConversation:
    """A conversation over Anthropic Messages (``client.messages.create``).

    Tool calls are ``tool_use`` blocks of the answer; their outputs go back as ``tool_result``
    blocks in the next user message.
    """

    def __init__(
        self,
        client: anthropic.Anthropic,
        model: str,
        request: TaskRequest,
        tools: list[dict[str, Any]],
    ) -> None:
        self.translated = messages_request(TaskRequest(input=request.input, params=request.params,
                                                    tools=[*request.tools, *tools]))  # fmt: skip
        self.client, self.model = client, request.model or model
        self.messages = self.translated.messages
        self.items: list[dict[str, Any]] = list(request.input)
        self.last: tuple[list[dict[str, Any]], str, list[RequestedCall]] = ([], "", [])

    def ask(self) -> ModelTurn:
        import anthropic

        message = self.client.messages.create(
            model=self.model,
            max_tokens=self.translated.max_tokens,
            messages=self.messages,  # type: ignore[arg-type]  # Messages turns, as JSON
            system=self.translated.system or anthropic.omit,
            tools=self.translated.tools or anthropic.omit,  # type: ignore[arg-type]
            extra_body=self.translated.params or None,
        )
        content = [block.model_dump(mode="json", exclude_none=True) for block in message.content]
        text = "".join(block.text for block in message.content if block.type == "text")
        calls = [RequestedCall(block.id, block.name, json.dumps(block.input))
                 for block in message.content if block.type == "tool_use"]  # fmt: skip
        self.last = (content, text, calls)
        return ModelTurn(message.model_dump(mode="json"), message.id, text, calls)

    def send(self, outputs: Sequence[tuple[str, str]]) -> None:
        content, text, calls = self.last
        self.messages.append({"role": "assistant", "content": content})
        results = [{"type": "tool_result", "tool_use_id": call_id, "content": output}
                   for call_id, output in outputs]  # fmt: skip
        self.messages.append({"role": "user", "content": results})
        self.items += [*_answer_items(text, calls), *_output_items(outputs)]
        self.last = ([], "", [])

    def history(self) -> list[dict[str, Any]]:
        return [*self.items, *_answer_items(*self.last[1:])]
