"""Canonical byte encodings hashed by the staging digests (see ``digests.py``).

Each encoder checks its input and raises :class:`InvalidStagedCallError` naming ``field`` when
the value cannot be encoded exactly: a wrong Python type, an integer out of range, a float that
is not finite (or not finite once rounded to float32), a string that is not valid UTF-8.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from typing import Final, cast

from capture_core.staging.errors import InvalidStagedCallError

_U64_LIMIT: Final = 1 << 64
_I64_MIN: Final = -(1 << 63)
_I64_LIMIT: Final = 1 << 63
_DIGEST_HEX: Final = re.compile(r"[0-9a-f]{64}")
_DOUBLE: Final = struct.Struct(">d")
# Containers nested deeper than this in extras are refused (JSON readers stop near 200 levels).
MAX_EXTRAS_DEPTH: Final = 128


def u64(value: int, field: str) -> bytes:
    """Eight bytes, unsigned big-endian; ``value`` must be an exact int in [0, 2**64)."""
    if type(value) is not int:
        raise InvalidStagedCallError(field, f"must be an int, got {type(value).__name__}")
    if not 0 <= value < _U64_LIMIT:
        raise InvalidStagedCallError(field, f"must be in [0, 2**64), got {value}")
    return value.to_bytes(8, "big")


def length_prefixed(data: bytes) -> bytes:
    """``u64(len(data)) || data``."""
    return len(data).to_bytes(8, "big") + data


def utf8(value: str, field: str) -> bytes:
    """The UTF-8 bytes of an exact ``str`` (lone surrogates are refused)."""
    if type(value) is not str:
        raise InvalidStagedCallError(field, f"must be a str, got {type(value).__name__}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidStagedCallError(field, "is not encodable as UTF-8") from None


def text(value: str, field: str) -> bytes:
    """A length-prefixed UTF-8 string."""
    return length_prefixed(utf8(value, field))


def optional_text(value: str | None, field: str) -> bytes:
    """``0x00`` for ``None``, otherwise ``0x01`` followed by :func:`text`."""
    if value is None:
        return b"\x00"
    return b"\x01" + text(value, field)


def raw_digest(value: str, field: str) -> bytes:
    """The 32 raw bytes of a lowercase 64-hex SHA-256 digest."""
    if type(value) is not str or _DIGEST_HEX.fullmatch(value) is None:
        raise InvalidStagedCallError(field, "must be 64 lowercase hex characters")
    return bytes.fromhex(value)


def token_list(token_ids: Sequence[int], field: str) -> bytes:
    """``u64(count)`` then each id as ``u64``; ids must be exact ints in [0, 2**64)."""
    if not set(map(type, token_ids)) <= {int}:
        raise InvalidStagedCallError(field, "every token id must be an int")
    count = len(token_ids)
    try:
        return struct.pack(f">Q{count}Q", count, *token_ids)
    except struct.error:
        bad = next(t for t in token_ids if not 0 <= t < _U64_LIMIT)
        raise InvalidStagedCallError(field, f"token id {bad} is outside [0, 2**64)") from None


def float32_list(values: Sequence[float], field: str) -> bytes:
    """``u64(count)`` then each value as big-endian IEEE-754 binary32 (rounded to nearest).

    Values must be exact floats (ints are refused), finite, and still finite in float32. The
    sign of zero is kept, so ``-0.0`` and ``0.0`` encode differently.
    """
    if not set(map(type, values)) <= {float}:
        raise InvalidStagedCallError(field, "every value must be a float")
    if not all(map(math.isfinite, values)):
        raise InvalidStagedCallError(field, "values must be finite (no NaN or infinity)")
    count = len(values)
    try:
        return struct.pack(f">Q{count}f", count, *values)
    except OverflowError:
        raise InvalidStagedCallError(field, "a value is too large for float32") from None


def extras_value(value: object, field: str) -> bytes:
    """The typed, tagged encoding of a JSON-like extras value (see ``digests.py``)."""
    out = bytearray()
    _encode_value(value, out, field, 0)
    return bytes(out)


def _encode_value(value: object, out: bytearray, field: str, depth: int) -> None:
    if value is None:
        out += b"N"
    elif type(value) is bool:
        out += b"B\x01" if value else b"B\x00"
    elif type(value) is int:
        out += b"I" + _signed64(value, field)
    elif type(value) is float:
        if not math.isfinite(value):
            raise InvalidStagedCallError(field, "floats must be finite (no NaN or infinity)")
        out += b"F" + _DOUBLE.pack(value)
    elif type(value) is str:
        out += b"S" + text(value, field)
    elif type(value) is list:
        _check_depth(depth, field)
        _encode_list(value, out, field, depth + 1)
    elif type(value) is dict:
        _check_depth(depth, field)
        _encode_dict(value, out, field, depth + 1)
    else:
        raise InvalidStagedCallError(
            field,
            f"{type(value).__name__} is not a JSON value "
            "(use None, bool, int, float, str, list or dict)",
        )


def _check_depth(depth: int, field: str) -> None:
    if depth >= MAX_EXTRAS_DEPTH:
        raise InvalidStagedCallError(field, f"nested deeper than {MAX_EXTRAS_DEPTH} levels")


def _signed64(value: int, field: str) -> bytes:
    if not _I64_MIN <= value < _I64_LIMIT:
        raise InvalidStagedCallError(field, f"int {value} is outside [-2**63, 2**63)")
    return value.to_bytes(8, "big", signed=True)


def _encode_list(items: list[object], out: bytearray, field: str, depth: int) -> None:
    out += b"L" + len(items).to_bytes(8, "big")
    if items and set(map(type, items)) == {int}:
        out += _int_run(cast("list[int]", items), field)
        return
    for index, item in enumerate(items):
        _encode_value(item, out, f"{field}[{index}]", depth)


def _int_run(items: list[int], field: str) -> bytes:
    """``"I" + i64`` for each int, built in C: the common shape of routed-expert tables."""
    count = len(items)
    try:
        packed = struct.pack(f">{count}q", *items)
    except struct.error:
        bad = next(i for i in items if not _I64_MIN <= i < _I64_LIMIT)
        raise InvalidStagedCallError(field, f"int {bad} is outside [-2**63, 2**63)") from None
    run = bytearray(9 * count)
    run[0::9] = b"I" * count
    for byte in range(8):
        run[1 + byte :: 9] = packed[byte::8]
    return bytes(run)


def _encode_dict(mapping: dict[object, object], out: bytearray, field: str, depth: int) -> None:
    keyed: list[tuple[bytes, object]] = []
    for key, item in mapping.items():
        if type(key) is not str:
            raise InvalidStagedCallError(field, f"keys must be str, got {type(key).__name__}")
        keyed.append((utf8(key, f"{field} key"), item))
    keyed.sort(key=lambda pair: pair[0])
    out += b"D" + len(keyed).to_bytes(8, "big")
    for key_bytes, item in keyed:
        out += length_prefixed(key_bytes)
        _encode_value(item, out, f"{field}.{key_bytes.decode()}", depth)
