"""What a capture line is decoded into: typed msgspec structs, and exact conversions of values.

``_decode`` reads lines with these; the structs accept a subset of what ``capture_core``'s
reader accepts (a field of another type, a number out of range: ``msgspec.ValidationError``,
and the line is read another way).
"""

from __future__ import annotations

import math
from typing import Annotated, Final

import msgspec
import polars as pl

from capture_core.facts import FACTS_VERSION
from capture_core.records import DEFAULT_MODEL_REF_TYPE

__all__ = [
    "JOURNAL_LINE",
    "FastLine",
    "JournalLine",
    "decode_fast",
    "is_string_or_null",
    "keep_for_facts",
    "micros",
    "micros_series",
]

_I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_COUNT = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
#: An inode number: a negative one is a damaged entry. (``st_ino`` is unsigned 64-bit;
#: msgspec bounds stop at int64, so a larger one decodes, and matches no file.)
_INODE = Annotated[int, msgspec.Meta(ge=0)]
_EMPTY_RAW: Final = msgspec.Raw()
#: Unix seconds that certainly convert to a datetime (years 1970 to 8307); others go the
#: exact way, which rejects what ``datetime`` cannot represent.
_MAX_SECONDS: Final = 2.0e11


class _Ref(msgspec.Struct):
    name: str
    type: str = DEFAULT_MODEL_REF_TYPE


class _Tool(msgspec.Struct):
    call_id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: str | None = None
    arguments_raw: str | None = None
    arguments_parse_error: bool = False
    choice_index: _I64 | None = None


class _Facts(msgspec.Struct):
    v: _I64 = 0
    response_id: str | None = None
    model: str | None = None
    stream: bool | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    tokens_in: _COUNT | None = None
    tokens_out: _COUNT | None = None
    tokens_reasoning: _COUNT | None = None
    tokens_total: _COUNT | None = None
    cached_tokens: _COUNT | None = None
    cache_creation_tokens: _COUNT | None = None
    reasoning_content: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    tool_calls: list[_Tool] = msgspec.field(default_factory=list)


class _RequestHead(msgspec.Struct):
    """The two request fields a row needs; the rest of the request is skipped."""

    model: msgspec.Raw = _EMPTY_RAW
    stream: msgspec.Raw = _EMPTY_RAW


class _Envelope(msgspec.Struct):
    model_call_id: str
    dialect: str
    model_ref: _Ref | None = None
    started_at: float | None = None
    completed_at: float | None = None
    latency_ms: float | None = None
    latency_ttft_ms: float | None = None
    status_code: _I64 | None = None
    error_category: str | None = None
    request_raw: msgspec.Raw = _EMPTY_RAW
    response_raw: msgspec.Raw = _EMPTY_RAW


class _Object(msgspec.Struct):
    """Any JSON object, skipped."""


class _FactsLine(_Envelope):
    """A line read from its facts: the bodies are only checked to be objects (or null)."""

    request: _Object | None = None
    response: _Object | None = None
    ngcapture_facts: _Facts | None = None


class _BodiesLine(_Envelope):
    """A line read from its bodies: two request fields, the response kept to be parsed."""

    request: _RequestHead | None = None
    response: msgspec.Raw = _EMPTY_RAW
    ngcapture_facts: _Facts | None = None


class _OtherFactsLine(_Envelope):
    """A line whose facts are of another shape (another version): they are not read."""

    request: _RequestHead | None = None
    response: msgspec.Raw = _EMPTY_RAW
    ngcapture_facts: msgspec.Raw = _EMPTY_RAW


_SECONDS = Annotated[float, msgspec.Meta(ge=0.0, le=_MAX_SECONDS)]
_FINITE = Annotated[float, msgspec.Meta(ge=-1.7e308, le=1.7e308)]


class FastLine(msgspec.Struct):
    """A line as the columnar facts path reads it (``FactsRows``): the decoder itself refuses
    what that path could not take exactly (timestamps out of range, latencies not finite,
    bodies that are not objects); such a line is read again by ``LineDecoder``."""

    model_call_id: str
    dialect: str
    model_ref: _Ref | None = None
    started_at: _SECONDS | None = None
    completed_at: _SECONDS | None = None
    latency_ms: _FINITE | None = None
    latency_ttft_ms: _FINITE | None = None
    status_code: _I64 | None = None
    error_category: str | None = None
    request: _Object | None = None
    response: _Object | None = None
    request_raw: msgspec.Raw = _EMPTY_RAW
    response_raw: msgspec.Raw = _EMPTY_RAW
    ngcapture_facts: _Facts | None = None


