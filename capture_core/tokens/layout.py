"""The token store's file layout: one set of files per rollout, and what may name or key them.

Files for rollout ``<id>`` in the store's directory:

* ``<id>.tokens.jsonl`` — one canonical :class:`TokenEntry` line per call (sorted-key JSON);
* ``<id>.tokens.state.json`` — lifecycle and digest index (see :mod:`.state`), replaced whole;
* ``<id>.tokens.intents`` — one ``model_call_id`` per line, written by ``begin_call``;
* ``<id>.tokens.incomplete`` — one line per ``mark_incomplete`` (the call id, or empty);
* ``<id>.tokens.lock`` — an empty file whose ``flock`` guards the others: exclusive for every
  change, shared for reads. It is separate so that it keeps one inode while the others are
  deleted and recreated; a waiter that finds it replaced reopens it.

``<id>`` is a valid rollout id (:func:`capture_core.ids.validate_rollout_id`); a call id keys a
line, so it may hold no whitespace (:func:`validate_model_call_id`).
"""

from __future__ import annotations

import re
from typing import Final

from capture_core.exceptions import InvalidRecordError, quote_value

__all__ = [
    "ENTRIES_SUFFIX",
    "INCOMPLETE_SUFFIX",
    "INTENTS_SUFFIX",
    "LOCK_SUFFIX",
    "STATE_SUFFIX",
    "validate_model_call_id",
]

ENTRIES_SUFFIX: Final = ".tokens.jsonl"
STATE_SUFFIX: Final = ".tokens.state.json"
INTENTS_SUFFIX: Final = ".tokens.intents"
INCOMPLETE_SUFFIX: Final = ".tokens.incomplete"
LOCK_SUFFIX: Final = ".tokens.lock"
_CALL_ID: Final = re.compile(r"[^\s\x00-\x1f\x7f]{1,256}")


def validate_model_call_id(value: object, *, allow_empty: bool = False) -> str:
    """Return ``value`` if it can key a line of the token files, else raise.

    A call id is 1-256 characters with no whitespace or control character (the files are
    line-based). ``""`` is allowed only where it means "no particular call".

    Raises:
        InvalidRecordError: the message quotes the value.

    Example:
        >>> validate_model_call_id("0f3c2a")
        '0f3c2a'
    """
    if isinstance(value, str) and (
        _CALL_ID.fullmatch(value) is not None or (allow_empty and value == "")
    ):
        return value
    raise InvalidRecordError(
        f"model_call_id {quote_value(value)} must be 1-256 characters without whitespace or "
        "control characters"
    )
