"""The pluggable parts of token staging: sinks, sources and engine adapters, and their errors.

* :class:`StagingSink` — ``stage(record, *, attachments=None) -> StageResult``, durable before
  it returns. ``attachments`` are the framework's opaque bytes (for example processed media)
  stored in the same durable write as the record, or the call is refused.
* :class:`TextOnlyStagingSink` — an older sink whose ``stage(record)`` takes no attachments.
  It keeps working for calls without attachments; given some, it fails with ``TypeError``.
* :class:`StagingSource` — ``fetch(keys)``: one validated snapshot per key, in key order.
* :class:`RawStagingSource` — ``fetch_raw(keys)``: each row's record JSON exactly as staged,
  so a verifier can validate it itself and name what is wrong with a reason code.
* :class:`CaptureAdapter` — reads an engine's token fields from its response (for
  ``RolloutTokenCapture.complete_call_from_response``) and asks it for a prompt prefix.

Errors raised by sinks and sources (all :class:`~capture_core.staging.StagingError`)::

    StagingError
    ├── InvalidAttachmentError   (also a TypeError)  .name
    └── StagingSinkError                             .staging_key
        ├── StagingConflictError
        ├── StagingWriteError                        .path
        ├── StagedRowNotFoundError
        └── StagedRowDamagedError                    .reason
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias, runtime_checkable

from capture_core.exceptions import quote_value
from capture_core.staging.errors import StagingError
from capture_core.staging.records import StagedCallRecord, StagedCallSnapshot, StageResult

__all__ = [
    "AttachmentValue",
    "Attachments",
    "CaptureAdapter",
    "InvalidAttachmentError",
    "RawStagingSource",
    "StagedRowDamagedError",
    "StagedRowNotFoundError",
    "StagingConflictError",
    "StagingSink",
    "StagingSinkError",
    "StagingSource",
    "StagingWriteError",
    "TextOnlyStagingSink",
    "check_attachments",
]

AttachmentValue: TypeAlias = bytes | bytearray | memoryview
"""The bytes of one attachment; any other value is refused."""
Attachments: TypeAlias = Mapping[str, AttachmentValue]
"""Opaque framework payloads staged beside a record, by name."""


class InvalidAttachmentError(StagingError, TypeError):
    """An attachments mapping a sink cannot store byte for byte; nothing was written.

    Attributes:
        name: the attachment at fault (``None`` when the mapping itself is wrong).
    """

    def __init__(self, name: object, reason: str) -> None:
        self.name = name
        where = "attachments" if name is None else f"attachment {quote_value(name)}"
        super().__init__(f"{where}: {reason}")


class StagingSinkError(StagingError):
    """A staged row could not be written or read back.

    Attributes:
        staging_key: the row's staging key.
    """

    def __init__(self, staging_key: str, message: str) -> None:
        self.staging_key = staging_key
        super().__init__(f"staging key {quote_value(staging_key)}: {message}")


class StagingConflictError(StagingSinkError):
    """The key already holds a different row (or different attachments); nothing changed."""


class StagingWriteError(StagingSinkError):
    """The disk refused the write; nothing was stored under the key.

    Attributes:
        path: the file that could not be written.
    """

    def __init__(self, staging_key: str, message: str, *, path: Path) -> None:
        self.path = path
        super().__init__(staging_key, f"{message} ({path})")


class StagedRowNotFoundError(StagingSinkError):
    """No row was ever staged under the key (or it was removed)."""


class StagedRowDamagedError(StagingSinkError):
    """A stored row is not what was staged: its bytes changed, or it is not a valid row.

    Attributes:
        reason: what is wrong, in words.
    """

    def __init__(self, staging_key: str, reason: str) -> None:
        self.reason = reason
        super().__init__(staging_key, f"stored row is damaged: {reason}")


@runtime_checkable
class StagingSink(Protocol):
    """Stores one staged row (and its attachments) durably, or refuses it.

    ``stage`` must not return before the record and every attachment are durable, in one write:
    either all of them are stored or none is. It may be called from several threads at once.
    Staging the identical row again under the same key succeeds without change; a different
    row for an existing key is a conflict. The returned ``StageResult.staging_key`` is the key
    to fetch the row with.
    """

    def stage(
        self, record: StagedCallRecord, *, attachments: Attachments | None = None
    ) -> StageResult: ...


@runtime_checkable
class TextOnlyStagingSink(Protocol):
    """A sink written before attachments existed: ``stage(record)`` only.

    :class:`~capture_core.staging.RolloutTokenCapture` calls it without the ``attachments``
    keyword when the caller gave none, so text-only capture keeps working; a call with
    attachments fails with ``TypeError`` and is reported as ``capture_failed``.
    """

    def stage(self, record: StagedCallRecord) -> StageResult: ...


@runtime_checkable
class StagingSource(Protocol):
    """Reads staged rows back by key."""

    def fetch(self, keys: Sequence[str]) -> list[StagedCallSnapshot]:
        """One validated snapshot per key, in the order of ``keys``.

        Raises:
            StagedRowNotFoundError: a key holds no row.
            StagedRowDamagedError: a stored row changed since it was staged or is invalid.
        """
        ...


@runtime_checkable
class RawStagingSource(Protocol):
    """Reads staged rows back as the record JSON bytes that were staged."""

    def fetch_raw(self, keys: Sequence[str]) -> list[bytes]:
        """One record JSON document per key, in key order, not yet validated as a snapshot.

        Validate each with ``StagedCallSnapshot.model_validate_json``; a digest that does not
        match the row shows as a ``ValidationError`` of type ``digest_mismatch``.

        Raises:
            StagedRowNotFoundError: a key holds no row.
            StagedRowDamagedError: the stored bytes changed since they were staged.
        """
        ...


@runtime_checkable
class CaptureAdapter(Protocol):
    """Reads an engine's token fields from its response, and puts a prefix on its request."""

    def enter_prefix(self, request: MutableMapping[str, Any], prefix_ids: Sequence[int]) -> None:
        """Ask the engine to start the prompt with ``prefix_ids`` (a continuation)."""
        ...

    def extract_prompt_ids(self, payload: Mapping[str, Any]) -> list[int]:
        """The full prompt the engine saw, as token ids."""
        ...

    def extract_generation(self, payload: Mapping[str, Any]) -> tuple[list[int], list[float]]:
        """The generated token ids and one log-prob per id."""
        ...

    def extract_extras(self, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        """Extras to stage with the call (covered by its extras digest), or ``None``."""
        ...


def check_attachments(attachments: object) -> dict[str, bytes]:
    """Check an attachments mapping and take a stable copy of its bytes, sorted by name.

    ``bytes`` values are kept as they are; ``bytearray`` and ``memoryview`` values are copied
    (a view of any shape or format becomes its bytes in C order), so a caller that changes its
    buffer later cannot change what was stored.

    Raises:
        InvalidAttachmentError: not a mapping, a name that is not a non-empty UTF-8 ``str``, or
            a value that is not ``bytes``, ``bytearray`` or ``memoryview``.

    Example:
        >>> check_attachments({"pixels": b"\\x00\\x01", "sizes": bytearray(b"\\x02")})
        {'pixels': b'\\x00\\x01', 'sizes': b'\\x02'}
    """
    if not isinstance(attachments, Mapping):
        raise InvalidAttachmentError(
            None, f"must be a mapping of name to bytes, got {type(attachments).__name__}"
        )
    checked: dict[str, bytes] = {}
    for name in sorted(attachments, key=_name_order):
        checked[name] = _attachment_bytes(name, attachments[name])
    return checked


def _name_order(name: object) -> str:
    if type(name) is not str or not name:
        raise InvalidAttachmentError(name, "the name must be a non-empty str")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidAttachmentError(name, "the name is not encodable as UTF-8") from None
    return name


def _attachment_bytes(name: str, value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, memoryview):
        return value.tobytes()
    raise InvalidAttachmentError(
        name, f"must be bytes, bytearray or memoryview, got {type(value).__name__}"
    )
