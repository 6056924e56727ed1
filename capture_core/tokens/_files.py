"""Byte-level work on one rollout's token files, done while the caller holds the rollout's lock.

The entries file holds one canonical JSON line per call. A line counts only once its newline
is written: a writer appends ``line + "\\n"`` in one write and fsyncs it before acknowledging,
so bytes after the last newline are a write that was cut short (a writer killed mid-append)
and never acknowledged. Such a *torn tail* is cut by the next writer, and skipped (with a
warning) by readers. Any other line that is not a valid entry cannot come from a writer of this
store: it is damage, and reading refuses the file rather than guess.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import orjson
from pydantic import ValidationError

from capture_core._locking import fsync_dir, write_all
from capture_core.exceptions import TokenEntryConflictError, TokenStoreDamagedError
from capture_core.tokens.entry import TokenEntry, entry_digest
from capture_core.tokens.state import TokenCaptureState

__all__ = [
    "ScannedLine",
    "TailIndex",
    "TailScan",
    "append_bytes",
    "file_size",
    "index_tail",
    "read_entries",
    "read_from",
    "read_id_lines",
    "scan_entries",
    "truncate_to",
    "unique_entries",
]

logger = logging.getLogger("capture_core.tokens")

_BLANK: Final = b" \t\r"
_OPEN: Final = os.O_CLOEXEC | os.O_NOFOLLOW
_FILE_MODE: Final = 0o644


@dataclass(frozen=True, slots=True)
class ScannedLine:
    """One entry line: the entry, its digest and the offset just past its newline."""

    entry: TokenEntry
    digest: str
    end: int


@dataclass(slots=True)
class TailScan:
    """The entry lines of a stretch of the entries file.

    Attributes:
        lines: the entries, in file order.
        end: the offset just past the last whole line (where a torn tail starts).
        torn: the length of the torn tail after ``end`` (0 when the stretch ends in a newline).
    """

    lines: list[ScannedLine] = field(default_factory=list)
    end: int = 0
    torn: int = 0


def scan_entries(data: bytes, *, base: int, path: Path) -> TailScan:
    """Parse ``data``, the bytes of the entries file from offset ``base`` on.

    Blank lines are skipped. Bytes after the last newline are reported as ``torn``.

    Raises:
        TokenStoreDamagedError: a newline-terminated line is not JSON, not an object, or not a
            valid :class:`TokenEntry` (a newer schema, mismatched lengths, ...).
    """
    scan = TailScan(end=base)
    position = 0
    while True:
        newline = data.find(b"\n", position)
        if newline < 0:
            break
        raw = data[position:newline].strip(_BLANK)
        if raw:
            entry = _entry(raw, base + position, path)
            scan.lines.append(ScannedLine(entry, entry_digest(raw), base + newline + 1))
        position = newline + 1
        scan.end = base + position
    scan.torn = len(data) - position
    return scan


def unique_entries(scan: TailScan, rollout_id: str) -> list[TokenEntry]:
    """The scanned entries, each call once; an identical repeated line is dropped.

    Raises:
        TokenEntryConflictError: one call has two different lines (``durable=True``).
    """
    seen: dict[str, str] = {}
    entries: list[TokenEntry] = []
    for line in scan.lines:
        call = line.entry.model_call_id
        known = seen.get(call)
        if known is None:
            seen[call] = line.digest
            entries.append(line.entry)
        elif known != line.digest:
            raise TokenEntryConflictError(rollout_id, call, durable=True)
    return entries


@dataclass(frozen=True, slots=True)
class TailIndex:
    """What indexing the tail found: whether the state changed, or the call whose new line
    conflicts with its indexed one (the state is then left as it was)."""

    changed: bool
    conflict: str | None = None


def index_tail(path: Path, state: TokenCaptureState) -> TailIndex:
    """Add the lines of ``path`` past ``state.indexed_size`` to ``state``'s digest index.

    A torn tail is cut (with a WARNING). The version grows by the lines recovered, unless the
    state is legacy (its whole index is rebuilt from offset 0).

    Raises:
        TokenStoreDamagedError: the index names bytes the file does not have, or a line is
            damaged.
    """
    size = file_size(path)
    start = 0 if state.legacy else state.indexed_size
    if start < 0 or start > size:
        raise TokenStoreDamagedError(
            f"Invalid token-capture index offset {start}: the entries file has {size} bytes",
            path=path,
        )
    if start == size and not state.legacy:
        return TailIndex(changed=False)
    scan = scan_entries(read_from(path, start), base=start, path=path)
    digests = {} if state.legacy else dict(state.entry_digests)
    recovered = 0
    for line in scan.lines:
        call = line.entry.model_call_id
        known = digests.get(call)
        if known is None:
            digests[call] = line.digest
            recovered += 1
        elif known != line.digest:
            return TailIndex(changed=False, conflict=call)
    if scan.torn:
        truncate_to(path, scan.end, what="token entry line")
    if not state.legacy:
        state.version += recovered
    state.entry_digests, state.indexed_size, state.legacy = digests, scan.end, False
    return TailIndex(changed=True)


def read_entries(path: Path, rollout_id: str) -> list[TokenEntry]:
    """Every entry of ``path`` in file order, each call once; a torn tail is skipped with a
    WARNING (only a writer may cut it).

    Raises:
        TokenStoreDamagedError: a line is damaged.
        TokenEntryConflictError: one call has two different lines.
    """
    scan = scan_entries(read_from(path, 0), base=0, path=path)
    if scan.torn:
        logger.warning(
            "skipped a torn last line (%d bytes, a write that never completed) in %s",
            scan.torn,
            path,
        )
    return unique_entries(scan, rollout_id)


def _entry(raw: bytes, offset: int, path: Path) -> TokenEntry:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TokenStoreDamagedError(
            f"the token entry line at byte {offset} is not JSON ({exc})", path=path
        ) from exc
    if not isinstance(value, dict):
        raise TokenStoreDamagedError(
            f"the token entry line at byte {offset} is not a JSON object", path=path
        )
    try:
        return TokenEntry.model_validate(value)
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: {e['msg']}" for e in exc.errors()[:3]
        )
        raise TokenStoreDamagedError(
            f"the token entry line at byte {offset} is not a valid TokenEntry "
            f"(ValidationError: {errors})",
            path=path,
        ) from exc


def file_size(path: Path) -> int:
    """The size of ``path``; 0 when it does not exist."""
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0


def read_from(path: Path, offset: int) -> bytes:
    """The bytes of ``path`` from ``offset`` to its end; ``b""`` when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
    except FileNotFoundError:
        return b""
    try:
        chunks: list[bytes] = []
        while chunk := os.pread(fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def truncate_to(path: Path, size: int, *, what: str) -> None:
    """Cut a torn tail: shorten ``path`` to ``size`` bytes and fsync it; log a warning."""
    fd = os.open(path, os.O_WRONLY | _OPEN)
    try:
        cut = os.fstat(fd).st_size - size
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    logger.warning(
        "cut a torn %s (%d bytes, a write that never completed) from %s", what, cut, path
    )


def append_bytes(path: Path, data: bytes, *, torn: int = 0) -> int:
    """Append ``data`` and fsync; cut ``torn`` bytes first. Returns the new size.

    A failed write is cut back, so no half line stays behind; the directory is fsynced when the
    file is created.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, _FILE_MODE)
        created = True
    except FileExistsError:
        fd, created = os.open(path, os.O_WRONLY | _OPEN), False
    try:
        size = os.fstat(fd).st_size
        if torn:
            size -= torn
            os.ftruncate(fd, size)
            logger.warning(
                "cut a torn line (%d bytes, a write that never completed) from %s", torn, path
            )
        try:
            os.lseek(fd, size, os.SEEK_SET)
            write_all(fd, data)
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # we hold the lock: every byte past size is ours
            raise
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)
    return size + len(data)


def read_id_lines(path: Path) -> tuple[list[str], int]:
    """The newline-terminated lines of an id file (intents, incomplete marks) and the length
    of its torn tail."""
    data = read_from(path, 0)
    end = data.rfind(b"\n") + 1
    lines = data[:end].decode("utf-8", errors="replace").split("\n")[:-1] if end else []
    return lines, len(data) - end
