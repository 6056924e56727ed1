"""The watching loop: poll a growing run until told to stop."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ngcapture_viz.export.watch.live import LiveExport, PollResult

__all__ = ["watch"]


def watch(
    capture_dir: str | os.PathLike[str],
    rollouts: str | os.PathLike[str] | None = None,
    *,
    interval: float = 30.0,
    max_polls: int | None = None,
    stop: threading.Event | None = None,
    on_poll: Callable[[PollResult], object] | None = None,
    **options: Any,
) -> int:
    """Poll a growing run every ``interval`` seconds until ``stop`` is set (or ``max_polls``).

    A poll that had to leave rows for later (``behind``) is followed at once by the next.
    The W&B run it started is finished when it returns. ``options`` go to :class:`LiveExport`.

    Returns:
        The number of batches logged.

    Example:
        >>> stop = threading.Event()  # doctest: +SKIP
        >>> watch("run/model-calls", "run/rollouts.jsonl",  # doctest: +SKIP
        ...       project="rl", stop=stop)
    """
    stop = stop or threading.Event()
    logged = 0
    polls = 0
    with LiveExport(capture_dir, rollouts, **options) as live:
        while not stop.is_set() and (max_polls is None or polls < max_polls):
            result = live.poll()
            polls += 1
            logged += result.batch is not None
            if on_poll is not None:
                on_poll(result)
            if not result.behind:
                stop.wait(interval)
    return logged
