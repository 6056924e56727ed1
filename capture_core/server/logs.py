"""Logging that cannot flood: per-message rate limits, and a periodic one-line summary.

A server under stress (out of descriptors, an upstream down) can hit the same failure
thousands of times a second; each one logged with a traceback would fill the disk. Here each
kind of message is logged at most :data:`BURST` times per :data:`WINDOW_S` seconds, and when a
window closes with messages held back, one line says how many.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Final

__all__ = ["BURST", "WINDOW_S", "RateLimitFilter", "RateLimitedLogger", "install_rate_limit"]

BURST: Final = 5
WINDOW_S: Final = 60.0


class _Budget:
    """How many messages of each kind may still go out in the current window (thread-safe)."""

    def __init__(self, burst: int, window_s: float) -> None:
        self.burst, self.window_s = burst, window_s
        self._lock = threading.Lock()
        self._windows: dict[object, tuple[float, int, int]] = {}

    def take(self, key: object) -> tuple[bool, int]:
        """Whether a message of kind ``key`` may go out, and how many were held back before it
        (reported once, when a new window opens)."""
        now = time.monotonic()
        with self._lock:
            start, sent, held = self._windows.get(key, (now, 0, 0))
            if now - start >= self.window_s:
                self._windows[key] = (now, 1, 0)
                return True, held
            if sent < self.burst:
                self._windows[key] = (start, sent + 1, held)
                return True, 0
            self._windows[key] = (start, sent, held + 1)
            return False, 0


class RateLimitedLogger:
    """A logger wrapper: at most ``burst`` messages per key per window.

    Example:
        >>> limited = RateLimitedLogger(logging.getLogger("x"))
        >>> limited.warning("disk", "could not write %s", "a.jsonl")
    """

    def __init__(self, logger: logging.Logger, *, burst: int = BURST, window_s: float = WINDOW_S):
        self.logger = logger
        self._budget = _Budget(burst, window_s)

    def _log(self, level: int, key: str, msg: str, args: tuple[Any, ...], exc: bool) -> None:
        allowed, held = self._budget.take(key)
        if not allowed:
            return
        if held:
            msg += f" ({held} similar message(s) held back in the last {self._budget.window_s:g} s)"
        self.logger.log(level, msg, *args, exc_info=exc)

    def warning(self, key: str, msg: str, *args: Any) -> None:
        self._log(logging.WARNING, key, msg, args, exc=False)

    def exception(self, key: str, msg: str, *args: Any) -> None:
        """An error with its traceback, rate-limited like the others (behind a
        :class:`RateLimitFilter`, only the first message of a kind ever shows its traceback)."""
        self._log(logging.ERROR, key, msg, args, exc=True)


class RateLimitFilter(logging.Filter):
    """A handler filter: the same message (logger, template) at most ``burst`` times a window;
    its traceback only the first time it passes in the life of the process."""

    def __init__(self, *, burst: int = BURST, window_s: float = WINDOW_S) -> None:
        super().__init__()
        self._budget = _Budget(burst, window_s)
        self._traced: set[object] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        allowed, held = self._budget.take(key)
        if not allowed:
            return False
        if held:
            record.msg = f"{record.msg} ({held} similar message(s) held back)"
        if record.exc_info and key in self._traced:
            record.exc_info, record.exc_text = None, None
        elif record.exc_info:
            self._traced.add(key)
        return True


def install_rate_limit(*logger_names: str) -> RateLimitFilter:
    """Put one :class:`RateLimitFilter` on every handler of the root logger and of
    ``logger_names`` (uvicorn's loggers have handlers of their own)."""
    rate_limit = RateLimitFilter()
    for name in ("", *logger_names):
        for handler in logging.getLogger(name or None).handlers:
            if not any(isinstance(f, RateLimitFilter) for f in handler.filters):
                handler.addFilter(rate_limit)
    return rate_limit
