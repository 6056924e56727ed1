"""Logs that cannot flood: rate limits per kind of message, one traceback per kind."""

from __future__ import annotations

import logging

import pytest

from capture_core.server import logs
from capture_core.server.logs import RateLimitedLogger, RateLimitFilter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(logs.time, "monotonic", fake)
    return fake


def test_a_burst_then_silence_then_a_count_of_what_was_held_back(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    limited = RateLimitedLogger(logging.getLogger("t.flood"), burst=3, window_s=60)
    with caplog.at_level(logging.WARNING, logger="t.flood"):
        for index in range(10_000):
            limited.warning("disk", "write %d failed", index)
        limited.warning("other", "another kind")  # its own budget
        clock.now += 61
        limited.warning("disk", "write again failed")
    messages = [record.getMessage() for record in caplog.records]
    assert messages[:3] == ["write 0 failed", "write 1 failed", "write 2 failed"]
    assert messages[3] == "another kind"
    assert messages[4] == "write again failed (9997 similar message(s) held back in the last 60 s)"
    assert len(messages) == 5


def test_the_handler_filter_limits_third_party_floods_and_drops_repeat_tracebacks(clock: Clock) -> None:  # fmt: skip
    rate_limit = RateLimitFilter(burst=2, window_s=60)
    passed = []
    for _ in range(1000):
        try:
            raise OSError(24, "Too many open files")
        except OSError as exc:
            record = logging.LogRecord("asyncio", logging.ERROR, __file__, 1,
                                       "socket.accept() out of system resource", (), (type(exc), exc, None))  # fmt: skip
        if rate_limit.filter(record):
            passed.append(record)
    assert len(passed) == 2
    assert passed[0].exc_info is not None and passed[1].exc_info is None
