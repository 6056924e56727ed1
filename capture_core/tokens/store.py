"""``TokenCaptureStore``: complete token records per rollout in one directory, with fences.

The files are described in :mod:`.layout`.

The lifecycle: calls ``put`` entries → the collector ``freeze``s (writes are refused from then
on) and gets a snapshot id and version → once the rollout's result is durable it ``drop``s that
exact snapshot: the entries go, and the state stays as a *retired* fence that refuses every
later writer until ``delete``. Any change after the freeze (a late ``mark_incomplete``) bumps
the version, so the drop fails and the evidence is kept.

Every method validates the rollout id before it touches the disk.
"""

from __future__ import annotations

import logging
import uuid

from capture_core._locking import fsync_dir, os_reason, unlink_if_present
from capture_core.exceptions import (
    TokenCaptureFrozenError,
    TokenCaptureRetiredError,
    TokenEntryConflictError,
)
from capture_core.ids import validate_rollout_id
from capture_core.tokens import _files as files
from capture_core.tokens._threads import in_thread
from capture_core.tokens.directory import TokenStoreDirectory
from capture_core.tokens.entry import TokenEntry, canonical_line, entry_digest
from capture_core.tokens.layout import (
    ENTRIES_SUFFIX,
    INCOMPLETE_SUFFIX,
    INTENTS_SUFFIX,
    STATE_SUFFIX,
    validate_model_call_id,
)
from capture_core.tokens.protocols import TokenCaptureSnapshot
from capture_core.tokens.state import TokenCaptureState, read_state, write_state

__all__ = ["TokenCaptureStore"]

logger = logging.getLogger("capture_core.tokens")


