"""Server-sent events: an incremental, dialect-agnostic parser and a serializer.

Framing follows the WHATWG EventSource rules, made more forgiving for capture:

* a line ends with CRLF, LF or a lone CR, and a CRLF split across two chunks is one line end;
* a UTF-8 byte-order mark at the start of the stream is skipped, and invalid UTF-8 becomes U+FFFD;
* a blank line ends a block; ``:`` starts a comment; one space after ``field:`` is dropped;
* a block becomes an :class:`SSEEvent` when it has a ``data``, ``event`` or ``id`` field, so an
  ``event:`` line with no data is still seen (browsers would drop it);
* :meth:`SSEParser.close` also emits a last block that the server never closed with a blank line.

However a body is split into chunks, the parser returns the same events as
:func:`parse_sse` on the whole body. Which event ends a stream, and how a stream is rebuilt into one
response, is dialect-specific and lives in ``capture_core.dialects``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

__all__ = ["SSEEvent", "SSEParser", "format_event", "format_events", "parse_sse"]

_BOM: Final = b"\xef\xbb\xbf"
# ASCII digits only (str.isdigit() takes any script); a longer value is ignored, not int()-ed.
_RETRY: Final = re.compile(r"[0-9]{1,18}")
_UNPARSED: Final = object()
_LONE_SURROGATE: Final = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_WHOLE_BODY_SLICE: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched SSE block.

    Attributes:
        event: value of the block's last ``event:`` field, whitespace-stripped; None if it had none.
        data: the block's ``data:`` values joined with ``"\\n"`` (``""`` if it had none).
        id: value of the block's last ``id:`` field; a value containing NUL is ignored.
        retry: the block's last ``retry:`` value made only of ASCII digits.
    """

    event: str | None
    data: str
    id: str | None = None
    retry: int | None = None
    _parsed: Any = field(default=_UNPARSED, init=False, repr=False, compare=False)

    def json(self) -> Any:
        """Return ``data`` parsed as JSON (parsed once, then remembered), or None if it is
        empty, ``[DONE]`` or not JSON.

        Example:
            >>> SSEEvent(None, '{"a": 1}').json(), SSEEvent(None, "[DONE]").json()
            ({'a': 1}, None)
        """
        if self._parsed is _UNPARSED:
            object.__setattr__(self, "_parsed", self._parse())
        return self._parsed

    def _parse(self) -> Any:
        data = self.data
        if not data or data == "[DONE]":
            return None
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:  # a ValueError
            pass
        if "\\u" not in data:
            return None
        # JSON may escape a lone surrogate (a character split across two events by a server
        # that cut UTF-16); orjson refuses it. Replace each one with U+FFFD and keep the rest.
        try:
            return orjson.loads(_LONE_SURROGATE.sub(r"\\ufffd", data))
        except orjson.JSONDecodeError:
            return None


