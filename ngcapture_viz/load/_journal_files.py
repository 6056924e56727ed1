"""A directory's facts journals as files: which there are, where each ends (the marks an index
refresh records), their whole lines in chunks from a mark, and each chunk decoded line by line.
What the entries say about capture files is ``_journal``'s."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, Final

import msgspec

from capture_core.facts_journal import JOURNAL_DIR, JOURNAL_SUFFIX

__all__ = ["CHUNK_BYTES", "chunks_from", "decode_each", "journal_chunks", "journal_marks",
           "journal_paths", "mark_offset"]  # fmt: skip

#: Bytes of a journal read and decoded at once.
CHUNK_BYTES: Final = 32 * 1024 * 1024


def journal_paths(directory: str) -> list[str]:
    folder = os.path.join(directory, JOURNAL_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if n.endswith(JOURNAL_SUFFIX)]


def journal_marks(directory: str) -> dict[str, list[int]]:
    """Where each journal of ``directory`` ends now: its name → ``[inode, size]``."""
    marks: dict[str, list[int]] = {}
    for path in journal_paths(directory):
        try:
            stat = os.stat(path)  # as ``journal_chunks`` opens it (a link: its target)
        except OSError:
            continue
        marks[os.path.basename(path)] = [stat.st_ino, stat.st_size]
    return marks


def journal_chunks(path: str, since: Sequence[int] | None = None) -> Iterator[bytes]:
    """The journal's whole lines (a last one still being written is left out), read and
    given in chunks of about ``CHUNK_BYTES`` cut at newlines (a longer line is one chunk; a
    rest of up to half a chunk more is read with the chunk before it). ``since``: ``[inode,
    offset]`` of a mark; the lines from that offset when the journal is still that file and
    as long (else all of it), a line the offset falls inside skipped.

    Each chunk is read from a line's start (``pread`` from the end of the lines given so far),
    so no tail is carried over and joined to the next read: a journal of at most 1.5 chunks
    ending with a newline is one read and no copy. Only an empty read ends it (a read may
    return less than asked).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        yield from chunks_from(fd, since)
    finally:
        os.close(fd)


def chunks_from(fd: int, since: Sequence[int] | None) -> Iterator[bytes]:
    """``journal_chunks`` of a journal open as ``fd``."""
    try:
        start = mark_offset(fd, since)
        size = os.fstat(fd).st_size
    except OSError:
        return
    offset = start - 1 if start else 0  # from the byte before a mark: is it a line's start?
    skipping = bool(start)
    while True:
        left = size - offset
        length = max(CHUNK_BYTES, left) if left <= CHUNK_BYTES + CHUNK_BYTES // 2 else CHUNK_BYTES
        data = _pread(fd, length, offset)
        if not data:
            return  # the end (only an empty read says so: a read may return less than asked)
        if skipping:
            # The newline before the mark, or the end of the line the mark falls inside.
            newline = data.find(b"\n")
            if newline < 0:
                offset += len(data)
                continue
            data, offset, skipping = data[newline + 1 :], offset + newline + 1, False
        cut = data.rfind(b"\n") + 1
        if not cut:  # a line longer than the read, or one still being written
            whole = _to_newline(fd, data, offset + len(data))
            if whole is None:
                return  # no newline up to the end: an entry still being written
            data, cut = whole, whole.rfind(b"\n") + 1
        yield data if cut == len(data) else data[:cut]
        offset += cut


def _to_newline(fd: int, head: bytes, end: int) -> bytes | None:
    """``head`` and what follows it from ``end`` up to a read holding a newline (``None`` when
    the file ends first)."""
    parts = [head]
    while block := _pread(fd, CHUNK_BYTES, end):
        parts.append(block)
        end += len(block)
        if b"\n" in block:
            return b"".join(parts)
    return None


def _pread(fd: int, length: int, offset: int) -> bytes:
    """``os.pread``; an error reads as the end (what was read so far stands)."""
    try:
        return os.pread(fd, length, offset)
    except OSError:
        return b""


def mark_offset(fd: int, since: Sequence[int] | None) -> int:
    """The offset of the mark ``since`` in the open journal ``fd``: 0 without one, or when the
    journal was replaced (another inode) or cut shorter since."""
    if since is None:
        return 0
    stat = os.fstat(fd)
    inode, offset = since
    return offset if stat.st_ino == inode and 0 < offset <= stat.st_size else 0


def decode_each(decoder: msgspec.json.Decoder[Any], chunk: bytes) -> Sequence[Any]:
    """One value per line of ``chunk`` (``decode_lines``); when a line is bad (a torn entry)
    or blank (which ``decode_lines`` would skip), line by line, ``None`` for such lines."""
    try:
        found = decoder.decode_lines(chunk)
    except (msgspec.DecodeError, RecursionError):
        pass
    else:
        if len(found) == chunk.count(b"\n"):
            return found
    each: list[Any] = []
    for line in chunk.split(b"\n")[:-1]:
        try:
            each.append(decoder.decode(line) if line.strip() else None)
        except (msgspec.DecodeError, RecursionError):
            each.append(None)
    return each
