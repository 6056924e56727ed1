"""The values one capture line gives its ``calls`` row and ``tool_calls`` rows, whichever way
it was read (``_decode``), and how two readings of the same line are compared (``verify``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = ["CallValues", "ToolValues", "differences"]


#: A tool call's values: call_id, type, name, arguments (JSON text), arguments_raw, parse error,
#: chat choice.
ToolValues = tuple[str | None, str | None, str | None, str | None, str | None, bool, int | None]


@dataclass(slots=True)
class CallValues:
    """What a row of ``calls`` (and its ``tool_calls`` rows) takes from one line."""

    model_call_id: str | None
    ref_type: str | None
    ref_name: str | None
    dialect: str | None
    status_code: int | None
    started_us: int | None
    completed_us: int | None
    latency_ms: float | None
    ttft_ms: float | None
    error_category: str | None
    # derived from the bodies (or read from the facts)
    response_id: str | None
    model: str | None
    stream: bool | None
    response_status: str | None
    finish_reason: str | None
    tokens: tuple[int | None, int | None, int | None, int | None, int | None, int | None]
    reasoning: str | None
    error_code: str | None
    error_message: str | None
    tools: list[ToolValues]
    #: How the values were read: "facts", "bodies" or "exact".
    path: str = "exact"

    def common(self) -> tuple[Any, ...]:
        """The values read from the envelope (the same whichever way the line was read)."""
        return (
            self.model_call_id,
            self.ref_type,
            self.ref_name,
            self.dialect,
            self.status_code,
            self.started_us,
            self.completed_us,
            self.latency_ms,
            self.ttft_ms,
            self.error_category,
        )

    def derived(self) -> tuple[Any, ...]:
        """The values a line's facts stand for (what ``verify`` compares)."""
        return (
            self.response_id,
            self.model,
            self.stream,
            self.response_status,
            self.finish_reason,
            self.tokens,
            self.reasoning,
            self.error_code,
            self.error_message,
            self.tools,
        )


_DERIVED_NAMES: Final = (
    "response_id",
    "model",
    "stream",
    "response_status",
    "finish_reason",
    "tokens",
    "reasoning_content",
    "error_code",
    "error_message",
    "tool_calls",
)


def differences(stored: CallValues, computed: CallValues) -> list[str]:
    """The names of the derived values on which ``stored`` and ``computed`` differ."""
    return [
        name
        for name, a, b in zip(_DERIVED_NAMES, stored.derived(), computed.derived(), strict=True)
        if a != b
    ]