class SSEParser:
    """Incremental SSE parser: feed byte chunks split anywhere, then call :meth:`close`.

    Complete lines are decoded and parsed as soon as they arrive; only the unterminated tail of
    the last chunk is kept. After :meth:`close` the parser starts over as if for a new stream
    (``bytes_seen`` keeps counting).

    Example:
        >>> parser = SSEParser()
        >>> parser.feed(b"event: ping\\nda"), parser.feed(b"ta: {}\\n\\n")
        ([], [SSEEvent(event='ping', data='{}', id=None, retry=None)])
        >>> parser.close()
        []
    """

    __slots__ = ("_at_start", "_block", "_bytes_seen", "_pending", "_skip_lf")

    def __init__(self) -> None:
        self._bytes_seen = 0
        self._reset()

    def _reset(self) -> None:
        self._at_start = True  # no byte after a possible BOM seen yet
        self._pending: list[bytes] = []  # bytes of the current line, which has no terminator yet
        self._skip_lf = False  # the last chunk ended with CR, so an LF opening the next is its pair
        # The open block: data lines, event, id, retry, and whether it has a dispatching field.
        self._block: tuple[list[str], str | None, str | None, int | None, bool]
        self._block = ([], None, None, None, False)

    @property
    def bytes_seen(self) -> int:
        """Total number of bytes passed to :meth:`feed`, BOM included."""
        return self._bytes_seen

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk`` and return the events that it completed (often none)."""
        self._bytes_seen += len(chunk)
        if self._at_start:
            head = b"".join(self._pending) + chunk
            if len(head) < len(_BOM) and _BOM.startswith(head):
                self._pending = [head] if head else []
                return []
            self._at_start = False
            self._pending = []
            chunk = head[3:] if head.startswith(_BOM) else head
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
        end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
        if end < 0:
            if chunk:
                self._pending.append(chunk)
            return []
        complete = chunk[: end + 1]
        if self._pending:
            self._pending.append(complete)
            complete = b"".join(self._pending)
        if end + 1 < len(chunk):
            self._pending = [chunk[end + 1 :]]
        else:
            self._pending = []
            self._skip_lf = chunk[end] == 0x0D  # its LF, if any, is in the next chunk
        text = complete.decode("utf-8", "replace")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        lines.pop()  # the empty string after the last terminator
        return self._parse_lines(lines)

    def close(self) -> list[SSEEvent]:
        """End the stream: parse an unterminated last line and emit a block left open."""
        lines = [b"".join(self._pending).decode("utf-8", "replace")] if self._pending else []
        lines.append("")  # the blank line the server may have left out
        out = self._parse_lines(lines)
        self._reset()
        return out

    def _parse_lines(self, lines: list[str]) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        data, event, id_, retry, has_field = self._block
        for line in lines:
            if line[:5] == "data:":  # the hot path
                data.append(line[6:] if line[5:6] == " " else line[5:])
                has_field = True
                continue
            if not line:
                if has_field:  # else data is empty too
                    out.append(SSEEvent(event, "\n".join(data), id_, retry))
                    data = []
                event = id_ = retry = None
                has_field = False
                continue
            colon = line.find(":")
            if colon == 0:
                continue  # comment
            if colon < 0:
                name, value = line, ""
            else:
                name, value = line[:colon], line[colon + 1 :]
                if value[:1] == " ":
                    value = value[1:]
            if name == "data":
                data.append(value)
                has_field = True
            elif name == "event":
                event = value.strip()
                has_field = True
            elif name == "id":
                if "\0" not in value:
                    id_ = value
                    has_field = True
            elif name == "retry" and _RETRY.fullmatch(value):
                retry = int(value)
        self._block = (data, event, id_, retry, has_field)
        return out


def parse_sse(body: bytes | str) -> list[SSEEvent]:
    """Parse a whole SSE body, including a last block with no closing blank line.

    A ``str`` body is encoded as UTF-8 first (lone surrogates end up as U+FFFD).

    Example:
        >>> parse_sse("event: done\\ndata: [DONE]\\n\\n")
        [SSEEvent(event='done', data='[DONE]', id=None, retry=None)]
    """
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    parser = SSEParser()
    events: list[SSEEvent] = []
    for start in range(0, len(body), _WHOLE_BODY_SLICE):  # slices beat one huge decode + split
        events += parser.feed(body[start : start + _WHOLE_BODY_SLICE])
    return events + parser.close()


def format_event(
    data: str | Mapping[str, Any] | list[Any],
    *,
    event: str | None = None,
    id: str | None = None,
) -> bytes:
    """Serialize one SSE event, ending with the blank line that dispatches it.

    A mapping or list is written as compact JSON on one ``data:`` line; a string gets one
    ``data:`` line per line (CR, LF and CRLF all split lines, so they come back as ``"\\n"``).

    Raises:
        ValueError: ``event`` or ``id`` contains a line break, or ``id`` contains NUL: either
            would change the framing.
        orjson.JSONEncodeError: ``data`` is not serializable (also a ``TypeError``).

    Example:
        >>> format_event({"a": 1}, event="ping")
        b'event: ping\\ndata: {"a":1}\\n\\n'
    """
    if isinstance(data, str):
        return _format(data, event, id, None)
    payload = orjson.dumps(data if isinstance(data, dict | list) else dict(data))
    return _format_header(event, id, None) + b"data: " + payload + b"\n\n"


def format_events(events: Iterable[SSEEvent]) -> bytes:
    """Serialize events (``retry`` included) so that :func:`parse_sse` gives them back.

    Example:
        >>> format_events([SSEEvent("a", "1"), SSEEvent(None, "x\\ny", id="7")])
        b'event: a\\ndata: 1\\n\\nid: 7\\ndata: x\\ndata: y\\n\\n'
    """
    return b"".join(_format(e.data, e.event, e.id, e.retry) for e in events)


def _format(data: str, event: str | None, id_: str | None, retry: int | None) -> bytes:
    if "\r" in data:
        data = data.replace("\r\n", "\n").replace("\r", "\n")
    body = "".join(f"data: {line}\n" if line else "data:\n" for line in data.split("\n"))
    return _format_header(event, id_, retry) + body.encode("utf-8", "surrogatepass") + b"\n"


def _format_header(event: str | None, id_: str | None, retry: int | None) -> bytes:
    head = ""
    if event is not None:
        if "\n" in event or "\r" in event:
            raise ValueError(f"SSE event name contains a line break: {event!r}")
        head += f"event: {event}\n"
    if id_ is not None:
        if "\n" in id_ or "\r" in id_ or "\0" in id_:
            raise ValueError(f"SSE id contains a line break or NUL: {id_!r}")
        head += f"id: {id_}\n"
    if retry is not None:
        head += f"retry: {retry}\n"
    return head.encode("utf-8", "surrogatepass")
