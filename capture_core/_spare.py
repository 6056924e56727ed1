"""One descriptor held in reserve: given up to make room for one more ``open`` when a process
has run out of descriptors (``EMFILE``), so that a capture line, or its failure record, still
gets written. Shared by the capture server's writer and its appender process."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable
from typing import Final, TypeVar

__all__ = ["OUT_OF_DESCRIPTORS", "Spare"]

OUT_OF_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE})

T = TypeVar("T")


class Spare:
    """One descriptor kept open (``/dev/null``), closed to make room and opened again."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._lock = threading.Lock()
        self.ensure()

    def ensure(self) -> None:
        """Hold the spare again if it was given up (best effort)."""
        with self._lock:
            self._hold()

    def retrying(self, action: Callable[[], T]) -> T:
        """``action()``; when it fails for want of descriptors, once more with the spare given
        up (held again at the next :meth:`ensure`)."""
        try:
            return action()
        except OSError as exc:
            if exc.errno not in OUT_OF_DESCRIPTORS:
                raise
        with self._lock:
            self._give_up()
        return action()

    def freed(self, action: Callable[[], T]) -> T:
        """``action()`` with the spare given up meanwhile, held again after."""
        with self._lock:
            self._give_up()
            try:
                return action()
            finally:
                self._hold()

    def close(self) -> None:
        with self._lock:
            self._give_up()

    def _hold(self) -> None:
        if self._fd is None:
            with contextlib.suppress(OSError):
                self._fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def _give_up(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
