"""Content-encoding decoders, so capture records what a body says while the client gets its bytes.

``gzip``, ``deflate`` (zlib-wrapped, or raw as some servers send it), ``br`` and ``zstd``, in
any stack (``Content-Encoding: gzip, br`` is undone right to left). Decoders are incremental:
a streamed body is decoded chunk by chunk, so its terminal event is recognised as it passes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final, Protocol

import brotli  # type: ignore[import-untyped]
import zstandard

__all__ = ["BodyDecoder", "DecodeError", "decode_body", "decoder_for"]


class DecodeError(ValueError):
    """A body that its ``Content-Encoding`` cannot decode (damaged, or an unknown coding)."""


class _Step(Protocol):
    def feed(self, data: bytes) -> bytes: ...
    def flush(self) -> bytes: ...


class _Zlib:
    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._inner: zlib._Decompress | None = None

    def feed(self, data: bytes) -> bytes:
        if self._inner is None:
            if not data:
                return b""
            wbits = self._wbits
            if wbits == zlib.MAX_WBITS and (data[0] & 0x0F) != 8:  # no zlib header: raw deflate
                wbits = -zlib.MAX_WBITS
            self._inner = zlib.decompressobj(wbits)
        try:
            return self._inner.decompress(data)
        except zlib.error as exc:
            raise DecodeError(str(exc)) from None

    def flush(self) -> bytes:
        if self._inner is None:
            return b""
        try:
            out = self._inner.flush()
        except zlib.error as exc:
            raise DecodeError(str(exc)) from None
        if not self._inner.eof:
            raise DecodeError("compressed body ends early")
        return out


class _Brotli:
    def __init__(self) -> None:
        self._inner = brotli.Decompressor()

    def feed(self, data: bytes) -> bytes:
        try:
            return bytes(self._inner.process(data))
        except brotli.error as exc:
            raise DecodeError(str(exc)) from None

    def flush(self) -> bytes:
        if not self._inner.is_finished():
            raise DecodeError("brotli body ends early")
        return b""


class _Zstd:
    def __init__(self) -> None:
        self._inner = zstandard.ZstdDecompressor().decompressobj()
        self._seen = False

    def feed(self, data: bytes) -> bytes:
        self._seen = self._seen or bool(data)
        try:
            return bytes(self._inner.decompress(data))
        except zstandard.ZstdError as exc:
            raise DecodeError(str(exc)) from None

    def flush(self) -> bytes:
        if self._seen and not self._inner.eof:
            raise DecodeError("zstd body ends early")
        return b""


_STEPS: Final[dict[str, Callable[[], _Step]]] = {
    "gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),
    "x-gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),
    "deflate": lambda: _Zlib(zlib.MAX_WBITS),
    "br": _Brotli,
    "zstd": _Zstd,
}


class BodyDecoder:
    """Undoes a ``Content-Encoding`` stack incrementally.

    Example:
        >>> decoder = decoder_for("gzip")
        >>> decoder.feed(gzip.compress(b"hi")) + decoder.flush()  # doctest: +SKIP
        b'hi'
    """

    def __init__(self, steps: list[_Step]) -> None:
        self._steps = steps

    def feed(self, data: bytes) -> bytes:
        for step in self._steps:
            data = step.feed(data)
        return data

    def flush(self) -> bytes:
        out = b""
        for step in self._steps:  # what one step lets go of still passes through the next
            out = (step.feed(out) if out else b"") + step.flush()
        return out


def decoder_for(content_encoding: str | None) -> BodyDecoder | None:
    """A decoder for a ``Content-Encoding`` value; ``None`` for identity (nothing to undo).

    Raises:
        DecodeError: a coding we do not know.
    """
    if not content_encoding:
        return None
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None
    steps: list[_Step] = []
    for coding in reversed(codings):  # the last coding applied is undone first
        make = _STEPS.get(coding)
        if make is None:
            raise DecodeError(f"unknown content-encoding {coding!r}")
        steps.append(make())
    return BodyDecoder(steps)


def decode_body(body: bytes, content_encoding: str | None) -> bytes:
    """Decode a whole body.

    Raises:
        DecodeError: the body does not decode.
    """
    decoder = decoder_for(content_encoding)
    if decoder is None:
        return body
    return decoder.feed(body) + decoder.flush()
