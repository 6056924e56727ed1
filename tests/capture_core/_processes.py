"""Helpers for the tests that run separate OS processes."""

from __future__ import annotations

import time
from typing import Any


def join_all(processes: list[Any], *, within_s: float) -> None:
    """Join every process within one shared bound, kill stragglers so none outlives the test,
    then check that each exited with 0."""
    deadline = time.monotonic() + within_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
    assert [p.exitcode for p in processes] == [0] * len(processes)
