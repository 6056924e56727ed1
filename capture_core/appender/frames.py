"""The appender's wire format: length-prefixed frames over a stream socket (little-endian).

A request (server to appender) asks for one line to be appended::

    u32 frame length (header included) | u64 job | u16 name length | u32 fields length
    | name (UTF-8, a file name in the capture directory) | fields | line

``fields`` is what the line's facts journal entry repeats of it (a JSON object, see
:func:`capture_core.facts_journal.journal_fields`), empty when the line gets no entry; ``line``
is the encoded capture line, newline included.

An answer (appender to server) tells how that job ended::

    u64 job | i64 bytes written (-1: failed) | i32 errno (0: none) | u16 reason length | reason

Both ends are this package's; the socket is a ``socketpair`` nobody else holds, so a frame that
does not parse is a bug, reported as :class:`FrameError`, never guessed around.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "MAX_FRAME_BYTES",
    "Answer",
    "FrameError",
    "FrameReader",
    "Request",
    "encode_answer",
    "encode_request",
]

_REQUEST: Final = struct.Struct("<IQHI")
_ANSWER: Final = struct.Struct("<QqiH")
#: The largest request: lines of calls over ``LARGE_LINE_BYTES`` never come this way.
MAX_FRAME_BYTES: Final = 1 << 30


class FrameError(ValueError):
    """Bytes on the appender's socket that are not a frame of this format."""


@dataclass(frozen=True, slots=True)
class Request:
    job: int
    name: str
    fields: bytes
    line: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    job: int
    written: int  # bytes appended (the line, and a newline closing a torn one); -1: failed
    errno: int = 0
    reason: str = ""


def encode_request(job: int, name: str, fields: bytes, line: bytes) -> bytes:
    """One request frame.

    Raises:
        FrameError: the name or the frame is too long for the format.
    """
    encoded = name.encode()
    size = _REQUEST.size + len(encoded) + len(fields) + len(line)
    if len(encoded) > 0xFFFF or size > MAX_FRAME_BYTES:
        raise FrameError(f"a request of {size} bytes (name {len(encoded)}) does not fit a frame")
    return b"".join((_REQUEST.pack(size, job, len(encoded), len(fields)), encoded, fields, line))


def encode_answer(answer: Answer) -> bytes:
    reason = answer.reason.encode()[:0xFFFF]
    return _ANSWER.pack(answer.job, answer.written, answer.errno, len(reason)) + reason


class FrameReader:
    """Cuts a byte stream into frames: :meth:`feed` bytes as they come, get whole frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes received that do not make a whole frame yet."""
        return len(self._buffer)

    def requests(self, data: bytes) -> list[Request]:
        """The whole requests ``data`` completes.

        Raises:
            FrameError: a frame's lengths contradict each other, or its name is not UTF-8.
        """
        out: list[Request] = []
        for (_, job, name_len, fields_len), body in self._whole(data, _REQUEST, _request_size):
            try:
                name = body[:name_len].decode()
            except UnicodeDecodeError as exc:
                raise FrameError(f"a request's file name is not UTF-8: {exc}") from None
            fields_end = name_len + fields_len
            out.append(Request(job, name, body[name_len:fields_end], body[fields_end:]))
        return out

    def answers(self, data: bytes) -> list[Answer]:
        """The whole answers ``data`` completes."""
        return [
            Answer(job, written, error, body.decode(errors="replace"))
            for (job, written, error, _), body in self._whole(data, _ANSWER, _answer_size)
        ]

    def _whole(
        self, data: bytes, header: struct.Struct, size_of: Callable[[tuple[Any, ...]], int]
    ) -> list[tuple[tuple[Any, ...], bytes]]:
        """The frames ``data`` completes: each one's header fields and the bytes after its
        header (``size_of``: a frame's whole length, from its header fields)."""
        buffer = self._buffer
        buffer += data
        out: list[tuple[tuple[Any, ...], bytes]] = []
        pos, end = 0, len(buffer)
        while end - pos >= header.size:
            fields = header.unpack_from(buffer, pos)
            size = size_of(fields)
            if end - pos < size:
                break
            out.append((fields, bytes(buffer[pos + header.size : pos + size])))
            pos += size
        del buffer[:pos]
        return out


def _request_size(fields: tuple[Any, ...]) -> int:
    size, _, name_len, fields_len = fields
    if not _REQUEST.size + name_len + fields_len <= size <= MAX_FRAME_BYTES:
        raise FrameError(f"a request frame of {size} bytes cannot hold its parts")
    return int(size)


def _answer_size(fields: tuple[Any, ...]) -> int:
    return _ANSWER.size + int(fields[3])
