"""Appending a batch of lines: every file's lines written first, then each file made durable.

``fsync`` on ext4 and XFS commits the file system's journal, which carries the metadata of
every file written since the last commit: when 60 calls' lines are written to 60 files first
and then fsynced one file after another, the first ``fsync`` pays for most of the others.
Each file is still fsynced before any of its lines is reported written, so a line reported
written is durable whatever the file system. A file's lines are written under its exclusive
lock, one ``write`` each, and the lock is held until the file is durable, and its name too:
the directory is fsynced, before any lock is released, when a file of the batch is new or
empty or this process has not yet made its name durable (its creator may have died first).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final

from capture_core._appending import Appended, PendingAppend, write_lines
from capture_core._spare import OUT_OF_DESCRIPTORS, Spare
from capture_core.appender.frames import Request
from capture_core.ids import is_capture_file_name

__all__ = ["FILES_PER_COMMIT", "Outcome", "append_batch", "fsync_directory"]

#: Files held open and locked at once by one batch (a larger batch is cut into several).
FILES_PER_COMMIT: Final = 64


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one request ended: where its line landed, or why it did not."""

    request: Request
    appended: Appended | None
    error: BaseException | None = None


def append_batch(
    root: str,
    requests: Sequence[Request],
    *,
    wait: bool,
    spare: Spare,
    synced: set[str],
) -> tuple[list[Outcome], list[list[Request]]]:
    """Append every request's line to its file in ``root``.

    Args:
        root: the capture directory.
        requests: in the order their lines go into each file.
        wait: wait for a file's lock; ``False`` leaves the requests of a file another process
            holds locked to the caller (returned as one group per file, untouched).
        spare: the descriptor given up to retry an open that found none left.
        synced: names whose directory entry this process made durable (updated).

    Returns:
        The outcome of every request not left over, and the groups left over.

    Raises:
        Exception: anything but an ``OSError`` (a bug): every file of the chunk being written
            is cut back and released first.
    """
    spare.ensure()
    groups: dict[str, list[Request]] = {}
    for request in requests:
        groups.setdefault(request.name, []).append(request)
    batch = _Batch(root, wait, spare, synced)
    try:
        todo = list(groups.values())
        while todo:
            chunk, todo = todo[:FILES_PER_COMMIT], todo[FILES_PER_COMMIT:]
            todo = batch.commit(chunk) + todo
    finally:
        batch.close()
    return batch.outcomes, batch.blocked


def fsync_directory(fd: int) -> None:
    """Make the directory ``fd`` names durable (its entries: new files' names)."""
    os.fsync(fd)


@dataclass
class _Batch:
    root: str
    wait: bool
    spare: Spare
    synced: set[str]
    outcomes: list[Outcome] = field(default_factory=list)
    blocked: list[list[Request]] = field(default_factory=list)
    #: The directory, opened before any file (so that syncing it needs no descriptor when
    #: the files took the last ones); ``None`` if it could not be opened.
    directory: int | None = None
    directory_error: OSError | None = None

    def __post_init__(self) -> None:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            self.directory = self.spare.retrying(partial(os.open, self.root, flags))
        except OSError as exc:  # new files' lines fail with it; others are fine
            self.directory_error = exc

    def close(self) -> None:
        if self.directory is not None:
            os.close(self.directory)
            self.directory = None

    def commit(self, groups: list[list[Request]]) -> list[list[Request]]:
        """Write, sync and release the files of ``groups``; the groups not reached (out of
        descriptors with files of this chunk open: they go in the next chunk, once those
        are closed)."""
        written: list[tuple[list[Request], PendingAppend]] = []
        try:
            for index, group in enumerate(groups):
                name = group[0].name
                if not is_capture_file_name(name):  # nothing else, and nowhere else
                    refused = OSError(errno.EINVAL, f"not a capture file name: {name!r}")
                    self.outcomes += [Outcome(request, None, refused) for request in group]
                    continue
                lines = [request.line for request in group]
                write = partial(write_lines, f"{self.root}/{name}", lines, wait=self.wait)
                try:
                    pending = self.spare.retrying(write)
                except BlockingIOError:
                    self.blocked.append(group)
                    continue
                except OSError as exc:
                    if exc.errno in OUT_OF_DESCRIPTORS and written:
                        self._sync_and_release(written)
                        return groups[index:]
                    self.outcomes += [Outcome(request, None, exc) for request in group]
                    continue
                written.append((group, pending))
            self._sync_and_release(written)
            return []
        finally:
            for _, pending in written:
                pending.abort()  # nothing for the files released already

    def _sync_and_release(self, written: list[tuple[list[Request], PendingAppend]]) -> None:
        durable: list[tuple[list[Request], PendingAppend, list[Appended]]] = []
        for group, pending in written:
            try:
                durable.append((group, pending, pending.sync()))
            except OSError as exc:  # cut back and released
                self.outcomes += [Outcome(request, None, exc) for request in group]
        # A name must be durable too before a line of its file is reported written.
        new = {g[0].name for g, p, _ in durable if p.empty_before or g[0].name not in self.synced}
        failed: OSError | None = None
        if new:
            try:
                if self.directory is None:
                    raise self.directory_error or OSError(errno.EBADF, "no directory")
                fsync_directory(self.directory)
            except OSError as exc:
                failed = exc
            else:
                self.synced.update(new)
        for group, pending, appended in durable:
            if failed is not None and group[0].name in new:
                pending.abort()
                self.outcomes += [Outcome(request, None, failed) for request in group]
            else:
                pending.release()
                self.outcomes += [Outcome(r, a) for r, a in zip(group, appended, strict=True)]
        written.clear()
