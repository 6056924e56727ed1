"""Prefix rules of token capture: which staged tokens a call continues, and checking them.

A ``text`` call continues nothing. A ``token_in`` call continues ``prev_len`` staged tokens,
given inline in the admission or, when the admission names a ``staging_chain``, by the caller
(the chain's staged deltas concatenated). The prompt the engine ran must start with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from capture_core.exceptions import quote_value
from capture_core.staging._base import CaptureMode
from capture_core.staging.admission import CaptureAdmission
from capture_core.staging.errors import InvalidPrefixError

__all__ = ["prefix_ids", "prefix_mismatch", "resolve_prefix"]

_U64_LIMIT: Final = 1 << 64


def resolve_prefix(
    admission: CaptureAdmission, prefix_token_ids: Sequence[int] | None
) -> tuple[int, ...]:
    call_id = admission.model_call_id
    given = None if prefix_token_ids is None else prefix_ids(call_id, prefix_token_ids)
    if admission.mode is CaptureMode.TEXT:
        if given:
            raise InvalidPrefixError(call_id, "a 'text' call continues nothing; pass no prefix")
        return ()
    inline = tuple(admission.required_prefix_token_ids)
    if given is None:
        if admission.staging_chain:
            raise InvalidPrefixError(
                call_id,
                "the admission names a staging_chain: pass its staged tokens as prefix_token_ids",
            )
        return inline
    if len(given) != admission.prev_len:
        raise InvalidPrefixError(
            call_id,
            f"prefix has {len(given)} ids, the admission's prev_len is {admission.prev_len}",
        )
    if inline and given != inline:
        raise InvalidPrefixError(call_id, "prefix differs from the admission's inline prefix")
    return given


def prefix_ids(call_id: str, ids: Sequence[int]) -> tuple[int, ...]:
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise InvalidPrefixError(
            call_id, f"prefix must be a sequence of ints, got {type(ids).__name__}"
        )
    checked = tuple(ids)
    for value in checked:
        if type(value) is not int or not 0 <= value < _U64_LIMIT:
            raise InvalidPrefixError(call_id, f"prefix holds {quote_value(value)}, not a token id")
    return checked


def prefix_mismatch(prefix: Sequence[int], prompt: Sequence[Any]) -> str | None:
    """Why ``prompt`` does not start with ``prefix``, or ``None`` when it does."""
    prev_len = len(prefix)
    if prev_len == 0:
        return None
    if len(prompt) < prev_len:
        return f"prompt has {len(prompt)} ids, fewer than the {prev_len} staged before it"
    pairs = zip(prompt[:prev_len], prefix, strict=True)
    position = next((i for i, (got, staged) in enumerate(pairs) if got != staged), None)
    if position is not None:
        return f"prompt differs from the staged prefix at position {position}"
    return None
