"""A capture directory's identity: a random id in ``<dir>/.ngcapture-store-id``.

The capture server creates it when it starts (if missing) and reports it on
``GET /ngcapture/health``; a collector reads the id from the directory it was given and compares
it with the server's, so a collector and a server that disagree about where captures go are
caught before the first task, even when the two see the directory under different mount
points.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from pathlib import Path
from typing import Final

from capture_core._locking import fsync_dir, os_reason, write_all
from capture_core.exceptions import CaptureStoreError

__all__ = ["STORE_ID_FILE", "ensure_store_id", "read_store_id"]

STORE_ID_FILE: Final = ".ngcapture-store-id"
_ID: Final = re.compile(r"^[0-9a-f]{32}$")


def read_store_id(root: str | os.PathLike[str]) -> str | None:
    """The id of the capture directory ``root``, or ``None`` when it has none (yet).

    Raises:
        CaptureStoreError: the id file exists but is unreadable or not an id.

    Example:
        >>> read_store_id("/abs/results/model-calls")  # doctest: +SKIP
        '5d0f3c...'
    """
    path = Path(root) / STORE_ID_FILE
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CaptureStoreError(
            f"could not read the store id: {os_reason(exc)}", path=path
        ) from exc
    if not _ID.match(text):
        raise CaptureStoreError("the store id file does not hold an id", path=path)
    return text


def ensure_store_id(root: str | os.PathLike[str]) -> str:
    """The id of the capture directory ``root``, created (durably, atomically) when missing.

    Two servers starting at once agree: the id is written to a temporary file and linked into
    place, so the first link wins and the other reads the winner's id.

    Raises:
        CaptureStoreError: the id cannot be read or written.
    """
    directory = Path(root)
    found = read_store_id(directory)
    if found is not None:
        return found
    path = directory / STORE_ID_FILE
    temp = directory / f"{STORE_ID_FILE}.{uuid.uuid4().hex}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, uuid.uuid4().hex.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(temp, path)
        fsync_dir(directory)
    except OSError as exc:
        raise CaptureStoreError(
            f"could not write the store id: {os_reason(exc)}", path=path
        ) from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    winner = read_store_id(directory)
    if winner is None:  # removed between our link and our read
        raise CaptureStoreError("the store id vanished while it was created", path=path)
    return winner
