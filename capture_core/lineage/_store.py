"""The per-rollout lineage ledger: custody rows, failures, parent resolution, retire and delete.

Files for rollout ``<id>`` in the store's directory:

* ``<id>.lineage.jsonl`` — the ledger, append-only, one row per line (see ``_rows.py``);
* ``<id>.lineage.retired`` — the fence: while it exists, the rollout takes no rows and has no
  manifest; only its presence matters;
* ``<id>.lineage.lock`` — an empty file whose ``flock`` guards the other two. Every write, read,
  retire and delete of a rollout holds it, so a fence check and the append after it are atomic.

The ledger cannot itself be the lock because retire unlinks it; the lock file is removed only by
``delete``, while held, and a waiter that finds its lock file replaced reopens it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from capture_core._fingerprint import FINGERPRINT_VERSION, conversation_digest
from capture_core._locking import fsync_dir, locked_fd, os_reason, unlink_if_present
from capture_core.exceptions import CaptureStoreError, RolloutRetiredError
from capture_core.ids import validate_rollout_id
from capture_core.lineage._files import append_row_line, read_ledger, touch_synced
from capture_core.lineage._rows import (
    LedgerRows,
    encode_line,
    failure_row,
    manifest_parts,
    record_from_row,
    record_row,
)
from capture_core.lineage._types import (
    LedgerConflictError,
    ParentResolution,
    RecordOutcome,
    ResolutionStatus,
)
from capture_core.staging.manifest import (
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    RolloutRemoval,
)
from capture_core.staging.reasons import LineageResolutionReason

__all__ = ["LineageStore"]

_log = logging.getLogger("capture_core.lineage")

_LEDGER: Final = ".lineage.jsonl"
_FENCE: Final = ".lineage.retired"
_LOCK: Final = ".lineage.lock"


class LineageStore:
    """One token-free ledger per rollout in a directory shared by every model-server process.

    Args:
        root: the directory.
        create: create it when missing.

    Raises:
        CaptureStoreError: ``root`` is not a directory, or cannot be created.

    Example:
        >>> store = LineageStore("/tmp/lineage")
        >>> store.manifest("r1").records
        []
        >>> store.retire(["r1"]).absent
        ['r1']
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        self._root = Path(root).resolve()
        if create:
            try:
                self._root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                reason = f"could not create the lineage directory: {os_reason(exc)}"
                raise CaptureStoreError(reason, path=self._root) from exc
        if not self._root.is_dir():
            raise CaptureStoreError("lineage root is not a directory", path=self._root)
        self._discarded = 0
        self._counter_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LineageStore({str(self._root)!r})"

    @property
    def root(self) -> Path:
        """The ledger directory, absolute."""
        return self._root

    @property
    def discarded(self) -> int:
        """Rows this store object discarded because their rollout was retired."""
        return self._discarded

    def ledger_path(self, rollout_id: str) -> Path:
        """``<root>/<rollout_id>.lineage.jsonl`` (the id is validated first)."""
        return self._root / f"{validate_rollout_id(rollout_id)}{_LEDGER}"

    def fence_path(self, rollout_id: str) -> Path:
        """``<root>/<rollout_id>.lineage.retired`` (the id is validated first)."""
        return self._root / f"{validate_rollout_id(rollout_id)}{_FENCE}"

    def is_retired(self, rollout_id: str) -> bool:
        """Whether the rollout is fenced: retired and not deleted since."""
        return self.fence_path(rollout_id).exists()

    def record(
        self,
        rollout_id: str,
        row: CallRecord,
        *,
        request_items: Sequence[Mapping[str, Any]] | None = None,
    ) -> RecordOutcome:
        """Append a committed call, durably, unless it is already there or the rollout retired.

        Args:
            rollout_id: the rollout.
            row: the call's manifest row.
            request_items: the call's request items (``lineage_request_items``); when given,
                the row keeps their count and conversation digest, and a later
                :meth:`resolve_parent` given a child's items checks that they extend them.

        Returns:
            ``APPENDED``; ``DUPLICATE`` for an identical re-commit; ``DISCARDED_RETIRED`` (with
            a WARNING naming the staging key) when the rollout was retired.

        Raises:
            LedgerConflictError: the ledger holds a different row for this ``model_call_id``.
            LedgerCorruptError: the ledger has a damaged line.

        Example:
            >>> store.record("r1", row)  # doctest: +SKIP
            <RecordOutcome.APPENDED: 'appended'>
        """
        path = self.ledger_path(rollout_id)
        with self._lock(rollout_id, create=True):
            if self.is_retired(rollout_id):
                return self._discard(rollout_id, f"staging key {row.staging_key}")
            ledger = read_ledger(path)
            context_len = None if request_items is None else len(request_items)
            context = None if request_items is None else conversation_digest(request_items)
            chain = _child_chain(ledger, row)
            new = record_row(
                row, staging_chain=chain, context_len=context_len, context_digest=context
            )
            line = encode_line(new)
            existing = ledger.find(row.model_call_id, failure=False)
            if existing:
                if encode_line(existing[0]) == line:
                    return RecordOutcome.DUPLICATE
                raise LedgerConflictError(rollout_id, row.model_call_id)
            append_row_line(path, line, ledger.torn_bytes)
        return RecordOutcome.APPENDED

    def record_failure(self, rollout_id: str, failure: ManifestFailure) -> RecordOutcome:
        """Append a failure row; an identical (call, reason) pair is written once.

        Example:
            >>> store.record_failure("r1", ManifestFailure(model_call_id="c9", reason="x"))
            <RecordOutcome.APPENDED: 'appended'>
        """
        path = self.ledger_path(rollout_id)
        line = encode_line(failure_row(failure))
        with self._lock(rollout_id, create=True):
            if self.is_retired(rollout_id):
                return self._discard(rollout_id, f"failure of model call {failure.model_call_id}")
            ledger = read_ledger(path)
            if any(
                encode_line(r) == line for r in ledger.find(failure.model_call_id, failure=True)
            ):
                return RecordOutcome.DUPLICATE
            append_row_line(path, line, ledger.torn_bytes)
        return RecordOutcome.APPENDED

    def manifest(self, rollout_id: str) -> RolloutManifest:
        """The rollout's committed calls and failures, each call once, in ledger order.

        A rollout with no ledger has an empty manifest.

        Raises:
            RolloutRetiredError: the rollout was retired.
            LedgerCorruptError: the ledger has a damaged line (a torn last line is skipped).

        Example:
            >>> store.manifest("r1").rollout_id
            'r1'
        """
        path = self.ledger_path(rollout_id)
        records, failures = manifest_parts(self._read_live(rollout_id), path)
        return RolloutManifest(rollout_id=rollout_id, records=records, failures=failures)

    def has_rows(self, rollout_id: str) -> bool:
        """Whether the ledger holds any row, failures included.

        Raises:
            RolloutRetiredError: the rollout was retired.

        Example:
            >>> store.has_rows("never-used")
            False
        """
        return bool(self._read_live(rollout_id).rows)

    def resolve_parent(
        self,
        rollout_id: str,
        *,
        fingerprint: str,
        request_items: Sequence[Mapping[str, Any]] | None = None,
    ) -> ParentResolution:
        """Find the recorded call a request continues, by lineage fingerprint (version 3).

        ``fingerprint`` is ``assistant_fingerprint`` of the request's items: ``""`` means a
        root. Otherwise the candidates are custody rows whose ``continuation_fingerprint``
        equals it, made with fingerprint version 3, that carry a chain hash and a staging
        chain. None gives ``no_match``. Several give ``ambiguous`` unless they all agree on
        ``cum_len``, ``cumulative_hash`` and ``chain_hash`` (a repeated identical call), in
        which case the first is used. With ``request_items``, a parent recorded with its
        context must be a prefix of them (count and conversation digest), else ``no_match``.

        Raises:
            RolloutRetiredError: the rollout was retired.

        Example:
            >>> store.resolve_parent("r1", fingerprint="").status
            <ResolutionStatus.ROOT: 'root'>
        """
        if not fingerprint:
            validate_rollout_id(rollout_id)
            return ParentResolution(ResolutionStatus.ROOT)
        rows = [row for row in self._read_live(rollout_id).rows if _anchors(row, fingerprint)]
        first_seen = {row["model_call_id"]: row for row in reversed(rows)}
        candidates = [row for row in rows if first_seen[row["model_call_id"]] is row]
        if not candidates:
            return _unresolved(LineageResolutionReason.NO_MATCH)
        if len({(r["cum_len"], r["cumulative_hash"], r["chain_hash"]) for r in candidates}) > 1:
            return _unresolved(LineageResolutionReason.AMBIGUOUS)
        parent = candidates[0]
        if request_items is not None and not _extends_context(parent, request_items):
            return _unresolved(LineageResolutionReason.NO_MATCH)
        return ParentResolution(
            ResolutionStatus.RESOLVED,
            parent=record_from_row(parent),
            staging_chain=tuple(parent["staging_chain"]),
        )

    def retire(self, rollout_ids: Sequence[str]) -> RolloutRemoval:
        """Fence rollouts against late writes and remove their ledgers.

        The whole batch is validated first (nothing changes if an id is invalid) and deduped.
        Every fence is created and synced before any ledger is removed, and a ledger is removed
        only while its fence still exists. ``removed`` lists the ids whose ledger existed.

        Raises:
            InvalidRolloutIdError: an id in the batch is invalid.
            TypeError: ``rollout_ids`` is a single string.

        Example:
            >>> store.retire(["r1", "r2"]).model_dump(include={"removed", "absent"})
            {'removed': ['r1'], 'absent': ['r2']}
        """
        ids = _batch(rollout_ids)
        removed: list[str] = []
        try:
            for rollout_id in ids:
                with self._lock(rollout_id, create=True):
                    touch_synced(self.fence_path(rollout_id))
        finally:
            if ids:
                fsync_dir(self._root)
        try:
            for rollout_id in ids:
                with self._lock(rollout_id, create=True):
                    if self.is_retired(rollout_id) and unlink_if_present(
                        self.ledger_path(rollout_id)
                    ):
                        removed.append(rollout_id)
        finally:
            if ids:
                fsync_dir(self._root)
        return _removal(ids, removed)

    def delete(self, rollout_ids: Sequence[str]) -> RolloutRemoval:
        """Forget rollouts: remove ledger, fence and lock file, so each id can be used again.

        Validated and deduped as :meth:`retire`. ``removed`` lists the ids whose ledger
        existed, so an id retired earlier is reported ``absent``.

        Example:
            >>> store.delete(["r1"]).absent
            ['r1']
        """
        ids = _batch(rollout_ids)
        removed: list[str] = []
        try:
            for rollout_id in ids:
                with self._lock(rollout_id, create=True):
                    if unlink_if_present(self.ledger_path(rollout_id)):
                        removed.append(rollout_id)
                    unlink_if_present(self.fence_path(rollout_id))
                    unlink_if_present(self._lock_path(rollout_id))  # waiters reopen a new one
        finally:
            if ids:
                fsync_dir(self._root)
        return _removal(ids, removed)

    def _lock_path(self, rollout_id: str) -> Path:
        return self._root / f"{validate_rollout_id(rollout_id)}{_LOCK}"

    @contextmanager
    def _lock(self, rollout_id: str, *, create: bool) -> Iterator[None]:
        """Hold the rollout's lock; without ``create``, a missing lock file is not made."""
        flags = os.O_RDONLY
        with locked_fd(self._lock_path(rollout_id), flags, exclusive=create, create=create):
            yield

    def _read_live(self, rollout_id: str) -> LedgerRows:
        path = self.ledger_path(rollout_id)
        with self._lock(rollout_id, create=False):
            if self.is_retired(rollout_id):
                raise RolloutRetiredError(rollout_id)
            return read_ledger(path)

    def _discard(self, rollout_id: str, what: str) -> RecordOutcome:
        with self._counter_lock:
            self._discarded += 1
        _log.warning(
            "discarded a lineage row for retired rollout %s (%s): its staged tokens, if any, "
            "are referenced by no manifest",
            rollout_id,
            what,
        )
        return RecordOutcome.DISCARDED_RETIRED


