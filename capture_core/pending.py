"""Capture writes in flight, visible to every process that shares the capture directory.

A server marks each capture write as pending before it starts and unmarks it once the line is
durable (or its failure recorded): an empty file ``<dir>/.pending/<rollout_id>@<model_call_id>``.
``@`` cannot occur in a rollout id, so one rollout's markers never match another's. A collector
waits for a rollout's markers to go (:func:`wait_for_pending`) before it reads the rollout, and
reports the calls still pending after its drain timeout. A marker left by a server that died
mid-write stays, which is right: that call's evidence is missing.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Final

from capture_core.ids import validate_rollout_id

__all__ = [
    "PENDING_DIR",
    "all_pending_writes",
    "mark_pending",
    "pending_marker",
    "pending_writes",
    "unmark_pending",
    "wait_for_pending",
]

PENDING_DIR: Final = ".pending"
_SEPARATOR: Final = "@"


def _marker(root: Path, rollout_id: str, model_call_id: str) -> Path:
    validate_rollout_id(rollout_id)
    if not model_call_id.isalnum() or not model_call_id.isascii():
        raise ValueError(f"model_call_id must be ASCII letters and digits, got {model_call_id!r}")
    return pending_marker(root, rollout_id, model_call_id)


def pending_marker(root: Path, rollout_id: str, model_call_id: str) -> Path:
    """Where the pending marker of one call lives (it may or may not exist)."""
    return root / PENDING_DIR / f"{rollout_id}{_SEPARATOR}{model_call_id}"


def all_pending_writes(root: Path) -> list[tuple[str, str]]:
    """``(rollout_id, model_call_id)`` of every capture write still in flight, sorted.

    Example:
        >>> all_pending_writes(Path("/abs/results/model-calls"))  # doctest: +SKIP
        [('3-0', 'c0ffee')]
    """
    try:
        names = os.listdir(root / PENDING_DIR)
    except OSError:  # no directory (nothing pending) or unreadable: nothing to report
        return []
    found = []
    for name in sorted(names):
        rollout_id, sep, call_id = name.partition(_SEPARATOR)
        if sep:
            found.append((rollout_id, call_id))
    return found


def mark_pending(root: Path, rollout_id: str, model_call_id: str) -> None:
    """Record that the capture write of one call has started."""
    marker = _marker(root, rollout_id, model_call_id)
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        marker.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.close(fd)


def unmark_pending(root: Path, rollout_id: str, model_call_id: str) -> None:
    """Record that the capture write of one call has finished (landed or failed)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_marker(root, rollout_id, model_call_id))


def pending_writes(root: Path, rollout_id: str) -> list[str]:
    """The ``model_call_id`` of every capture write of ``rollout_id`` still in flight."""
    prefix = validate_rollout_id(rollout_id) + _SEPARATOR
    try:
        names = os.listdir(root / PENDING_DIR)
    except FileNotFoundError:
        return []
    return sorted(name[len(prefix) :] for name in names if name.startswith(prefix))


def wait_for_pending(
    root: Path, rollout_id: str, *, timeout_s: float, poll_s: float = 0.02
) -> list[str]:
    """Wait up to ``timeout_s`` for a rollout's writes to land; returns those still pending.

    Example:
        >>> wait_for_pending(Path("/abs/model-calls"), "0-0", timeout_s=5.0)  # doctest: +SKIP
        []
    """
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = pending_writes(root, rollout_id)
        if not remaining or time.monotonic() >= deadline:
            return remaining
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
