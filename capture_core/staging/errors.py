"""Errors raised by ``capture_core.staging``.

Every staging error derives from :class:`StagingError`, itself a
:class:`~capture_core.exceptions.CaptureError`::

    CaptureError
    └── StagingError
        ├── InvalidStagedCallError   (also a ValueError)  .field, .reason
        ├── StreamingUnsupportedError
        ├── CallAlreadyCompletedError                    .model_call_id
        ├── InvalidPrefixError       (also a ValueError)  .model_call_id, .reason
        ├── UnsupportedAdmissionError
        └── VerificationError                            .code, .rollout_id, .model_call_id

The sink errors live beside the sink protocols in ``sinks.py``.

Wire models report broken rules as pydantic ``ValidationError`` (also a ``ValueError``); the
digest and delta functions raise :class:`InvalidStagedCallError`, so one ``except ValueError``
covers both. A staging rule broken inside a model shows in ``ValidationError.errors()`` with one
of the ``*_ERROR_TYPE`` types below and ``ctx = {"field": ..., "reason": ...}``, so a verifier
can tell a digest that disagrees with its row (:data:`DIGEST_MISMATCH_ERROR_TYPE`) from any
other invalid row.
"""

from __future__ import annotations

from typing import Final

from capture_core.exceptions import CaptureError, quote_value

__all__ = [
    "DIGEST_MISMATCH_ERROR_TYPE",
    "EXTRAS_DIGEST_MISMATCH_ERROR_TYPE",
    "STAGING_RULE_ERROR_TYPE",
    "UNSUPPORTED_VERSION_ERROR_TYPE",
    "CallAlreadyCompletedError",
    "InvalidPrefixError",
    "InvalidStagedCallError",
    "StagingError",
    "StreamingUnsupportedError",
    "UnsupportedAdmissionError",
    "VerificationError",
]

STAGING_RULE_ERROR_TYPE: Final = "staging_rule"
"""Pydantic error type of a broken cross-field rule (lengths, parent, mode, columns...)."""
DIGEST_MISMATCH_ERROR_TYPE: Final = "digest_mismatch"
"""Pydantic error type of a staged row whose ``digest`` disagrees with its content."""
EXTRAS_DIGEST_MISMATCH_ERROR_TYPE: Final = "extras_digest_mismatch"
"""Pydantic error type of a staged row whose ``extras_digest`` disagrees with its ``extras``."""
UNSUPPORTED_VERSION_ERROR_TYPE: Final = "unsupported_version"
"""Pydantic error type of a schema or digest version other than the current one."""


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


class CallAlreadyCompletedError(StagingError):
    """A call was completed (or failed) a second time; the first answer stands.

    Attributes:
        model_call_id: the call.
    """

    def __init__(self, model_call_id: str) -> None:
        self.model_call_id = model_call_id
        super().__init__(f"model call {quote_value(model_call_id)} was already completed")


class InvalidPrefixError(StagingError, ValueError):
    """``begin_call`` was given a prefix that does not fit the admission; nothing was begun.

    Attributes:
        model_call_id: the call.
        reason: what is wrong, in words.
    """

    def __init__(self, model_call_id: str, reason: str) -> None:
        self.model_call_id = model_call_id
        self.reason = reason
        super().__init__(f"model call {quote_value(model_call_id)}: {reason}")


class UnsupportedAdmissionError(StagingError):
    """An admission this worker cannot capture correctly (a checkpoint generation cut)."""


class VerificationError(StagingError):
    """A receipt and its snapshots that cannot become a training row.

    Attributes:
        code: a :class:`VerificationCode`, or ``wrong_<field>`` for a snapshot field that
            differs from its manifest row.
        rollout_id: the receipt's rollout.
        model_call_id: the call at fault, or ``None`` for a fault of the receipt or the set.
    """

    def __init__(
        self, code: str, detail: str, *, rollout_id: str, model_call_id: str | None = None
    ) -> None:
        self.code = code
        self.rollout_id = rollout_id
        self.model_call_id = model_call_id
        where = "" if model_call_id is None else f" (call {quote_value(model_call_id)})"
        super().__init__(f"{code}{where}: {detail}")
