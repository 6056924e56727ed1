"""The worker process that writes large lines: a dead worker costs at most the line it held."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from capture_core import CaptureStore
from capture_core.exceptions import CaptureStoreError
from capture_core.server.exchange import Exchange
from capture_core.server.large_lines import LargeLines


def exchange() -> Exchange:
    return Exchange("c" * 32, "chat", None, 1.0, [b'{"model":"m"}'], [b'{"id":"x","choices":[]}'],
                    status_code=200, completed_at=2.0, latency_ms=1.0)  # fmt: skip


class _DiesWhenUnpickled:
    """Kills the worker process that unpickles it (as the OOM killer would mid-line)."""

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return os._exit, (1,)


def test_a_worker_killed_while_idle_is_replaced(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path, create=True)
    lines = LargeLines()
    try:
        assert lines.write(store, "r", exchange(), None) > 0
        pool = lines._pool
        assert pool is not None
        for pid in list(pool._processes):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not pool._broken:  # the pool has noticed its worker is gone
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert lines.write(store, "r", exchange(), None) > 0
    finally:
        lines.close()
    assert len(store.read("r").entries) == 2


def test_a_worker_dying_on_a_line_fails_that_line_only(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path, create=True)
    lines = LargeLines()
    try:
        with pytest.raises(CaptureStoreError):
            lines.write(store, "r", _DiesWhenUnpickled(), None)  # type: ignore[arg-type]
        assert lines.write(store, "r", exchange(), None) > 0
    finally:
        lines.close()
    assert len(store.read("r").entries) == 1


def test_a_ctrl_c_at_the_terminal_leaves_the_worker_to_finish_its_line(tmp_path: Path) -> None:
    """SIGINT reaches the whole process group; it is the server's to handle (a graceful stop),
    and the worker must not die mid-append, tearing the line (was: KeyboardInterrupt)."""
    store = CaptureStore(tmp_path, create=True)
    lines = LargeLines()
    try:
        assert lines.write(store, "r", exchange(), None) > 0
        pool = lines._pool
        assert pool is not None
        (pid,) = pool._processes
        os.kill(pid, signal.SIGINT)
        time.sleep(1.0)
        assert lines._pool is pool and not pool._broken
        assert lines.write(store, "r", exchange(), None) > 0
        assert lines._pool is pool and list(pool._processes) == [pid]
    finally:
        lines.close()
