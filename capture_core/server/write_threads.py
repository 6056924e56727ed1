"""Threads that append capture lines and hand each result straight back to the event loop.

The standard library's way (``loop.run_in_executor`` on a ``ThreadPoolExecutor``) costs about
80 µs of hand-offs per call on this project's 2-core machine: the executor's work item and
idle-thread semaphore, then ``asyncio.wrap_future`` chaining a concurrent future to an asyncio
one through two more callbacks. A call held until its line is durable pays that on top of the
``fsync``. Here a job is one tuple on a ``queue.SimpleQueue`` (C, one lock), and the thread that
ran it resolves the caller's asyncio future with one ``call_soon_threadsafe``: about 20 µs for
both hand-offs (``python -m benchmarks --only proxy`` shows what it does per call).

Semantics are the executor's: jobs run in the order queued, on up to ``threads`` threads (one
more started with each job until there are that many); a job whose future was cancelled
meanwhile still runs (a capture line must land even when its request was cancelled) and its
result is dropped; ``shutdown`` lets queued jobs finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["WriteThreads"]

T = TypeVar("T")

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


class WriteThreads:
    """Up to ``threads`` daemon threads running blocking jobs for one event loop's callers.

    Example:
        >>> pool = WriteThreads(4, name="ngcapture-write")
        >>> async def main():
        ...     return await pool.run(sum, (1, 2))
        >>> asyncio.run(main())
        3
        >>> pool.shutdown()
    """

    def __init__(self, threads: int, *, name: str) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self._max = threads
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(*args)``; the returned future (of the running loop) gets its result.

        Raises:
            RuntimeError: after :meth:`shutdown`, or outside a running event loop.
        """
        if self._closed:
            raise RuntimeError("cannot run new jobs after shutdown")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        # One more thread with each job until the limit: an idle thread costs only its stack,
        # and counting idle ones (a semaphore) would cost every call more than it saves.
        if len(self._threads) < self._max:
            self._start()
        return future

    def _start(self) -> None:
        with self._lock:
            if self._closed or len(self._threads) >= self._max:
                return
            thread = threading.Thread(
                target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        jobs = self._jobs
        while (job := jobs.get()) is not None:
            loop, future, fn, args = job
            result, error = None, None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, as an executor would
                error = exc
            # A closed loop raises RuntimeError: nobody is waiting for the result then.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, future, result, error)
            del job, future, result, error

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop taking jobs; the queued ones still run. ``wait``: join the threads."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        if wait:
            for thread in threads:
                thread.join()
