"""In-memory staging sinks for tests: one that takes attachments, and a text-only one.

* :class:`InMemoryStagingSink` — a :class:`~capture_core.staging.StagingSink` and source that
  keeps each row's record JSON and attachments together in a dict.
* :class:`LegacyStagingSink` — a sink written before attachments: ``stage(self, record)``
  only, so a call with ``attachments=`` fails with ``TypeError`` as a real legacy sink would.

Both count the calls that reached ``stage`` in ``stage_calls`` and keep rows as the JSON bytes a
real sink would store, so ``fetch`` validates every snapshot afresh and :meth:`overwrite_raw`
can stand in for damage on disk.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pydantic import ValidationError

from capture_core.staging.build import default_staging_key
from capture_core.staging.records import StagedCallRecord, StagedCallSnapshot, StageResult
from capture_core.staging.sinks import (
    Attachments,
    StagedRowDamagedError,
    StagedRowNotFoundError,
    StagingConflictError,
    check_attachments,
)

__all__ = ["InMemoryStagingSink", "LegacyStagingSink"]


class _MemoryRows:
    """Rows by staging key: the record JSON and its attachments, stored and read as one."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[bytes, dict[str, bytes]]] = {}
        self._lock = threading.Lock()
        self.stage_calls = 0

    def __len__(self) -> int:
        return len(self._rows)

    def keys(self) -> list[str]:
        """The staged keys, in staging order."""
        with self._lock:
            return list(self._rows)

    def fetch(self, keys: Sequence[str]) -> list[StagedCallSnapshot]:
        """One validated snapshot per key, in key order (see ``StagingSource.fetch``)."""
        snapshots: list[StagedCallSnapshot] = []
        for key, raw in zip(keys, self.fetch_raw(keys), strict=True):
            try:
                snapshots.append(StagedCallSnapshot.model_validate_json(raw))
            except ValidationError as exc:
                raise StagedRowDamagedError(key, f"not a valid staged row: {exc}") from exc
        return snapshots

    def fetch_raw(self, keys: Sequence[str]) -> list[bytes]:
        """Each key's record JSON as stored (see ``RawStagingSource.fetch_raw``)."""
        return [self._row(key)[0] for key in keys]

    def fetch_attachments(self, staging_key: str) -> dict[str, bytes]:
        """The attachments staged with a row (empty when it had none)."""
        return dict(self._row(staging_key)[1])

    def overwrite_raw(self, staging_key: str, data: bytes) -> None:
        """Replace a stored row's record JSON, as damage or tampering on disk would."""
        with self._lock:
            _, attachments = self._row(staging_key)
            self._rows[staging_key] = (bytes(data), attachments)

    def _row(self, key: str) -> tuple[bytes, dict[str, bytes]]:
        try:
            return self._rows[key]
        except KeyError:
            raise StagedRowNotFoundError(key, "no row is staged under this key") from None

    def _store(self, record: StagedCallRecord, attachments: dict[str, bytes]) -> StageResult:
        if not isinstance(record, StagedCallRecord):
            raise TypeError(f"stage() takes a StagedCallRecord, got {type(record).__name__}")
        key = default_staging_key(record.rollout_id, record.model_call_id)
        row = (record.model_dump_json().encode("utf-8"), attachments)
        with self._lock:
            existing = self._rows.setdefault(key, row)
        if existing != row:
            raise StagingConflictError(key, "already holds a different row or attachments")
        return StageResult(ok=True, staging_key=key)


class InMemoryStagingSink(_MemoryRows):
    """An attachment-aware sink and source in memory (a test double).

    Attributes:
        stage_calls: how many times ``stage`` was called, refused calls included.

    Example:
        >>> from capture_core.staging import build_staged_call_record
        >>> sink = InMemoryStagingSink()
        >>> record = build_staged_call_record(
        ...     rollout_id="r1", model_call_id="c1", prompt_token_ids=[1, 2, 3],
        ...     generated_token_ids=[4, 5], generated_logprobs=[-0.5, -0.25], weight_version=7,
        ... )
        >>> sink.stage(record, attachments={"pixels": b"\\x00"}).staging_key
        'r1/c1'
        >>> sink.fetch_attachments("r1/c1"), sink.stage_calls
        ({'pixels': b'\\x00'}, 1)
    """

    def stage(
        self, record: StagedCallRecord, *, attachments: Attachments | None = None
    ) -> StageResult:
        """Store the record and its attachments together; identical re-staging is a no-op.

        Raises:
            InvalidAttachmentError: attachments that are not a mapping of names to bytes.
            StagingConflictError: the key already holds different content.
        """
        with self._lock:
            self.stage_calls += 1
        return self._store(record, check_attachments({} if attachments is None else attachments))


class LegacyStagingSink(_MemoryRows):
    """A text-only sink in memory whose ``stage`` takes no ``attachments`` keyword.

    A call with ``attachments=`` fails with ``TypeError`` before reaching ``stage``'s body, so
    it is not counted in ``stage_calls``; wrap ``stage`` in a mock to count such attempts.

    Attributes:
        stage_calls: how many times ``stage`` ran.

    Example:
        >>> from capture_core.staging import build_staged_call_record
        >>> sink = LegacyStagingSink()
        >>> record = build_staged_call_record(
        ...     rollout_id="r1", model_call_id="c1", prompt_token_ids=[1, 2, 3],
        ...     generated_token_ids=[4, 5], generated_logprobs=[-0.5, -0.25], weight_version=7,
        ... )
        >>> sink.stage(record).ok
        True
        >>> sink.stage(record, attachments={"pixels": b"\\x00"})
        Traceback (most recent call last):
        TypeError: LegacyStagingSink.stage() got an unexpected keyword argument 'attachments'
    """

    def stage(self, record: StagedCallRecord) -> StageResult:
        """Store the record; identical re-staging is a no-op.

        Raises:
            StagingConflictError: the key already holds a different row.
        """
        with self._lock:
            self.stage_calls += 1
        return self._store(record, {})