class JournalLine(FastLine, kw_only=True):
    """A facts journal's entry (``capture_core.facts_journal``): the fields ``FastLine``
    reads of a capture line, and where that line is."""

    file: str
    offset: _I64
    length: _I64
    size: _I64
    mtime_ns: _I64
    inode: _INODE
    size_before: _I64
    mtime_before_ns: _I64


#: Decodes a journal entry (``_journal``, and ``journal_segments``, which must agree).
JOURNAL_LINE = msgspec.json.Decoder(JournalLine)

#: Decodes a line for the columnar facts path (``msgspec.ValidationError``: not for it).
decode_fast = msgspec.json.Decoder(FastLine).decode
_FACTS_LINE = msgspec.json.Decoder(_FactsLine)
_BODIES_LINE = msgspec.json.Decoder(_BodiesLine)
_OTHER_LINE = msgspec.json.Decoder(_OtherFactsLine)
_STR = msgspec.json.Decoder(str)


def keep_for_facts(line: FastLine) -> bool:
    """Whether a decoded line is read from its facts: they are of the version we know, and
    the ``*_raw`` fields, when present, are strings or null (as the exact reader requires).
    If it is, the raw fields are dropped: a ``msgspec.Raw`` keeps the whole buffer it was
    decoded from alive, and the line is kept until its chunk becomes a frame (that held every
    file's bytes: 505 MB peak for a 250 MB store, and the page faults of that much memory)."""
    facts = line.ngcapture_facts
    if facts is None or facts.v != FACTS_VERSION:
        return False
    request, response = line.request_raw, line.response_raw
    if (request and not is_string_or_null(request)) or (
        response and not is_string_or_null(response)
    ):
        return False
    if request or response:
        line.request_raw = line.response_raw = _EMPTY_RAW
    return True


def micros(seconds: float) -> int | None:
    """Unix seconds as integer microseconds, rounded exactly as ``datetime.fromtimestamp``
    rounds (half to even); ``None`` outside the range this is certain for."""
    if not 0.0 <= seconds <= _MAX_SECONDS:  # also false for NaN
        return None
    fraction, whole = math.modf(seconds)
    part = round(fraction * 1e6)
    if part >= 1_000_000:
        part -= 1_000_000
        whole += 1.0
    return int(whole) * 1_000_000 + part


def micros_series(seconds: pl.Series) -> pl.Series:
    """``micros`` of a whole column (values in range, checked by the decoder): the same
    arithmetic in Polars (``math.modf``'s parts, the fraction rounded half to even as
    ``round`` does, a carry into the whole seconds), without numpy (turning a numpy array into
    a Series imports ``numpy.ma``: ~10 ms of a fresh process's first open)."""
    value = pl.col("s")
    whole = pl.when(value < 0).then(value.ceil()).otherwise(value.floor())  # math.modf's
    part = ((value - whole) * 1e6).round(0, mode="half_to_even")
    carry = part >= 1_000_000
    micros_ = pl.when(carry).then(whole + 1.0).otherwise(whole).cast(
        pl.Int64
    ) * 1_000_000 + pl.when(carry).then(part - 1_000_000).otherwise(part).cast(pl.Int64)
    return pl.DataFrame({"s": seconds}).select(micros_.alias(seconds.name)).to_series()


def _first(raw: msgspec.Raw) -> int:
    """The first byte of a raw value (0 when absent): which kind of JSON value it is."""
    return memoryview(raw)[0] if raw else 0


def is_string_or_null(raw: msgspec.Raw) -> bool:
    """Whether a raw value (present) is a JSON string or null, as ``*_raw`` fields must be."""
    return memoryview(raw)[0] in (_QUOTE, _NULL)


_OPEN: Final = ord("{")
_NULL: Final = ord("n")
_QUOTE: Final = ord('"')
