"""Raw capture lines, as the capture server writes them, built from deterministic answers."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from capture_core.dialects import reassemble_stream
from capture_core.outcome import classify_outcome, classify_status
from capture_core.records import ModelRef, RawCaptureLine
from capture_core.testing.answers import Answer, ToolCallSpec, error_body, request_body
from capture_core.testing.bodies import response_body
from capture_core.testing.streams import response_stream

__all__ = ["DIALECT_NAMES", "CaptureLineFactory", "capture_line", "torn"]

DIALECT_NAMES: Final = ("responses", "chat", "messages")
_WORDS: Final = tuple(
    "the answer is option B because the passage states that energy is conserved while "
    "momentum depends on the frame so we compare each choice against the evidence".split()
)


def _call_id(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def capture_line(
    dialect: str,
    answer: Answer | None = None,
    *,
    stream: bool = False,
    terminal: bool = True,
    status_code: int = 200,
    model_call_id: str | None = None,
    started_at: float = 1786032154.12,
    latency_ms: float = 842.7,
    ttft_ms: float | None = 213.4,
    model_server: str | None = "policy_model",
) -> RawCaptureLine:
    """The capture line of one call answered with ``answer``.

    Streams are stored the way the server stores them: the raw SSE text in ``response_raw``
    and its reassembly in ``response``; ``error_category`` is classified like the server does.

    Example:
        >>> capture_line("chat", Answer(), stream=True).error_category is None
        True
    """
    answer = answer or Answer()
    request = request_body(
        dialect, model=answer.model, stream=stream, tools=bool(answer.tool_calls)
    )
    response: dict[str, Any] | None
    raw: str | None = None
    if status_code >= 400:
        response = error_body(dialect, status_code)
        category = classify_status(status_code)
    elif stream:
        body = response_stream(dialect, answer, terminal=terminal)
        rebuilt = reassemble_stream(dialect, body)
        response, raw = rebuilt.response, body.decode()
        category = classify_outcome(
            status_code,
            streaming=True,
            terminal=rebuilt.terminal,
            response=response,
            body_empty=not body,
            dialect=dialect,
        )
    else:
        response = response_body(dialect, answer)
        category = classify_outcome(
            status_code,
            streaming=False,
            terminal=None,
            response=response,
            body_empty=False,
            dialect=dialect,
        )
    return RawCaptureLine(
        model_call_id=model_call_id or _call_id(dialect, answer, stream, started_at),
        dialect=dialect,
        model_ref=ModelRef(name=model_server) if model_server else None,
        started_at=started_at,
        completed_at=round(started_at + latency_ms / 1000, 6),
        latency_ms=latency_ms,
        latency_ttft_ms=ttft_ms,
        status_code=status_code,
        error_category=category,
        request=request,
        response=response,
        response_raw=raw,
    )


def torn(line: RawCaptureLine, fraction: float = 0.5) -> bytes:
    """The first part of a line, without its newline: what a writer killed mid-line leaves."""
    data = line.to_jsonl()
    return data[: max(1, int(len(data) * fraction))].rstrip(b"\n")


@dataclass
class CaptureLineFactory:
    """Realistic, varied capture lines from a seed (same seed, same lines).

    Mixes the three dialects, streamed and non-streamed calls, reasoning, tool calls, cached
    prompts, rate limits, server errors and truncated streams.

    Example:
        >>> lines = list(CaptureLineFactory(seed=7).lines(3))
        >>> len(lines), lines[0].model_call_id == CaptureLineFactory(seed=7).line().model_call_id
        (3, True)
    """

    seed: int = 0
    start: float = 1786032154.0
    error_rate: float = 0.05
    truncation_rate: float = 0.03

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._clock = self.start
        self._count = 0

    def answer(self, dialect: str) -> Answer:
        rng = self._rng
        words = rng.randint(3, 60)
        text = " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."
        reasoning = None
        if rng.random() < 0.4:
            reasoning = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 40)))
        tools: tuple[ToolCallSpec, ...] = ()
        if rng.random() < 0.25:
            tools = (
                ToolCallSpec(
                    "lookup",
                    {"query": rng.choice(_WORDS), "k": rng.randint(1, 5)},
                    f"call_{self._count}",
                ),
            )
        prompt = rng.randint(40, 4000)
        cached = rng.choice((None, 0, prompt // 2))
        prefix = {"responses": "resp_", "chat": "chatcmpl-", "messages": "msg_"}[dialect]
        return Answer(
            text=text,
            reasoning=reasoning,
            tool_calls=tools,
            model=rng.choice(("sim-model-1", "sim-model-2")),
            response_id=f"{prefix}{self._count:08d}",
            input_tokens=prompt,
            output_tokens=words * 2 + (len(reasoning or "") // 4),
            reasoning_tokens=(len(reasoning) // 4) if reasoning else None,
            cached_tokens=cached,
            truncated_by_length=rng.random() < 0.02,
        )

    def line(self, dialect: str | None = None) -> RawCaptureLine:
        """The next line (dialect chosen at random unless given)."""
        rng = self._rng
        dialect = dialect or rng.choice(DIALECT_NAMES)
        answer = self.answer(dialect)
        latency = round(rng.lognormvariate(6.5, 0.6), 2)
        status = 200
        if rng.random() < self.error_rate:
            status = rng.choice((429, 500, 503))
        stream = rng.random() < 0.5
        truncated = stream and rng.random() < self.truncation_rate
        started = self._clock
        self._clock += latency / 1000 + rng.uniform(0.01, 2.0)
        self._count += 1
        return capture_line(
            dialect,
            answer,
            stream=stream,
            terminal=not truncated,
            status_code=status,
            model_call_id=f"{self.seed:08x}{self._count:024x}",
            started_at=round(started, 6),
            latency_ms=latency,
            ttft_ms=round(latency * rng.uniform(0.1, 0.6), 2) if status == 200 else None,
        )

    def lines(self, n: int, dialect: str | None = None) -> Iterator[RawCaptureLine]:
        """The next ``n`` lines."""
        for _ in range(n):
            yield self.line(dialect)
