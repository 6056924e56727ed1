"""Errors raised by ``capture_core``.

Every error the package raises on purpose derives from :class:`CaptureError`, and each one
carries the context a caller needs to act on it::

    CaptureError
    ├── InvalidRolloutIdError   (also a ValueError)  .rollout_id, .rule
    ├── InvalidRecordError      (also a ValueError)  .reason
    ├── RolloutRetiredError                          .rollout_id
    └── CaptureStoreError                            .path
        ├── LineEncodingError                        .path
        └── DamagedLineError                         .path, .line_number, .call_index, .reason

Third-party errors (``OSError`` from the disk, ``orjson.JSONDecodeError``) are translated into
these where the store reports damage; the store never raises a bare ``Exception``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CaptureError",
    "CaptureStoreError",
    "DamagedLineError",
    "InvalidRecordError",
    "InvalidRolloutIdError",
    "LineEncodingError",
    "RolloutRetiredError",
]

_MAX_QUOTED = 80


def quote_value(value: object) -> str:
    """Quote a possibly hostile value for an error message: escaped, and shortened if long."""
    if isinstance(value, str):
        if len(value) > _MAX_QUOTED:
            return f"{value[:_MAX_QUOTED]!a}... ({len(value)} characters)"
        return ascii(value)
    return f"{type(value).__name__} {ascii(value)[:_MAX_QUOTED]}"


class CaptureError(Exception):
    """Root of every error ``capture_core`` raises on purpose."""


class InvalidRolloutIdError(CaptureError, ValueError):
    """A rollout id that could not safely name a capture file.

    Attributes:
        rollout_id: the offending value, unchanged.
        rule: the rule it broke, in words.
    """

    def __init__(self, rollout_id: object, rule: str) -> None:
        self.rollout_id = rollout_id
        self.rule = rule
        super().__init__(f"invalid rollout id {quote_value(rollout_id)}: {rule}")


class InvalidRecordError(CaptureError, ValueError):
    """A JSON value that is not a readable capture record (wrong shape or field types).

    Attributes:
        reason: what is wrong, naming the field where one is at fault.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class RolloutRetiredError(CaptureError):
    """The rollout's capture ledger was retired: its manifest is gone and it takes no rows.

    Attributes:
        rollout_id: the retired rollout.
    """

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id
        super().__init__(f"rollout {quote_value(rollout_id)} was retired")


class CaptureStoreError(CaptureError):
    """A capture store file could not be read or written as asked.

    Attributes:
        path: the file or directory concerned.
    """

    def __init__(self, message: str, *, path: Path) -> None:
        self.path = path
        super().__init__(f"{message} ({path})")


class LineEncodingError(CaptureStoreError):
    """A capture line could not be encoded as one JSON line; nothing was written.

    Attributes:
        path: the capture file it was meant for.
    """


class DamagedLineError(CaptureStoreError):
    """A strict read met a line that is not a readable capture record.

    Attributes:
        path: the capture file.
        line_number: 1-based physical line number in the file.
        call_index: the durable ``call_index`` the line occupies.
        reason: what is wrong with the line.
    """

    def __init__(self, *, path: Path, line_number: int, call_index: int, reason: str) -> None:
        self.line_number = line_number
        self.call_index = call_index
        self.reason = reason
        super().__init__(
            f"damaged capture line {line_number} (call_index {call_index}): {reason}", path=path
        )
