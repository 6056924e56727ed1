"""The three API dialects: ``responses``, ``chat`` and ``messages``.

Each dialect module reads facts out of a response body (``extract``), recognizes its stream's
terminal event (``terminal_kind``) and rebuilds a streamed body into the non-streaming object
(``reassemble``). This package picks the dialect by name or request path, and offers the
incremental :class:`TerminalDetector` and whole-body :func:`reassemble_stream` built on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Literal

from capture_core.dialects import chat, messages, responses
from capture_core.dialects._facts import ResponseFacts, TerminalKind, TokenStats
from capture_core.dialects._usage import token_stats
from capture_core.sse import SSEEvent, SSEParser, parse_sse

__all__ = [
    "DIALECTS",
    "DialectName",
    "DialectSpec",
    "ResponseFacts",
    "StreamReassembly",
    "TerminalDetector",
    "TerminalKind",
    "TokenStats",
    "dialect_for_path",
    "extract_response",
    "get_dialect",
    "reassemble_events",
    "reassemble_stream",
    "token_stats",
]

DialectName = Literal["responses", "chat", "messages"]


@dataclass(frozen=True, slots=True)
class DialectSpec:
    """One dialect's name, request path and the three functions that read its bodies."""

    name: str
    path: str
    extract: Callable[[Mapping[str, Any]], ResponseFacts]
    terminal_kind: Callable[[SSEEvent], TerminalKind | None]
    reassemble: Callable[[Iterable[SSEEvent]], dict[str, Any] | None]


DIALECTS: Final[Mapping[str, DialectSpec]] = MappingProxyType(
    {
        module.NAME: DialectSpec(
            module.NAME, module.PATH, module.extract, module.terminal_kind, module.reassemble
        )
        for module in (responses, chat, messages)
    }
)
_BY_PATH: Final = {spec.path: spec for spec in DIALECTS.values()}


def get_dialect(name: str) -> DialectSpec:
    """The dialect called ``name``; ``KeyError`` names the known ones otherwise."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise KeyError(f"unknown dialect {name!r}; known: {', '.join(DIALECTS)}") from None


def dialect_for_path(path: str) -> DialectSpec | None:
    """The dialect served at a (prefix-stripped) request path; other paths are not captured.

    Matching ignores case: an upstream that routes case-insensitively must not serve a dialect
    path that capture did not recognise.

    Example:
        >>> dialect_for_path("/v1/chat/completions").name
        'chat'
    """
    return _BY_PATH.get(path) or _BY_PATH.get(path.lower())


def _guess(response: Mapping[str, Any]) -> DialectSpec | None:
    if isinstance(response.get("choices"), list):
        return DIALECTS["chat"]
    if isinstance(response.get("output"), list) or response.get("object") == "response":
        return DIALECTS["responses"]
    if response.get("type") in ("message", "error") or isinstance(response.get("content"), list):
        return DIALECTS["messages"]
    return None


def extract_response(dialect: str | None, response: Mapping[str, Any] | None) -> ResponseFacts:
    """Facts of a response body; an unknown dialect is recognized by the body's shape."""
    if response is None:
        return ResponseFacts()
    spec = DIALECTS.get(dialect or "") or _guess(response)
    if spec is None:
        return ResponseFacts(tokens=token_stats(response.get("usage")))
    return spec.extract(response)


@dataclass(frozen=True, slots=True)
class StreamReassembly:
    """A stored stream read back.

    Attributes:
        response: the rebuilt non-streaming object, or ``None`` if nothing usable came.
        terminal: how the stream ended, or ``None`` without a terminal event (truncated).
        events: how many events the stream had.
        skipped: events whose data was not JSON (``[DONE]`` and empty data not counted).
    """

    response: dict[str, Any] | None
    terminal: TerminalKind | None
    events: int
    skipped: int = 0


def reassemble_stream(dialect: str, body: bytes | str) -> StreamReassembly:
    """Parse a whole SSE body and rebuild the dialect's non-streaming object.

    A stream without its terminal event keeps whatever could be rebuilt (``terminal`` is then
    ``None``); a body with no usable event gives ``response=None``.
    """
    return reassemble_events(dialect, parse_sse(body))


def reassemble_events(dialect: str, events: list[SSEEvent]) -> StreamReassembly:
    """:func:`reassemble_stream` from the stream's events, parsed already (e.g. by a
    :class:`TerminalDetector` that kept them while the stream passed)."""
    spec = get_dialect(dialect)
    terminal: TerminalKind | None = None
    for event in events:
        terminal = spec.terminal_kind(event)
        if terminal is not None:
            break
    skipped = sum(1 for e in events if e.data not in ("", "[DONE]") and e.json() is None)
    return StreamReassembly(spec.reassemble(events), terminal, len(events), skipped)


class TerminalDetector:
    """Watches a stream chunk by chunk and reports its first terminal event.

    With ``keep_events``, every event of the stream is kept in :attr:`events` (also those
    after the terminal one), so the stream need not be parsed again to be rebuilt
    (:func:`reassemble_events` gives what :func:`reassemble_stream` gives on the whole body).

    Example:
        >>> detector = TerminalDetector("chat")
        >>> detector.feed(b"data: {}\\n\\ndata: [DONE]\\n\\n")
        'complete'
    """

    def __init__(self, dialect: str, *, keep_events: bool = False) -> None:
        self._kind = get_dialect(dialect).terminal_kind
        self._parser = SSEParser()
        self.terminal: TerminalKind | None = None
        self.events: list[SSEEvent] | None = [] if keep_events else None

    def feed(self, chunk: bytes) -> TerminalKind | None:
        """Feed one chunk; returns the terminal kind once seen (and keeps returning it)."""
        if self.events is not None or self.terminal is None:
            self._scan(self._parser.feed(chunk))
        return self.terminal

    def close(self) -> TerminalKind | None:
        """End of stream: a final block without its blank line is considered too."""
        if self.events is not None or self.terminal is None:
            self._scan(self._parser.close())
        return self.terminal

    def _scan(self, events: list[SSEEvent]) -> None:
        if self.events is not None:
            self.events.extend(events)
            if self.terminal is not None:
                return
        for event in events:
            kind = self._kind(event)
            if kind is not None:
                self.terminal = kind
                return
