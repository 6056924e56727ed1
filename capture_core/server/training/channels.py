"""Wrapped ASGI channels: a replayed request body, a tagged or token-marking ``send``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import Message, Receive, Send

from capture_core.server.training.keys import MODEL_CALL_ID_HEADER
from capture_core.tokens import TokenCallCapture


def _marking(send: Send, tokens: TokenCallCapture | None, reason: str) -> Send:
    """``send`` for a call whose tokens are not captured: a 2xx answer (tokens were likely
    generated) marks the rollout incomplete before the client gets its headers."""
    if tokens is None:
        return send

    async def marked(message: Message) -> None:
        if message["type"] == "http.response.start" and 200 <= message["status"] < 300:
            await tokens.missing(reason)
        await send(message)

    return marked


def _with_call_id(send: Send, model_call_id: str) -> Send:
    async def tagged(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", []), (MODEL_CALL_ID_HEADER, model_call_id.encode())]
            message = {**message, "headers": headers}
        await send(message)

    return tagged


def _replay(body: bytes, receive: Receive) -> Callable[[], Awaitable[Message]]:
    """A ``receive`` that gives ``body`` once, then defers to the client's (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