class TokenCaptureStore(TokenStoreDirectory):
    """The complete-record token store: a :class:`TokenSink` and a :class:`TokenSource`.

    Args:
        root: the directory (shared by every model-server process and the collector).
        create: create it when missing (the model server); without it a missing directory is
            an error, so a collector pointed at the wrong path fails loudly instead of finding
            every rollout empty.

    Raises:
        CaptureDirNotFoundError: ``root`` does not exist and ``create`` is false.
        CaptureStoreError: ``root`` is not a directory, or cannot be created.

    Example:
        >>> store = TokenCaptureStore("/tmp/tokens", create=True)
        >>> store.append(TokenEntry(rollout_id="3-2", model_call_id="c1", prompt_token_ids=[1],
        ...                         generation_token_ids=[2], generation_log_probs=[-0.1]))
        >>> snapshot = store.freeze_now("3-2")
        >>> [e.model_call_id for e in snapshot.entries], snapshot.incomplete
        (['c1'], False)
        >>> store.drop_now("3-2", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
        True
    """

    def __repr__(self) -> str:
        return f"TokenCaptureStore({str(self._root)!r})"

    # -- writers (the model server) --------------------------------------------------------

    def append(self, entry: TokenEntry) -> None:
        """Store one call's entry durably; the synchronous :meth:`put`.

        The entry is validated again (a model mutated after construction is refused before
        anything is written). Its canonical line is appended and fsynced; a call already stored
        with the same line is a no-op.

        Raises:
            InvalidRolloutIdError: the entry's rollout id cannot name a file.
            InvalidRecordError: the call id cannot key a line.
            ValueError: the entry is invalid or cannot be written as JSON; nothing is written.
            TokenCaptureRetiredError: the rollout was dropped and not deleted since.
            TokenCaptureFrozenError: the rollout is frozen.
            TokenEntryConflictError: the call was stored with a different payload; the rollout
                is marked incomplete and the first payload kept.
            TokenStoreDamagedError: the rollout's files are damaged.
            OSError: the disk refused the line.
        """
        rollout_id = validate_rollout_id(entry.rollout_id)
        call = validate_model_call_id(entry.model_call_id)
        line = canonical_line(TokenEntry.model_validate(entry.model_dump()))
        digest = entry_digest(line)
        with self._locked(rollout_id, exclusive=True):
            state = self._writable_state(rollout_id)
            changed = self._sync_index(rollout_id, state)
            known = state.entry_digests.get(call)
            if known == digest:
                if changed:
                    self._write_lagging_state(rollout_id, state)
                return
            if known is not None:
                self._mark(rollout_id, state, call)
                raise TokenEntryConflictError(rollout_id, call, durable=False)
            path = self.path_for(rollout_id)
            state.indexed_size = files.append_bytes(path, line + b"\n")
            state.entry_digests[call] = digest
            state.version += 1
            self._write_lagging_state(rollout_id, state)

    async def put(self, entry: TokenEntry) -> None:
        """:meth:`append` in a worker thread (the :class:`TokenSink` method)."""
        await in_thread(self.append, entry)

    def begin_call_now(self, rollout_id: str, model_call_id: str) -> None:
        """Record, durably, that a call is about to generate; the synchronous :meth:`begin_call`.

        An intent with no entry at freeze time makes the snapshot incomplete (a lost call).

        Raises:
            TokenCaptureRetiredError, TokenCaptureFrozenError: the rollout takes no calls.
        """
        call = validate_model_call_id(model_call_id)
        with self._locked(rollout_id, exclusive=True):
            self._writable_state(rollout_id)
            path = self.path_for(rollout_id, INTENTS_SUFFIX)
            _, torn = files.read_id_lines(path)
            files.append_bytes(path, f"{call}\n".encode(), torn=torn)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """:meth:`begin_call_now` in a worker thread (the :class:`CallIntentSink` method)."""
        await in_thread(self.begin_call_now, rollout_id, model_call_id)

    def mark_incomplete_now(self, rollout_id: str, model_call_id: str = "") -> None:
        """Mark the rollout incomplete, durably; the synchronous :meth:`mark_incomplete`.

        Allowed after a freeze: the version changes, so a drop of the earlier snapshot fails
        and the evidence is kept.

        Raises:
            TokenCaptureRetiredError: the rollout was dropped.
        """
        call = validate_model_call_id(model_call_id, allow_empty=True)
        with self._locked(rollout_id, exclusive=True):
            state = read_state(self.path_for(rollout_id, STATE_SUFFIX))
            if state.retired:
                raise TokenCaptureRetiredError(rollout_id)
            self._mark(rollout_id, state, call)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """:meth:`mark_incomplete_now` in a worker thread (the :class:`TokenSink` method)."""
        await in_thread(self.mark_incomplete_now, rollout_id, model_call_id)

    async def close(self) -> None:
        """Nothing to release (every operation opens and closes its own files)."""

    # -- the collector -----------------------------------------------------------------------

    def freeze_now(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Refuse all later writes and return the rollout's entries; the synchronous
        :meth:`freeze`.

        Idempotent: a second freeze with nothing changed returns an equal snapshot. Freezing a
        rollout that never wrote creates its state (frozen, empty).

        Raises:
            TokenCaptureRetiredError: the rollout was dropped.
            TokenStoreDamagedError: a line is not a valid entry (e.g. a newer schema).
            TokenEntryConflictError: the file holds two payloads for one call.
        """
        with self._locked(rollout_id, exclusive=True):
            state_path = self.path_for(rollout_id, STATE_SUFFIX)
            state = read_state(state_path)
            if state.retired:
                raise TokenCaptureRetiredError(rollout_id)
            changed = self._sync_index(rollout_id, state)
            if not state.frozen:
                state.frozen, state.snapshot_id = True, uuid.uuid4().hex
                state.version += 1
                write_state(state_path, state, durable=True)
            elif changed:
                write_state(state_path, state, durable=True)
            entries = self._read_entries(rollout_id)
            intents, _ = files.read_id_lines(self.path_for(rollout_id, INTENTS_SUFFIX))
            recorded = {entry.model_call_id for entry in entries}
            lost = any(call not in recorded for call in intents)
            return TokenCaptureSnapshot(
                rollout_id=rollout_id,
                entries=tuple(entries),
                incomplete=state.incomplete or lost,
                snapshot_id=state.snapshot_id,
                version=state.version,
            )

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        """:meth:`freeze_now` in a worker thread (the :class:`TokenSource` method)."""
        return await in_thread(self.freeze_now, rollout_id)

    def drop_now(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly the snapshot ``(snapshot_id, version)``; the synchronous :meth:`drop`.

        Returns ``False`` and changes nothing unless the rollout is frozen with that snapshot id
        and that version. Otherwise the retired state is written (durably) first, then the
        entries, intents and incomplete marks are removed; the state stays as a fence that
        refuses every later writer until :meth:`delete`. Dropping the same snapshot again
        returns ``True`` (and finishes a drop that a crash interrupted).
        """
        with self._locked(rollout_id, exclusive=True):
            state_path = self.path_for(rollout_id, STATE_SUFFIX)
            state = read_state(state_path)
            if not (
                state.frozen
                and snapshot_id
                and state.snapshot_id == snapshot_id
                and state.version == version
            ):
                return False
            if not state.retired:
                state.retired, state.indexed_size, state.entry_digests = True, 0, {}
                write_state(state_path, state, durable=True)
            for suffix in (ENTRIES_SUFFIX, INTENTS_SUFFIX, INCOMPLETE_SUFFIX):
                unlink_if_present(self.path_for(rollout_id, suffix))
        fsync_dir(self._root)
        return True

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """:meth:`drop_now` in a worker thread (the :class:`TokenSource` method)."""
        return await in_thread(self.drop_now, rollout_id, snapshot_id=snapshot_id, version=version)

    # -- readers -----------------------------------------------------------------------------

    def read_entries(self, rollout_id: str) -> list[TokenEntry]:
        """The rollout's entries in file order, each call once, without changing anything.

        A torn last line (a writer killed mid-append, never acknowledged) is skipped with a
        warning; the next writer cuts it.

        Raises:
            TokenCaptureRetiredError: the rollout was dropped: its entries are gone on purpose.
            TokenStoreDamagedError: a line is not a valid entry (e.g. a newer schema).
        """
        with self._locked(rollout_id, exclusive=False):
            if read_state(self.path_for(rollout_id, STATE_SUFFIX)).retired:
                raise TokenCaptureRetiredError(rollout_id)
            return self._read_entries(rollout_id)

    def is_incomplete(self, rollout_id: str) -> bool:
        """Whether the rollout was marked incomplete (intents are not consulted)."""
        with self._locked(rollout_id, exclusive=False):
            return read_state(self.path_for(rollout_id, STATE_SUFFIX)).incomplete

    def state(self, rollout_id: str) -> TokenCaptureState:
        """The rollout's state as stored (every default when it has none)."""
        with self._locked(rollout_id, exclusive=False):
            return read_state(self.path_for(rollout_id, STATE_SUFFIX))

    # -- internals (each runs under the rollout's lock) ---------------------------------------

    def _writable_state(self, rollout_id: str) -> TokenCaptureState:
        state = read_state(self.path_for(rollout_id, STATE_SUFFIX))
        if state.retired:
            raise TokenCaptureRetiredError(rollout_id)
        if state.frozen:
            raise TokenCaptureFrozenError(rollout_id)
        return state

    def _sync_index(self, rollout_id: str, state: TokenCaptureState) -> bool:
        """Index the lines past ``indexed_size`` (cutting a torn tail); tell if it changed.

        Two different lines for one call mark the rollout incomplete and raise.
        """
        indexed = files.index_tail(self.path_for(rollout_id), state)
        if indexed.conflict is not None:
            self._mark(rollout_id, state, indexed.conflict)
            raise TokenEntryConflictError(rollout_id, indexed.conflict, durable=True)
        return indexed.changed

    def _mark(self, rollout_id: str, state: TokenCaptureState, call: str) -> None:
        state.incomplete = True
        state.version += 1
        write_state(self.path_for(rollout_id, STATE_SUFFIX), state, durable=True)
        path = self.path_for(rollout_id, INCOMPLETE_SUFFIX)
        _, torn = files.read_id_lines(path)
        files.append_bytes(path, f"{call}\n".encode(), torn=torn)
        fsync_dir(self._root)

    def _write_lagging_state(self, rollout_id: str, state: TokenCaptureState) -> None:
        """The state after an append: atomic, not fsynced; a failure only delays the index."""
        try:
            write_state(self.path_for(rollout_id, STATE_SUFFIX), state, durable=False)
        except OSError as exc:
            logger.warning(
                "could not update the token index of rollout %s (%s); the entry is durable and "
                "the next writer re-indexes it",
                rollout_id,
                os_reason(exc),
            )

    def _read_entries(self, rollout_id: str) -> list[TokenEntry]:
        return files.read_entries(self.path_for(rollout_id), rollout_id)
