"""Rollout ids: build, validate, and add or parse the resume-attempt suffix ``-a<n>``.

A rollout id names one file per rollout in a capture directory, so it is validated strictly
before it ever becomes part of a path: it must match ``^[A-Za-z0-9][A-Za-z0-9._-]*$``, must not
contain ``..`` and must be at most 200 characters. Anything else raises
:class:`~capture_core.exceptions.InvalidRolloutIdError` (a ``ValueError``) that quotes the id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeGuard

from capture_core.exceptions import InvalidRolloutIdError

__all__ = [
    "DATA_SUFFIX",
    "MAX_ROLLOUT_ID_LENGTH",
    "ROLLOUT_ID_PATTERN",
    "RolloutIdParts",
    "is_capture_file_name",
    "is_valid_rollout_id",
    "make_rollout_id",
    "rollout_id_from_body",
    "split_attempt",
    "validate_rollout_id",
    "with_attempt",
]

#: A rollout's capture file is ``<rollout id>`` followed by this, in the capture directory.
DATA_SUFFIX: Final = ".capture.jsonl"
MAX_ROLLOUT_ID_LENGTH: Final = 200
ROLLOUT_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
RULE: Final = (
    "a rollout id must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ (ASCII letters, digits, '.', '_', '-', "
    f"starting with a letter or digit), contain no '..', and be at most {MAX_ROLLOUT_ID_LENGTH} "
    "characters"
)
_ATTEMPT_SUFFIX: Final = re.compile(r"-a([1-9][0-9]*)\Z")

# Keys a run request carries, as NeMo Gym's collector writes them.
TASK_INDEX_KEY: Final = "_ng_task_index"
ROLLOUT_INDEX_KEY: Final = "_ng_rollout_index"
ATTEMPT_INDEX_KEY: Final = "_ng_attempt_index"
ROLLOUT_ID_KEY: Final = "_ng_rollout_id"


def is_valid_rollout_id(value: object) -> TypeGuard[str]:
    """Tell whether ``value`` is a valid rollout id, without raising.

    Example:
        >>> is_valid_rollout_id("3-2-a1"), is_valid_rollout_id("../etc")
        (True, False)
    """
    return (
        isinstance(value, str)
        and len(value) <= MAX_ROLLOUT_ID_LENGTH
        and ROLLOUT_ID_PATTERN.fullmatch(value) is not None
        and ".." not in value
    )


def is_capture_file_name(name: str) -> bool:
    """Tell whether ``name`` is a capture file's name: a valid rollout id and :data:`DATA_SUFFIX`.

    Example:
        >>> is_capture_file_name("3-2.capture.jsonl"), is_capture_file_name("../3-2.capture.jsonl")
        (True, False)
    """
    return name.endswith(DATA_SUFFIX) and is_valid_rollout_id(name[: -len(DATA_SUFFIX)])


def validate_rollout_id(value: object) -> str:
    """Return ``value`` unchanged if it is a valid rollout id, else raise.

    Raises:
        InvalidRolloutIdError: the message quotes the escaped id and states the rule.

    Example:
        >>> validate_rollout_id("task.3-1")
        'task.3-1'
    """
    if is_valid_rollout_id(value):
        return value
    raise InvalidRolloutIdError(value, RULE)


def _index(value: object, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidRolloutIdError(value, f"{name} must be a non-negative integer")
    text = str(value)
    if not text.isascii() or not text.isdigit():
        raise InvalidRolloutIdError(value, f"{name} must be a non-negative integer")
    return str(int(text))


def _attempt(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidRolloutIdError(value, "the attempt index must be an integer")
    try:
        return int(value)
    except ValueError:
        raise InvalidRolloutIdError(value, "the attempt index must be an integer") from None


def with_attempt(rollout_id: str, attempt: int) -> str:
    """Add the resume suffix ``-a<attempt>``; attempt 0 (the first attempt) adds nothing.

    Example:
        >>> with_attempt("3-2", 1), with_attempt("3-2", 0)
        ('3-2-a1', '3-2')
    """
    validate_rollout_id(rollout_id)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise InvalidRolloutIdError(attempt, "the attempt index must be an integer >= 0")
    if attempt == 0:
        return rollout_id
    return validate_rollout_id(f"{rollout_id}-a{attempt}")


def make_rollout_id(task_index: int | str, rollout_index: int | str, *, attempt: int = 0) -> str:
    """Build ``<task>-<rollout>`` (plus ``-a<attempt>`` when attempt > 0).

    Example:
        >>> make_rollout_id(3, 2), make_rollout_id(3, 2, attempt=1)
        ('3-2', '3-2-a1')
    """
    base = f"{_index(task_index, 'task index')}-{_index(rollout_index, 'rollout index')}"
    return with_attempt(base, attempt)


@dataclass(frozen=True, slots=True)
class RolloutIdParts:
    """A rollout id split into its base and resume attempt (0 = first attempt)."""

    base: str
    attempt: int

    @property
    def rollout_id(self) -> str:
        return with_attempt(self.base, self.attempt)


def split_attempt(rollout_id: str) -> RolloutIdParts:
    """Split a valid id into base and attempt; an id without ``-a<n>`` is attempt 0.

    Example:
        >>> split_attempt("s7-3-2-a12")
        RolloutIdParts(base='s7-3-2', attempt=12)
    """
    validate_rollout_id(rollout_id)
    match = _ATTEMPT_SUFFIX.search(rollout_id)
    if match is None or match.start() == 0:
        return RolloutIdParts(rollout_id, 0)
    return RolloutIdParts(rollout_id[: match.start()], int(match.group(1)))


def rollout_id_from_body(body: Mapping[str, object]) -> str | None:
    """Derive the rollout id of a run request, or ``None`` when it carries none.

    An explicit ``_ng_rollout_id`` wins; otherwise ``_ng_task_index`` and ``_ng_rollout_index``
    give ``<task>-<rollout>``. A positive ``_ng_attempt_index`` adds ``-a<n>``. Null values
    count as absent; malformed values raise :class:`InvalidRolloutIdError`.

    Example:
        >>> rollout_id_from_body({"_ng_task_index": 3, "_ng_rollout_index": 2,
        ...                       "_ng_attempt_index": 1})
        '3-2-a1'
    """
    explicit = body.get(ROLLOUT_ID_KEY)
    if explicit is not None:
        base = validate_rollout_id(explicit)
    else:
        task, rollout = body.get(TASK_INDEX_KEY), body.get(ROLLOUT_INDEX_KEY)
        if task is None or rollout is None:
            return None
        base = make_rollout_id(task, rollout)  # type: ignore[arg-type]  # checked inside
    attempt = body.get(ATTEMPT_INDEX_KEY)
    if attempt is None:
        return base
    return with_attempt(base, max(_attempt(attempt), 0))