def _batch(rollout_ids: Sequence[str]) -> list[str]:
    if isinstance(rollout_ids, str | bytes):
        raise TypeError(f"expected a sequence of rollout ids, got the string {rollout_ids!r}")
    ids = list(rollout_ids)
    for rollout_id in ids:
        validate_rollout_id(rollout_id)
    return list(dict.fromkeys(ids))


def _removal(ids: list[str], removed: list[str]) -> RolloutRemoval:
    gone = set(removed)
    return RolloutRemoval(removed=removed, absent=[i for i in ids if i not in gone])


def _unresolved(reason: LineageResolutionReason) -> ParentResolution:
    return ParentResolution(ResolutionStatus.UNRESOLVED, reason=reason)


def _anchors(row: Mapping[str, Any], fingerprint: str) -> bool:
    """Whether a row can be a continuation's parent for this fingerprint."""
    chain = row.get("staging_chain")
    return (
        "staging_key" in row
        and "failure_reason" not in row
        and row.get("fingerprint") == fingerprint
        and row.get("fingerprint_version") == FINGERPRINT_VERSION
        and bool(row.get("chain_hash"))
        and isinstance(chain, list)
        and bool(chain)
    )


def _extends_context(parent: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> bool:
    context_len = parent.get("context_len")
    if context_len is None:
        return True
    if not isinstance(context_len, int) or len(items) < context_len:
        return False
    return conversation_digest(items[:context_len]) == parent.get("context_digest")


def _child_chain(ledger: LedgerRows, row: CallRecord) -> list[str]:
    """The staging keys from the root to ``row``; empty when the parent is not in the ledger."""
    if row.parent_call_id is None:
        return [row.staging_key]
    for parent in ledger.find(row.parent_call_id, failure=False):
        chain = parent.get("staging_chain")
        if "staging_key" in parent and isinstance(chain, list) and chain:
            return [*chain, row.staging_key]
    return []
