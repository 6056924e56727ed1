"""The collection's progress line on a terminal."""

from __future__ import annotations

import sys
import time
from typing import IO


class _Progress:
    """``\\r``-updated progress line on stderr, only when stderr is a terminal."""

    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        self._stream = stream or sys.stderr
        self._enabled = self._stream.isatty()
        self._total, self._ok, self._failed = total, 0, 0
        self._started = time.monotonic()

    def __enter__(self) -> _Progress:
        self._draw()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._enabled:
            self._stream.write("\n")
            self._stream.flush()

    def advance(self, *, ok: bool) -> None:
        self._ok += ok
        self._failed += not ok
        self._draw()

    def _draw(self) -> None:
        if not self._enabled:
            return
        done = self._ok + self._failed
        width = 30
        filled = width * done // self._total if self._total else width
        bar = "#" * filled + "." * (width - filled)
        elapsed = time.monotonic() - self._started
        self._stream.write(f"\rcollect [{bar}] {done}/{self._total} ok {self._ok} "
                           f"failed {self._failed} {elapsed:.0f}s")  # fmt: skip
        self._stream.flush()
