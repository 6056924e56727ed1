"""Errors raised by ``capture_core.staging``.

Every staging error derives from :class:`StagingError`, itself a
:class:`~capture_core.exceptions.CaptureError`::

    CaptureError
    └── StagingError
        ├── InvalidStagedCallError   (also a ValueError)  .field, .reason
        └── StreamingUnsupportedError

Wire models report broken rules as pydantic ``ValidationError`` (also a ``ValueError``); the
digest and delta functions raise :class:`InvalidStagedCallError` so that one ``except
ValueError`` covers both.
"""

from __future__ import annotations

from capture_core.exceptions import CaptureError

__all__ = ["InvalidStagedCallError", "StagingError", "StreamingUnsupportedError"]


class StagingError(CaptureError):
    """Root of the errors raised by token staging."""


class InvalidStagedCallError(StagingError, ValueError):
    """A value that breaks a rule of the staging format, so it cannot be hashed or staged.

    Attributes:
        field: the field (or argument) at fault, e.g. ``"cum_len"`` or ``"extras.media"``.
        reason: the rule it broke, in words.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class StreamingUnsupportedError(StagingError):
    """Token capture was asked for a streamed engine response, which it does not support."""
