"""The on-disk format of pending marks: where they live, how a mark is written and read back.

A server's marks are fixed slots of :data:`SLOT_SIZE` bytes in ``<dir>/.pending/<writer>.slots``,
each blank or holding ``<rollout_id>@<model_call_id>``; an older version's mark is an empty file
``<dir>/.pending/<rollout_id>@<model_call_id>[@<writer>]``. A writer's lock is
``<dir>/.writers/<writer>.lock``. :mod:`capture_core.writers` writes the slots.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from capture_core.ids import is_valid_rollout_id, validate_rollout_id

__all__ = [
    "LOCK_SUFFIX",
    "PENDING_DIR",
    "SLOTS_SUFFIX",
    "SLOT_SIZE",
    "WRITERS_DIR",
    "blank_slot",
    "marker_name",
    "pending_marker",
    "slot_bytes",
]

PENDING_DIR: Final = ".pending"
WRITERS_DIR: Final = ".writers"
LOCK_SUFFIX: Final = ".lock"
SLOTS_SUFFIX: Final = ".slots"
SLOT_SIZE: Final = 256  # a 200-character id, '@', a call id, padding and '\n'
_SEPARATOR: Final = "@"
_CALL_ID: Final = re.compile(r"^[A-Za-z0-9._-]+$")
_BLANK: Final = b" " * (SLOT_SIZE - 1) + b"\n"


def _check_token(value: str, what: str) -> str:
    if not value or not value.isascii() or not value.isalnum():
        raise ValueError(f"{what} must be ASCII letters and digits, got {value!r}")
    return value


def marker_name(rollout_id: str, model_call_id: str, writer: str | None = None) -> str:
    """The text of one call's marker (validated: never a path).

    Example:
        >>> marker_name("3-2", "c0ffee", "w1")
        '3-2@c0ffee@w1'
    """
    parts = [validate_rollout_id(rollout_id), _check_token(model_call_id, "model_call_id")]
    if writer is not None:
        parts.append(_check_token(writer, "writer token"))
    return _SEPARATOR.join(parts)


def slot_bytes(rollout_id: str, model_call_id: str) -> bytes:
    """The bytes of one slot marking a call (validated).

    Example:
        >>> slot_bytes("3-2", "c0ffee").rstrip()
        b'3-2@c0ffee'
    """
    text = marker_name(rollout_id, model_call_id).encode("ascii")
    if len(text) >= SLOT_SIZE:
        raise ValueError(f"a marker of {len(text)} bytes does not fit a slot")
    return text.ljust(SLOT_SIZE - 1) + b"\n"


def blank_slot() -> bytes:
    """The bytes of a free slot."""
    return _BLANK


def pending_marker(
    root: Path, rollout_id: str, model_call_id: str, writer: str | None = None
) -> Path:
    """Where an older version's per-call marker file lives (it may or may not exist)."""
    return Path(root) / PENDING_DIR / marker_name(rollout_id, model_call_id, writer)


def _parse_marker(text: str) -> tuple[str, str, str | None] | None:
    rollout_id, sep, rest = text.partition(_SEPARATOR)
    if not sep or not is_valid_rollout_id(rollout_id):
        return None
    call_id, _, writer = rest.partition(_SEPARATOR)
    # Read tolerantly (other writers' call ids may carry '-', '_' or '.'); written strictly.
    if not call_id or not _CALL_ID.match(call_id) or (writer and not writer.isalnum()):
        return None
    return rollout_id, call_id, writer or None


def _slot_marks(data: bytes, needle: bytes | None) -> list[tuple[int, str, str]]:
    """The ``(offset, rollout_id, model_call_id)`` marked in a slots file's bytes."""
    if needle is not None and needle not in data:
        return []  # the common case for a rollout: nothing of it here
    found = []
    for start in range(0, len(data) - SLOT_SIZE + 1, SLOT_SIZE):
        slot = data[start : start + SLOT_SIZE]
        if slot == _BLANK or not slot.strip(b" \n\0"):
            continue
        parsed = _parse_marker(slot.rstrip(b" \n\0").decode("ascii", "replace"))
        # A slot read while its writer rewrites it may be torn: one that does not parse is
        # skipped; one that does may name a shortened id. Either belongs to a live writer (a
        # dead one writes nothing more), so it only changes what one poll of a wait sees.
        if parsed is not None and parsed[2] is None:
            found.append((start, parsed[0], parsed[1]))
    return found
