"""The token store's directory: opening it, naming and locking a rollout's files, removing them.

:class:`TokenStoreDirectory` is the base of :class:`~.store.TokenCaptureStore`. It knows the
directory and the file set of each rollout (see :mod:`.layout`): it opens (or creates) the
directory, names a rollout's files, takes the rollout's lock, and removes a rollout's files
whole: :meth:`~TokenStoreDirectory.delete` before an id is used again, and
:meth:`~TokenStoreDirectory.sweep_retired` for the fences of long-retired rollouts and the
state temporaries of killed writers. What the files hold (entries, intents, the state and its
lifecycle) is the store's business.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from capture_core._locking import fsync_dir, locked_fd, os_reason, unlink_if_present
from capture_core.exceptions import CaptureDirNotFoundError, CaptureStoreError
from capture_core.ids import is_valid_rollout_id, validate_rollout_id
from capture_core.tokens.layout import (
    ENTRIES_SUFFIX,
    INCOMPLETE_SUFFIX,
    INTENTS_SUFFIX,
    LOCK_SUFFIX,
    STATE_SUFFIX,
)
from capture_core.tokens.state import STATE_TEMP_PREFIX, read_state

__all__ = ["TokenStoreDirectory"]

_TEMP_MIN_AGE_S: Final = 3600.0


class TokenStoreDirectory:
    """A token store's directory and the per-rollout files in it: paths, locks, removal.

    Args:
        root: the directory.
        create: create it when missing; without it a missing directory is an error.

    Raises:
        CaptureDirNotFoundError: ``root`` does not exist and ``create`` is false.
        CaptureStoreError: ``root`` is not a directory, or cannot be created.
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self._root = Path(root).resolve()
        if create:
            try:
                self._root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                reason = f"could not create the token store directory: {os_reason(exc)}"
                raise CaptureStoreError(reason, path=self._root) from exc
        elif not self._root.exists():
            raise CaptureDirNotFoundError(
                "the token store directory does not exist", path=self._root
            )
        if not self._root.is_dir():
            raise CaptureStoreError("the token store root is not a directory", path=self._root)

    @property
    def root(self) -> Path:
        """The store's directory, absolute."""
        return self._root

    def path_for(self, rollout_id: str, suffix: str = ENTRIES_SUFFIX) -> Path:
        """``<root>/<rollout_id><suffix>`` (the id is validated first).

        Example:
            >>> TokenCaptureStore("/tmp/tokens", create=True).path_for("3-2", STATE_SUFFIX).name
            '3-2.tokens.state.json'
        """
        return self._root / f"{validate_rollout_id(rollout_id)}{suffix}"

    # -- administration ----------------------------------------------------------------------

    def delete(self, rollout_id: str) -> bool:
        """Forget a rollout entirely (entries, marks, state and its fence) so the id starts
        fresh; idempotent. Only safe when no call of the rollout can still arrive (before
        dispatching it again, or at the end of a run).

        A drop naming a snapshot from before the delete returns ``False``: it cannot retire a
        newer attempt's capture.

        Returns:
            Whether any file was removed.
        """
        removed = False
        with self._locked(rollout_id, exclusive=True):
            # The state goes last: a delete cut short leaves an index that names missing
            # bytes (refused loudly), never old entries a fresh state would adopt.
            for suffix in (ENTRIES_SUFFIX, INTENTS_SUFFIX, INCOMPLETE_SUFFIX, STATE_SUFFIX):
                removed |= unlink_if_present(self.path_for(rollout_id, suffix))
        fsync_dir(self._root)
        return removed

    def sweep_retired(self, older_than_seconds: float) -> int:
        """Remove the fences of rollouts retired more than ``older_than_seconds`` ago.

        Live and recently retired rollouts are left alone. A removed fence no longer stops a
        late writer, so sweep only what no call can still reach. State temporaries left by a
        writer killed mid-replace are removed too, once an hour old.

        Returns:
            The number of retired rollouts removed.
        """
        cutoff = time.time() - older_than_seconds
        swept = 0
        for name in sorted(os.listdir(self._root)):
            if name.startswith(STATE_TEMP_PREFIX):
                self._sweep_temp(name, min(cutoff, time.time() - _TEMP_MIN_AGE_S))
                continue
            rollout_id = name.removesuffix(STATE_SUFFIX)
            if rollout_id != name and is_valid_rollout_id(rollout_id):
                swept += self._sweep_one(rollout_id, cutoff)
        if swept:
            fsync_dir(self._root)
        return swept

    # -- internals (each runs under the rollout's lock) ---------------------------------------

    @contextmanager
    def _locked(self, rollout_id: str, *, exclusive: bool) -> Iterator[None]:
        lock = self.path_for(rollout_id, LOCK_SUFFIX)
        with locked_fd(lock, os.O_RDONLY, exclusive=exclusive, create=True):
            yield

    def _sweep_one(self, rollout_id: str, cutoff: float) -> int:
        state_path = self.path_for(rollout_id, STATE_SUFFIX)
        with self._locked(rollout_id, exclusive=True):
            try:
                if os.stat(state_path).st_mtime > cutoff:
                    return 0
            except FileNotFoundError:
                return 0
            if not read_state(state_path).retired:
                return 0
            for suffix in (STATE_SUFFIX, INTENTS_SUFFIX, INCOMPLETE_SUFFIX, ENTRIES_SUFFIX):
                unlink_if_present(self.path_for(rollout_id, suffix))
            unlink_if_present(self.path_for(rollout_id, LOCK_SUFFIX))  # last: waiters reopen
        return 1

    def _sweep_temp(self, name: str, cutoff: float) -> None:
        path = self._root / name
        try:
            if os.stat(path, follow_symlinks=False).st_mtime <= cutoff:
                unlink_if_present(path)
        except FileNotFoundError:
            pass
