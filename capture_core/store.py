"""CaptureStore: one append-only JSON-lines file per rollout, safe across threads and processes.

Files in the store's directory::

    <rollout_id>.capture.jsonl       one JSON object per line, one line per captured model call
    <rollout_id>.capture.incomplete  empty marker: some call of the rollout failed to persist
    overwritten-<UTC time>/          earlier capture a collector moved aside (``--overwrite``)

Writers append each line whole under an exclusive ``flock`` on the data file and fsync it before
returning; readers hold a shared lock while they read, so they never see a live writer's half
line. A line torn by a writer that died mid-write is reported as damaged (never raised by a
tolerant read), and the next append starts on a new line so later records stay readable.
``clear`` unlinks a file while holding its exclusive lock and writers check, once they hold the
lock, that their descriptor still names the file at the path, so a straggling writer's line lands
in the new file instead of vanishing with the removed one.

Every method that takes a rollout id validates it before it touches the disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from capture_core._lines import (
    RawEntry,
    damaged_entry,
    damaged_error,
    parse_capture,
    paused_gc,
)
from capture_core._locking import fsync_dir, locked_fd, os_reason, read_locked, unlink_if_present
from capture_core._store_writes import StoreWrites
from capture_core.exceptions import (
    CaptureDirNotFoundError,
    CaptureStoreError,
    InvalidRecordError,
)
from capture_core.ids import DATA_SUFFIX, is_valid_rollout_id, validate_rollout_id
from capture_core.normalize import normalize_line
from capture_core.records import CaptureRecords, DamagedLine, ModelCallRecord

__all__ = [
    "ARCHIVE_PREFIX",
    "DATA_SUFFIX",
    "MARKER_SUFFIX",
    "CaptureRead",
    "CaptureStore",
    "RawEntry",
    "parse_capture",
    "paused_gc",
]

MARKER_SUFFIX: Final = ".capture.incomplete"
#: Folders of earlier capture moved aside by ``ngcapture collect --overwrite`` (not rollouts).
ARCHIVE_PREFIX: Final = "overwritten-"


@dataclass(frozen=True, slots=True)
class CaptureRead:
    """The raw content of one rollout's capture file.

    Attributes:
        path: the capture file.
        entries: the readable lines, in file order.
        damaged: the unreadable lines, in file order.
        file_exists: whether the file existed when it was read.
    """

    path: Path
    entries: list[RawEntry]
    damaged: list[DamagedLine]
    file_exists: bool


class CaptureStore(StoreWrites):
    """The capture files of many rollouts in one directory.

    Reading never creates anything: a store opened without ``create=True`` needs its directory
    to exist. Writers (the capture server) pass ``create=True``.

    Args:
        root: the directory; a relative path resolves against the working directory.
        create: create the directory (and its parents) when missing (writers only).

    Raises:
        CaptureDirNotFoundError: ``root`` does not exist and ``create`` is false.
        CaptureStoreError: ``root`` exists and is not a directory, or cannot be created.

    Example:
        >>> store = CaptureStore("/tmp/captures", create=True)
        >>> store.record("3-2", {"model_call_id": "c1", "dialect": "chat"})
        40
        >>> [entry.data["model_call_id"] for entry in store.read("3-2").entries]
        ['c1']
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self._root = Path(root).resolve()
        self._root_text = str(self._root)
        if self._root.exists() and not self._root.is_dir():
            raise CaptureStoreError("the capture directory is not a directory", path=self._root)
        if create:
            try:
                self._root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CaptureStoreError(
                    f"could not create the capture directory: {os_reason(exc)}",
                    path=self._root,
                ) from exc
        elif not self._root.is_dir():
            raise CaptureDirNotFoundError(
                "the capture directory does not exist (readers never create it; the capture "
                "server does when it starts with it)",
                path=self._root,
            )

    def __repr__(self) -> str:
        return f"CaptureStore({str(self._root)!r})"

    @property
    def root(self) -> Path:
        """The store's directory, absolute.

        Example:
            >>> CaptureStore("/tmp/captures").root
            PosixPath('/tmp/captures')
        """
        return self._root

    def path_for(self, rollout_id: str) -> Path:
        """The data file of a rollout: ``<root>/<rollout_id>.capture.jsonl``.

        Example:
            >>> CaptureStore("/tmp/captures").path_for("3-2").name
            '3-2.capture.jsonl'
        """
        return self._root / f"{validate_rollout_id(rollout_id)}{DATA_SUFFIX}"

    def marker_path(self, rollout_id: str) -> Path:
        """The incomplete marker of a rollout: ``<root>/<rollout_id>.capture.incomplete``.

        Example:
            >>> CaptureStore("/tmp/captures").marker_path("3-2").name
            '3-2.capture.incomplete'
        """
        return self._root / f"{validate_rollout_id(rollout_id)}{MARKER_SUFFIX}"

    def read(self, rollout_id: str, *, strict: bool = False) -> CaptureRead:
        """Read the raw lines of a rollout's capture file.

        A missing file reads as empty. Blank lines are skipped and take no ``call_index``;
        every other line takes the next one, readable or not.

        Args:
            rollout_id: the rollout.
            strict: raise on the first damaged line instead of reporting it.

        Raises:
            InvalidRolloutIdError: the rollout id is invalid.
            DamagedLineError: ``strict`` and a line is not a JSON object.
            CaptureStoreError: the file exists but cannot be read.

        Example:
            >>> [entry.call_index for entry in store.read("3-2").entries]
            [0, 2]
        """
        path = self.path_for(rollout_id)
        try:
            content = read_locked(path)
        except OSError as exc:
            raise CaptureStoreError(
                f"could not read the capture file: {os_reason(exc)}", path=path
            ) from exc
        if content is None:
            return CaptureRead(path, [], [], file_exists=False)
        with paused_gc():
            entries, damaged = parse_capture(content, path)
        if strict and damaged:
            raise damaged_error(damaged[0])
        return CaptureRead(path, entries, damaged, file_exists=True)

    def read_records(self, rollout_id: str, *, strict: bool = False) -> CaptureRecords:
        """Read a rollout's capture as normalized records.

        A line that is valid JSON but not a capture line (a known field of the wrong type, say)
        is damaged too, and keeps its ``call_index``.

        Raises:
            InvalidRolloutIdError: the rollout id is invalid.
            DamagedLineError: ``strict`` and a line is not a readable record.
            CaptureStoreError: the file exists but cannot be read.

        Example:
            >>> [record.call_index for record in store.read_records("3-2").records]
            [0, 2]
        """
        raw = self.read(rollout_id)
        records: list[ModelCallRecord] = []
        damaged = list(raw.damaged)
        with paused_gc():
            for entry in raw.entries:
                try:
                    records.append(normalize_line(entry.data, entry.call_index))
                except InvalidRecordError as exc:
                    damaged.append(damaged_entry(raw.path, entry, exc.reason))
        damaged.sort(key=lambda line: line.call_index)
        if strict and damaged:
            raise damaged_error(damaged[0])
        return CaptureRecords(
            rollout_id=rollout_id,
            records=records,
            damaged=damaged,
            incomplete=self.is_incomplete(rollout_id),
            file_exists=raw.file_exists,
        )

    def clear(self, rollout_id: str) -> bool:
        """Remove a rollout's capture file and incomplete marker.

        The data file is unlinked under its exclusive lock, so a concurrent append either lands
        before the removal or goes to a new file, never to the removed one.

        Returns:
            Whether anything was removed.

        Raises:
            InvalidRolloutIdError: the rollout id is invalid.
            CaptureStoreError: a file exists but cannot be removed.

        Example:
            >>> store.clear("3-2"), store.clear("3-2")
            (True, False)
        """
        path = self.path_for(rollout_id)
        marker = self.marker_path(rollout_id)
        try:
            # Write access: on NFS, flock is emulated with POSIX locks, and an exclusive
            # POSIX lock needs a descriptor open for writing.
            with locked_fd(path, os.O_WRONLY, exclusive=True, create=False) as held:
                removed = held is not None and unlink_if_present(path)
            removed = unlink_if_present(marker) or removed
            if removed:
                fsync_dir(self._root)
        except OSError as exc:
            raise CaptureStoreError(
                f"could not clear the capture of rollout {rollout_id!r}: {os_reason(exc)}",
                path=Path(exc.filename) if isinstance(exc.filename, str) else path,
            ) from exc
        return removed

    def mark_incomplete(self, rollout_id: str) -> None:
        """Create a rollout's empty incomplete marker, durably. Idempotent.

        Raises:
            InvalidRolloutIdError: the rollout id is invalid.
            CaptureStoreError: the marker cannot be created.

        Example:
            >>> store.mark_incomplete("3-2"); store.is_incomplete("3-2")
            True
        """
        marker = self.marker_path(rollout_id)
        try:
            # O_NOFOLLOW: a symlink planted at the marker's path must not create a file elsewhere.
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(marker, flags, 0o644)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(self._root)
        except OSError as exc:
            raise CaptureStoreError(
                f"could not create the incomplete marker: {os_reason(exc)}", path=marker
            ) from exc

    def is_incomplete(self, rollout_id: str) -> bool:
        """Whether a rollout's incomplete marker exists.

        Example:
            >>> store.is_incomplete("3-2")
            False
        """
        return self.marker_path(rollout_id).exists()

    def exists(self, rollout_id: str) -> bool:
        """Whether a rollout has a capture file or an incomplete marker.

        Example:
            >>> store.exists("never-seen")
            False
        """
        return self.path_for(rollout_id).exists() or self.marker_path(rollout_id).exists()

    def rollout_ids(self) -> list[str]:
        """The sorted ids of the rollouts that have a capture file or a marker.

        Files whose names do not carry a valid rollout id are ignored.

        Raises:
            CaptureStoreError: the directory exists but cannot be listed.

        Example:
            >>> store.rollout_ids()
            ['3-1', '3-2']
        """
        try:
            names = os.listdir(self._root)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CaptureStoreError(
                f"could not list the capture store: {os_reason(exc)}", path=self._root
            ) from exc
        found: set[str] = set()
        for name in names:
            for suffix in (DATA_SUFFIX, MARKER_SUFFIX):
                stem = name.removesuffix(suffix)
                if stem != name and is_valid_rollout_id(stem):
                    found.add(stem)
        return sorted(found)
