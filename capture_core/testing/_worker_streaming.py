"""How the simulated worker streams an answer: its SSE events, paced like a real generation.

:func:`_stream` turns an answer into the dialect's SSE events (shaped by the request's
``truncate``, ``inband_error``, ``drop`` or ``slow`` fault) and :func:`_paced` sends them: the
time to first token, then time per token before each content event, at most
:data:`MAX_GENERATION_S` per response. A client that goes away mid-stream cancels the
generation. :mod:`capture_core.testing.worker` uses the same clock (:func:`_ttft_s`,
:func:`_generation_s`) before a non-streamed body.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from starlette.responses import Response, StreamingResponse

from capture_core.sse import SSEEvent, format_event, parse_sse
from capture_core.testing import _worker_faults as faults
from capture_core.testing._worker_answers import tokens_of
from capture_core.testing.answers import Answer
from capture_core.testing.streams import chat_stream, messages_stream, responses_stream

if TYPE_CHECKING:
    from capture_core.testing.worker import WorkerConfig, _Count

__all__ = ["MAX_GENERATION_S"]

MAX_GENERATION_S: Final = 2.0  # cap on the simulated per-token time of one response


def _events(dialect: str, answer: Answer, *, terminal: bool, usage: bool) -> list[SSEEvent]:
    if dialect == "responses":
        raw = responses_stream(answer, terminal=terminal)
    elif dialect == "chat":
        raw = chat_stream(answer, terminal=terminal, include_usage=usage)
    else:  # like Anthropic's API, the usage reports no thinking tokens
        raw = messages_stream(answer, terminal=terminal)
    return parse_sse(raw)


def _stream(
    dialect: str,
    *,
    body: Mapping[str, Any],
    answer: Answer,
    config: WorkerConfig,
    fault: faults.Fault,
    headers: dict[str, str],
    cancelled: _Count,
) -> Response:
    options = body.get("stream_options")
    usage = isinstance(options, dict) and options.get("include_usage") is True
    kind = fault.kind
    terminal = kind not in ("truncate", "inband_error")
    events = _events(dialect, answer, terminal=terminal, usage=usage)
    content = [_delta_text(e) is not None for e in events]
    drop = kind == "drop"
    if drop:
        events = events[: max(1, len(events) // 2)]
    elif kind == "inband_error":
        events = faults.inband_events(dialect, answer, events, content)
    headers = {**headers, "cache-control": "no-cache"}
    pause = fault.delay_s if kind == "slow" else None
    paced = _paced(events, config, drop=drop, pause_s=pause, cancelled=cancelled)
    return StreamingResponse(paced, headers=headers, media_type="text/event-stream")


async def _paced(
    events: list[SSEEvent],
    config: WorkerConfig,
    *,
    drop: bool,
    pause_s: float | None,
    cancelled: _Count,
) -> AsyncIterator[bytes]:
    """Send events one by one: TTFT first, then time per token before each content event.

    With ``pause_s`` (the ``slow`` fault) every event after the first waits that long instead.
    A client that goes away mid-stream cancels the generation (counted in ``cancelled``).
    """
    budget = MAX_GENERATION_S
    try:
        await asyncio.sleep(_ttft_s(config))
        for index, event in enumerate(events):
            text = _delta_text(event)
            if index and pause_s is not None:
                await asyncio.sleep(pause_s)
            elif index and text is not None and config.ms_per_token > 0:
                pause = min(budget, _generation_s(config, tokens_of(text)))
                budget -= pause
                await asyncio.sleep(pause)
            yield format_event(event.data, event=event.event)
    except (asyncio.CancelledError, GeneratorExit):
        cancelled.value += 1
        raise
    if drop:
        raise faults.SimulatedDrop("simulated connection drop (x-ngcapture-fault: drop)")


def _ttft_s(config: WorkerConfig) -> float:
    return max(0.0, config.ttft_ms) / 1000


def _generation_s(config: WorkerConfig, tokens: int) -> float:
    return min(MAX_GENERATION_S, max(0.0, config.ms_per_token) * tokens / 1000)


def _delta_text(event: SSEEvent) -> str | None:
    """The generated text an event carries, or None if it is not a content event."""
    payload = event.json()
    if not isinstance(payload, dict):
        return None
    delta = payload.get("delta")
    if isinstance(delta, str):  # Responses *.delta
        return delta
    if isinstance(delta, dict):  # Messages content_block_delta
        return _first_str(delta, "text", "thinking", "partial_json")
    choices = payload.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        delta = choices[0].get("delta")
        if isinstance(delta, dict):
            calls = delta.get("tool_calls")
            if isinstance(calls, list) and calls and isinstance(calls[0], dict):
                function = calls[0].get("function")
                return _first_str(function, "arguments") if isinstance(function, dict) else None
            return _first_str(delta, "content", "reasoning_content") or None
    return None


def _first_str(mapping: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        if isinstance(mapping.get(key), str):
            return str(mapping[key])
    return None
