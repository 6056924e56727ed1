"""Cross-field rules shared by the wire models and the digest functions.

Each check raises :class:`InvalidStagedCallError` naming the field at fault and the rule in
words, so a pydantic ``ValidationError`` built from it says which rule was broken.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import not_

from capture_core.staging.errors import InvalidStagedCallError

TEXT = "text"
TOKEN_IN = "token_in"


def check_version(field: str, value: object, current: int) -> int:
    """Accept only the exact int ``current``; a newer version gets an 'upgrade' message."""
    if type(value) is not int:
        raise InvalidStagedCallError(field, f"must be the int {current}, got {value!r}")
    if value > current:
        raise InvalidStagedCallError(
            field,
            f"version {value} is newer than this ngcapture supports ({current}); "
            "upgrade ngcapture to read it",
        )
    if value != current:
        raise InvalidStagedCallError(
            field, f"version {value} is no longer supported (this ngcapture reads {current})"
        )
    return value


def check_identifier(field: str, value: object, *, optional: bool = False) -> None:
    """A non-empty ``str`` (or ``None`` when ``optional``)."""
    if value is None and optional:
        return
    if type(value) is not str or not value:
        raise InvalidStagedCallError(field, "must be a non-empty string")


def check_lengths(prev_len: int, delta_len: int, cum_len: int) -> None:
    """``cum_len == prev_len + delta_len``."""
    if cum_len != prev_len + delta_len:
        raise InvalidStagedCallError(
            "cum_len",
            f"must equal prev_len + delta_len ({prev_len} + {delta_len} = "
            f"{prev_len + delta_len}), got {cum_len}",
        )


def check_parent(parent_call_id: str | None, prev_len: int) -> None:
    """A parent exactly when ``prev_len > 0``."""
    if parent_call_id is None and prev_len != 0:
        raise InvalidStagedCallError(
            "prev_len", f"must be 0 when there is no parent_call_id, got {prev_len}"
        )
    if parent_call_id is not None and prev_len == 0:
        raise InvalidStagedCallError("prev_len", "must be > 0 when parent_call_id is set")


def check_mode(parent_call_id: str | None, mode: str) -> str:
    """A root is ``text`` and a continuation is ``token_in``; returns the mode as a plain str."""
    if mode not in (TEXT, TOKEN_IN):
        raise InvalidStagedCallError("mode", f"must be 'text' or 'token_in', got {mode!r}")
    if parent_call_id is None and mode != TEXT:
        raise InvalidStagedCallError("mode", "must be 'text' for a call without parent_call_id")
    if parent_call_id is not None and mode != TOKEN_IN:
        raise InvalidStagedCallError("mode", "must be 'token_in' for a call with parent_call_id")
    return TEXT if mode == TEXT else TOKEN_IN


def check_staged_delta_len(delta_len: int) -> None:
    """A staged call carries at least one token."""
    if delta_len <= 0:
        raise InvalidStagedCallError("delta_len", f"must be > 0 for a staged call, got {delta_len}")


def check_columns(
    delta_len: int,
    token_ids: Sequence[int],
    token_mask: Sequence[float],
    logprobs: Sequence[float],
) -> None:
    """Equal column lengths, masks of 0.0 or 1.0, and a 0.0 logprob under every 0.0 mask."""
    if delta_len != len(token_ids):
        raise InvalidStagedCallError(
            "delta_len", f"must equal len(token_ids_delta) ({len(token_ids)}), got {delta_len}"
        )
    for field, column in (
        ("token_mask_delta", token_mask),
        ("generation_log_probs_delta", logprobs),
    ):
        if len(column) != len(token_ids):
            raise InvalidStagedCallError(
                field,
                f"must have as many values as token_ids_delta ({len(token_ids)}), "
                f"got {len(column)}",
            )
        if not set(map(type, column)) <= {float}:
            raise InvalidStagedCallError(field, "every value must be a float")
    if not set(token_mask) <= {0.0, 1.0}:
        raise InvalidStagedCallError("token_mask_delta", "every value must be 0.0 or 1.0")
    if any(compress(logprobs, map(not_, token_mask))):
        position = next(
            i for i, (m, lp) in enumerate(zip(token_mask, logprobs, strict=True)) if not m and lp
        )
        raise InvalidStagedCallError(
            "generation_log_probs_delta",
            f"must be 0.0 wherever token_mask_delta is 0.0 (position {position} is "
            f"{logprobs[position]!r})",
        )
