"""Run blocking file work off the event loop (anyio: asyncio or trio, imported on first use)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["in_thread"]

T = TypeVar("T")


async def in_thread(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Await ``function(*args, **kwargs)`` run in a worker thread."""
    import anyio.to_thread  # ~40 ms: only servers and collectors that use async pay for it

    return await anyio.to_thread.run_sync(functools.partial(function, *args, **kwargs))
