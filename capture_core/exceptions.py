"""Errors raised by ``capture_core``.

Every error the package raises on purpose derives from :class:`CaptureError`, and each one
carries the context a caller needs to act on it::

    CaptureError
    ├── InvalidRolloutIdError   (also a ValueError)  .rollout_id, .rule
    ├── InvalidRecordError      (also a ValueError)  .reason
    ├── RolloutRetiredError                          .rollout_id
    ├── RequestRefusedError                          .status, .reason
    └── CaptureStoreError                            .path
        ├── AppenderError                            .path
        ├── CaptureDirNotFoundError (also a FileNotFoundError)  .path
        ├── LineEncodingError                        .path
        └── DamagedLineError                         .path, .line_number, .call_index, .reason

The complete-record token store (``capture_core.tokens``) adds::

    CaptureError
    ├── RolloutRetiredError
    │   └── TokenCaptureRetiredError                     .rollout_id
    ├── TokenCaptureFrozenError                          .rollout_id
    ├── TokenEntryConflictError   (also a ValueError)    .rollout_id, .model_call_id, .durable
    ├── TokenBuildError           (also a ValueError)    .reason, .model_call_id
    ├── TokenCaptureConfigError   (also a ValueError)    .key, .reason
    ├── MaskFractionExceededError (also a RuntimeError)  .masked, .finalized, .limit, .reasons
    └── CaptureStoreError
        └── TokenStoreDamagedError (also a ValueError)   .path, .reason

Third-party errors (``OSError`` from the disk, ``orjson.JSONDecodeError``) are translated into
these where the store reports damage; the store never raises a bare ``Exception``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "AppenderError",
    "CaptureDirNotFoundError",
    "CaptureError",
    "CaptureStoreError",
    "DamagedLineError",
    "InvalidRecordError",
    "InvalidRolloutIdError",
    "LineEncodingError",
    "MaskFractionExceededError",
    "RequestRefusedError",
    "RolloutRetiredError",
    "TokenBuildError",
    "TokenCaptureConfigError",
    "TokenCaptureFrozenError",
    "TokenCaptureRetiredError",
    "TokenEntryConflictError",
    "TokenStoreDamagedError",
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


class AppenderError(CaptureStoreError):
    """The capture server's appender process did not append a line: it said why (an
    ``OSError`` as the cause), or it went away before saying.

    Attributes:
        path: the capture file the line was meant for.
    """


class CaptureDirNotFoundError(CaptureStoreError, FileNotFoundError):
    """A capture directory opened for reading does not exist; readers never create one.

    Attributes:
        path: the missing directory, absolute.
    """


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


# --- the complete-record token store (capture_core.tokens) --------------------------------


class TokenCaptureRetiredError(RolloutRetiredError):
    """The rollout's token capture was retired (dropped after delivery); it takes no writes.

    The fence stays until ``TokenCaptureStore.delete`` (or ``sweep_retired``) removes it.

    Attributes:
        rollout_id: the retired rollout.
    """

    def __init__(self, rollout_id: str) -> None:
        super().__init__(rollout_id)
        self.args = (f"token capture of rollout {quote_value(rollout_id)} is retired",)


class TokenCaptureFrozenError(CaptureError):
    """The rollout's token capture is already frozen: its snapshot was taken, no write follows.

    Attributes:
        rollout_id: the frozen rollout.
    """

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id
        super().__init__(f"token capture of rollout {quote_value(rollout_id)} is already frozen")


class TokenEntryConflictError(CaptureError, ValueError):
    """Two different token entries for one model call; the first one is kept.

    Attributes:
        rollout_id: the rollout.
        model_call_id: the call.
        durable: ``True`` when both payloads were already in the file (found while indexing its
            tail), ``False`` when a new ``put`` carried a different payload.
    """

    def __init__(self, rollout_id: str, model_call_id: str, *, durable: bool) -> None:
        self.rollout_id = rollout_id
        self.model_call_id = model_call_id
        self.durable = durable
        what = (
            "has conflicting durable payloads" if durable else "was reused with a different payload"
        )
        super().__init__(
            f"model call {quote_value(model_call_id)} of rollout {quote_value(rollout_id)} "
            f"{what}; the rollout is marked incomplete"
        )


class TokenBuildError(CaptureError, ValueError):
    """Token entries that cannot be turned into one trainable response.

    Attributes:
        reason: what is wrong, in words.
        model_call_id: the call at fault, when one is.
    """

    def __init__(self, reason: str, *, model_call_id: str | None = None) -> None:
        self.reason = reason
        self.model_call_id = model_call_id
        where = "" if model_call_id is None else f" (model call {quote_value(model_call_id)})"
        super().__init__(f"{reason}{where}")


class TokenCaptureConfigError(CaptureError, ValueError):
    """A ``token_id_capture`` setting that cannot work; raised at start-up, before any call.

    Attributes:
        key: the setting at fault, e.g. ``"sink_kwargs"`` or ``"token_id_capture.dirr"``.
        reason: what is wrong, in words.
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}")


class MaskFractionExceededError(CaptureError, RuntimeError):
    """Too many finalized rollouts were masked for training: the run is aborted.

    Attributes:
        masked: masked rollouts so far.
        finalized: finalized rollouts so far.
        limit: the configured ``max_mask_fraction``.
        reasons: how many masked rollouts had each reason.
    """

    def __init__(
        self, *, masked: int, finalized: int, limit: float, reasons: Mapping[str, int]
    ) -> None:
        self.masked = masked
        self.finalized = finalized
        self.limit = limit
        self.reasons = dict(reasons)
        ranked = sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
        top = ", ".join(f"{reason} ({count})" for reason, count in ranked) or "none"
        super().__init__(
            f"{masked} of {finalized} finalized rollouts were masked for training "
            f"({masked / max(finalized, 1):.1%} > max_mask_fraction {limit}); reasons: {top}"
        )


class TokenStoreDamagedError(CaptureStoreError, ValueError):
    """A token-store file no writer of the store could have left; the rollout is refused, never
    guessed at.

    Attributes:
        path: the file.
        reason: what is wrong, in words.
    """

    def __init__(self, reason: str, *, path: Path) -> None:
        self.reason = reason
        super().__init__(reason, path=path)


class RequestRefusedError(CaptureError):
    """A request the capture server answers itself instead of forwarding it.

    Attributes:
        status: the HTTP status to answer with (400, 405, 408, 413...).
        reason: why, in words (it goes into the error body).
    """

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"{status}: {reason}")
