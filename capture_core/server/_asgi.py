"""Small ASGI helpers shared by the server's apps: read a whole request, send a whole response."""

from __future__ import annotations

from typing import Final

from starlette.types import Message, Receive, Send

__all__ = ["REFUSED_KEY", "read_body", "send_whole"]

#: Scope-state key: why the HTTP parser refused the request while its body was read (the
#: client got a 400 from the protocol; the request is no call the client abandoned).
REFUSED_KEY: Final = "ngcapture.refused"


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or ``None`` if the client left before sending it."""
    chunks: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_whole(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    """Send a complete response in one body message, with its ``content-length``."""
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
