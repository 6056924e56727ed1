"""A staging sink and source on a POSIX directory: one checksummed, fsynced file per staged row.

Layout: the row staged under key ``k`` lives at ``<root>/<h[:2]>/<h>.stage`` where ``h`` is the
SHA-256 of ``k``'s UTF-8 bytes, so any key (``"<rollout_id>/<model_call_id>"`` included) maps
to a safe name and a row is found without an index. The file holds, in one piece::

    ngstage1 <sha256 of the header JSON> <header JSON>\\n
    <record JSON><attachment 1 bytes>...<attachment n bytes>

The header names the key and gives the length and SHA-256 of the record JSON and of each
attachment (sorted by name), so every byte of the file is covered by a checksum.

A write goes to a fresh temporary file in the row's directory, is fsynced, and is then
hard-linked into place: the link either creates the row whole or finds the key taken, so
several processes can stage into one root at once and a row never appears half written. The
directory is fsynced before ``stage`` returns. A taken key holding the identical bytes is a
successful no-op; any other content is a :class:`~capture_core.staging.StagingConflictError`.
The filesystem must support hard links (local filesystems, NFS and Lustre do).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from capture_core._locking import fsync_dir, os_reason, write_all
from capture_core.staging._stage_file import (
    CHUNK,
    Damage,
    Header,
    encode,
    first_error,
    read_checked,
    read_header,
)
from capture_core.staging.build import default_staging_key
from capture_core.staging.errors import StagingError
from capture_core.staging.records import StagedCallRecord, StagedCallSnapshot, StageResult
from capture_core.staging.sinks import (
    Attachments,
    StagedRowDamagedError,
    StagedRowNotFoundError,
    StagingConflictError,
    StagingWriteError,
    check_attachments,
)

__all__ = ["FilesystemStagingSink"]

_ROW_SUFFIX: Final = ".stage"
_TEMP_PREFIX: Final = ".tmp-"
_FILE_MODE: Final = 0o644


class FilesystemStagingSink:
    """Stages rows as files under ``root`` and reads them back; a sink and a source.

    Args:
        root: the directory; it is made absolute.
        fsync: fsync every row and its directory before ``stage`` returns. Turn it off only
            for benchmarks or throwaway data: without it a crash can lose staged rows.
        create: create the directory (and its parents) when missing.

    Raises:
        StagingError: ``root`` exists and is not a directory, or cannot be created.

    Example:
        >>> import tempfile
        >>> from capture_core.staging import build_staged_call_record
        >>> sink = FilesystemStagingSink(tempfile.mkdtemp())
        >>> record = build_staged_call_record(
        ...     rollout_id="r1", model_call_id="c1", prompt_token_ids=[1, 2, 3],
        ...     generated_token_ids=[4, 5], generated_logprobs=[-0.5, -0.25], weight_version=7,
        ... )
        >>> result = sink.stage(record, attachments={"pixels": b"\\x00\\x01"})
        >>> result.staging_key
        'r1/c1'
        >>> sink.fetch(["r1/c1"])[0].digest == record.digest
        True
        >>> sink.fetch_attachments("r1/c1")
        {'pixels': b'\\x00\\x01'}
    """

    def __init__(
        self, root: str | os.PathLike[str], *, fsync: bool = True, create: bool = True
    ) -> None:
        self._root = Path(root).resolve()
        self._fsync = fsync
        self._durable_dirs: set[str] = set()
        self._lock = threading.Lock()
        if self._root.exists() and not self._root.is_dir():
            raise StagingError(f"staging root is not a directory ({self._root})")
        if create:
            try:
                self._root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StagingError(
                    f"could not create the staging root: {os_reason(exc)} ({self._root})"
                ) from exc

    def __repr__(self) -> str:
        return f"FilesystemStagingSink({str(self._root)!r}, fsync={self._fsync})"

    @property
    def root(self) -> Path:
        """The sink's directory, absolute."""
        return self._root

    def path_for(self, staging_key: str) -> Path:
        """The file a key's row lives in: ``<root>/<h[:2]>/<h>.stage``, ``h`` = SHA-256 of the key.

        Example:
            >>> FilesystemStagingSink("/tmp/staging").path_for("r1/c1").name[:12]
            'b31c34b435b3'
        """
        if type(staging_key) is not str:
            raise TypeError(f"a staging key must be a str, got {type(staging_key).__name__}")
        name = hashlib.sha256(staging_key.encode("utf-8", "surrogatepass")).hexdigest()
        return self._root / name[:2] / f"{name}{_ROW_SUFFIX}"

    # --- writing ------------------------------------------------------------------------

    def stage(
        self, record: StagedCallRecord, *, attachments: Attachments | None = None
    ) -> StageResult:
        """Store ``record`` and its attachments in one durable file under its default key.

        Returns:
            ``ok`` with the key ``"<rollout_id>/<model_call_id>"``, once the row is durable.

        Raises:
            TypeError: ``record`` is not a ``StagedCallRecord``.
            InvalidAttachmentError: attachments that are not a mapping of names to bytes
                (checked before anything is written).
            StagingConflictError: the key already holds different content.
            StagingWriteError: the disk refused the write.
        """
        if not isinstance(record, StagedCallRecord):
            raise TypeError(f"stage() takes a StagedCallRecord, got {type(record).__name__}")
        blobs = check_attachments({} if attachments is None else attachments)
        key = default_staging_key(record.rollout_id, record.model_call_id)
        parts = encode(key, record.model_dump_json().encode("utf-8"), blobs)
        path = self.path_for(key)
        try:
            self._ensure_dir(path.parent)
            self._write_new(key, path, parts)
        except OSError as exc:
            raise StagingWriteError(key, f"could not stage: {os_reason(exc)}", path=path) from exc
        return StageResult(ok=True, staging_key=key)

    def _ensure_dir(self, directory: Path) -> None:
        """Create a row directory once, and make its entry in ``root`` durable."""
        if directory.name in self._durable_dirs:
            return
        with contextlib.suppress(FileExistsError):
            directory.mkdir()
        # Another process may have created it and died before syncing the root: sync anyway.
        if self._fsync:
            fsync_dir(self._root)
        with self._lock:
            self._durable_dirs.add(directory.name)

    def _write_new(self, key: str, path: Path, parts: list[bytes]) -> None:
        temp = path.with_name(f"{_TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(temp, flags, _FILE_MODE)
            try:
                for part in parts:
                    write_all(fd, part)
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temp, path, follow_symlinks=False)
            except FileExistsError:
                if not _holds(path, parts):
                    raise StagingConflictError(
                        key, "already holds a different row or different attachments"
                    ) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        if self._fsync:
            fsync_dir(path.parent)

    # --- reading ------------------------------------------------------------------------

    def fetch(self, keys: Sequence[str]) -> list[StagedCallSnapshot]:
        """One validated snapshot per key, in the order of ``keys``.

        Raises:
            TypeError: ``keys`` is a single string, or holds something other than strings.
            StagedRowNotFoundError: a key holds no row.
            StagedRowDamagedError: a row's bytes changed since it was staged, or it is not a
                valid staged row (its digest does not match, for instance).
        """
        checked = _checked_keys(keys)
        snapshots: list[StagedCallSnapshot] = []
        for key, raw in zip(checked, self.fetch_raw(checked), strict=True):
            try:
                snapshots.append(StagedCallSnapshot.model_validate_json(raw))
            except ValidationError as exc:
                reason = f"not a valid staged row: {first_error(exc)}"
                raise StagedRowDamagedError(key, reason) from exc
        return snapshots

    def fetch_raw(self, keys: Sequence[str]) -> list[bytes]:
        """Each key's record JSON exactly as staged, checked against its stored SHA-256.

        Raises:
            TypeError: ``keys`` is a single string, or holds something other than strings.
            StagedRowNotFoundError: a key holds no row.
            StagedRowDamagedError: the file's bytes changed since the row was staged.
        """
        rows: list[bytes] = []
        for key in _checked_keys(keys):
            with self._open_row(key) as (fd, header, offset):
                data = read_checked(key, fd, offset, header.record.length, header.record.sha256)
            rows.append(data)
        return rows

    def fetch_attachments(self, staging_key: str) -> dict[str, bytes]:
        """The attachments staged with a row, each checked against its stored SHA-256.

        Raises:
            StagedRowNotFoundError: the key holds no row.
            StagedRowDamagedError: the file's bytes changed since the row was staged.
        """
        (key,) = _checked_keys([staging_key])
        found: dict[str, bytes] = {}
        with self._open_row(key) as (fd, header, record_offset):
            position = record_offset + header.record.length
            for item in header.attachments:
                found[item.name] = read_checked(key, fd, position, item.length, item.sha256)
                position += item.length
        return found

    @contextlib.contextmanager
    def _open_row(self, key: str) -> Iterator[tuple[int, Header, int]]:
        """Open a row's file and check its header; yields the fd, header and record offset."""
        path = self.path_for(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StagedRowNotFoundError(key, "no row is staged under this key") from None
        except OSError as exc:
            raise StagedRowDamagedError(key, f"cannot open {path}: {os_reason(exc)}") from exc
        try:
            yield (fd, *read_header(fd, key))
        except Damage as damage:
            raise StagedRowDamagedError(key, f"{damage} ({path})") from None
        except OSError as exc:  # EIO, or a directory where the row should be
            raise StagedRowDamagedError(key, f"cannot read {path}: {os_reason(exc)}") from exc
        finally:
            os.close(fd)


def _holds(path: Path, parts: list[bytes]) -> bool:
    """Whether the file at ``path`` holds exactly ``parts``, compared chunk by chunk."""
    expected = b"".join(parts) if len(parts) > 1 else parts[0]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # gone, or something that is not a row (a symlink): not our content
        return False
    try:
        if os.fstat(fd).st_size != len(expected):
            return False
        view = memoryview(expected)
        offset = 0
        while offset < len(view):
            chunk = os.pread(fd, CHUNK, offset)
            if not chunk or chunk != view[offset : offset + len(chunk)]:
                return False
            offset += len(chunk)
        return True
    finally:
        os.close(fd)


def _checked_keys(keys: Sequence[str]) -> list[str]:
    if isinstance(keys, str | bytes):
        raise TypeError("keys must be a sequence of staging keys, not a single string")
    checked = list(keys)
    for key in checked:
        if type(key) is not str:
            raise TypeError(f"a staging key must be a str, got {type(key).__name__}")
    return checked
