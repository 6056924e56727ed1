"""Faults the simulated worker injects, chosen per request by header or query parameter.

A request names its fault with the ``x-ngcapture-fault`` header (or ``?fault=``; ``none`` asks
for no fault). ``timeout`` (wait before answering, default 30 s) and ``slow`` (wait before each
streamed event, default 0.25 s) read their delay from ``x-ngcapture-fault-delay`` (or
``?fault_delay=``), capped at 120 s; a ``slow`` answer that is not streamed sends two thirds of its
body, waits, then the rest. This module reads that choice and builds the faulty
answers; :mod:`capture_core.testing.worker` decides when to use them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from starlette.responses import Response, StreamingResponse

from capture_core.sse import SSEEvent
from capture_core.testing.answers import Answer, error_body
from capture_core.testing.bodies import responses_body

__all__ = [
    "FAULTS",
    "FAULT_DELAY_HEADER",
    "FAULT_HEADER",
    "Fault",
    "SimulatedDrop",
    "cut_json",
    "dropped_json",
    "inband_body",
    "inband_events",
    "json_response",
    "read_fault",
    "slow_json",
    "status_response",
]

FAULT_HEADER: Final = "x-ngcapture-fault"
FAULT_DELAY_HEADER: Final = "x-ngcapture-fault-delay"
STATUS_FAULTS: Final = {"401": 401, "429": 429, "500": 500, "503": 503}
FAULTS: Final = (
    *STATUS_FAULTS,
    "drop",
    "inband_error",
    "malformed",
    "none",
    "slow",
    "timeout",
    "truncate",
)
DEFAULT_DELAY_S: Final = {"timeout": 30.0, "slow": 0.25}
MAX_DELAY_S: Final = 120.0

_SERVER_ERROR: Final = "simulated server error (x-ngcapture-fault: inband_error)"
_OVERLOADED: Final = "Overloaded (simulated, x-ngcapture-fault: inband_error)"


class SimulatedDrop(RuntimeError):
    """Raised inside a response on purpose, so the server aborts the connection mid-body."""


@dataclass(frozen=True, slots=True)
class Fault:
    """The fault a request asked for: ``kind`` is one of :data:`FAULTS` (not ``none``) or None.

    ``delay_s`` is the wait of ``timeout`` (once) or ``slow`` (per streamed event).
    """

    kind: str | None = None
    delay_s: float = 0.0

    @property
    def status(self) -> int | None:
        """The HTTP status of a status fault (``"429"`` → 429), else None."""
        return STATUS_FAULTS.get(self.kind or "")


def read_fault(headers: Mapping[str, str], query: Mapping[str, str]) -> Fault:
    """The fault named by the request's header or query parameter (the header wins).

    Raises:
        ValueError: unknown fault, or a delay that is not a non-negative number; the message
            names the allowed values.
    """
    kind = headers.get(FAULT_HEADER) or query.get("fault") or None
    if kind is not None and kind not in FAULTS:
        raise ValueError(f"unknown fault {kind!r}; allowed: {', '.join(FAULTS)}")
    kind = None if kind == "none" else kind
    raw = headers.get(FAULT_DELAY_HEADER) or query.get("fault_delay")
    if raw is None:
        return Fault(kind, DEFAULT_DELAY_S.get(kind or "", 0.0))
    try:
        delay = float(raw)
    except ValueError:
        delay = -1.0
    if not 0.0 <= delay < float("inf"):
        raise ValueError(f"{FAULT_DELAY_HEADER} must be a number of seconds >= 0, got {raw!r}")
    return Fault(kind, min(delay, MAX_DELAY_S))


def json_response(
    payload: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """Compact orjson bytes as ``application/json`` (byte-identical for equal payloads)."""
    return Response(orjson.dumps(payload), status, headers, media_type="application/json")


def status_response(dialect: str, status: int) -> Response:
    """An HTTP error in the dialect's shape; a 429 says it may be retried at once."""
    message = f"simulated {status} (x-ngcapture-fault: {status})"
    headers = {"retry-after": "0"} if status == 429 else None
    return json_response(error_body(dialect, status, message), status=status, headers=headers)


def cut_json(body: bytes) -> bytes:
    """The first half of a JSON body: framing complete, JSON not (``malformed``, ``truncate``)."""
    return body[: max(1, len(body) // 2)]


def dropped_json(body: bytes, headers: Mapping[str, str]) -> Response:
    """A 200 that announces the whole body, sends half of it, then aborts the connection."""

    async def half_then_drop() -> AsyncIterator[bytes]:
        yield cut_json(body)
        raise SimulatedDrop("simulated connection drop (x-ngcapture-fault: drop)")

    length = {**headers, "content-length": str(len(body))}
    return StreamingResponse(half_then_drop(), headers=length, media_type="application/json")


def slow_json(body: bytes, headers: Mapping[str, str], pause_s: float, on_cancel: Any) -> Response:
    """A 200 that sends two thirds of its body, waits ``pause_s``, then the rest (``slow``
    without streaming): a client can leave mid-body. ``on_cancel()`` runs if the client does."""

    async def thirds() -> AsyncIterator[bytes]:
        third = max(1, len(body) // 3)
        try:
            yield body[:third]
            await asyncio.sleep(min(0.05, pause_s))  # two writes, so the first can get through
            yield body[third : 2 * third]
            await asyncio.sleep(pause_s)
            yield body[2 * third :]
        except (asyncio.CancelledError, GeneratorExit):
            on_cancel()
            raise

    length = {**headers, "content-length": str(len(body))}
    return StreamingResponse(thirds(), headers=length, media_type="application/json")


def inband_body(dialect: str, answer: Answer) -> dict[str, Any]:
    """What a non-streaming ``inband_error`` call returns with HTTP 200."""
    if dialect == "responses":
        return _failed_response(answer)
    if dialect == "messages":
        return {"type": "error", "error": {"type": "overloaded_error", "message": _OVERLOADED}}
    return {"error": _openai_error()}


def inband_events(
    dialect: str, answer: Answer, events: list[SSEEvent], content: list[bool]
) -> list[SSEEvent]:
    """Cut a stream after its second content event and end it with the in-band error.

    ``content[i]`` says whether ``events[i]`` carries generated text. Responses end with
    ``response.failed``, Chat Completions with a data-only ``{"error": ...}`` (and no
    ``[DONE]``), Messages with ``event: error`` of type ``overloaded_error``.
    """
    marks = [i for i, flag in enumerate(content) if flag][:2]
    kept = events[: marks[-1] + 1] if marks else events[:1]
    if dialect == "responses":
        last = kept[-1].json() if kept else None
        seq = last.get("sequence_number", -1) + 1 if isinstance(last, dict) else 0
        failed = {"type": "response.failed", "sequence_number": seq}
        failed["response"] = _failed_response(answer)
        return [*kept, SSEEvent("response.failed", orjson.dumps(failed).decode())]
    if dialect == "messages":
        error = inband_body(dialect, answer)
        return [*kept, SSEEvent("error", orjson.dumps(error).decode())]
    return [*kept, SSEEvent(None, orjson.dumps({"error": _openai_error()}).decode())]


def _openai_error() -> dict[str, Any]:
    return {"message": _SERVER_ERROR, "type": "server_error", "param": None, "code": "server_error"}


def _failed_response(answer: Answer) -> dict[str, Any]:
    return {
        **responses_body(answer),
        "status": "failed",
        "incomplete_details": None,
        "error": {"code": "server_error", "message": _SERVER_ERROR},
        "output": [],
        "usage": None,
    }
