"""Lines of huge calls are built and written in another process.

Turning a 50 MiB request into its capture line means parsing it (to know it is a JSON object)
and encoding the line: about 150 ms during which a C extension holds the GIL, so every other
call of the server waits. Calls whose bodies weigh :data:`LARGE_LINE_BYTES` or more are handed
to a worker process of the standard library's ``ProcessPoolExecutor`` instead: the server only
pickles the bytes over (a copy) and waits, without the GIL, for the number of bytes appended.
The worker appends through the same :class:`~capture_core.store.CaptureStore` code, so locking,
``fsync`` and torn-tail handling are the same. The pool starts on the first large line; a
worker that dies (killed for its memory, say) costs at most the line it was writing, and the
next line gets a new pool.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Final

from capture_core._appending import Appended
from capture_core.exceptions import CaptureStoreError, LineEncodingError
from capture_core.server.exchange import Exchange
from capture_core.store import CaptureStore

__all__ = ["LARGE_LINE_BYTES", "LargeLines", "append_exchange", "encode_exchange"]

LARGE_LINE_BYTES: Final = 8 * 1024 * 1024


def encode_exchange(
    store: CaptureStore, rollout_id: str, exchange: Exchange, failure: str | None
) -> tuple[str, bytes, dict[str, Any]]:
    """The exchange's capture file name, its line encoded, and the line (a mapping); bodies
    too deep to encode again are kept as raw text.

    Raises:
        InvalidRolloutIdError: the rollout id is invalid.
        LineEncodingError: not even the raw-text line encodes.
    """
    line = exchange.line(failure)
    try:
        return *store.encode(rollout_id, line), line
    except LineEncodingError:
        line = exchange.line(failure, objects=False)
        return *store.encode(rollout_id, line), line


def append_exchange(
    store: CaptureStore, rollout_id: str, exchange: Exchange, failure: str | None
) -> tuple[Appended, dict[str, Any]]:
    """Append the exchange's line (see :func:`encode_exchange`). Returns where it landed and
    the line as it was written (a mapping)."""
    name, payload, line = encode_exchange(store, rollout_id, exchange, failure)
    return store.append_encoded(name, payload), line


def _ignore_interrupts() -> None:
    """The worker's start: a Ctrl-C at the terminal (SIGINT to the whole process group) is the
    server's to handle; the worker finishes the line it is writing instead of tearing it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _append_in_worker(
    root: str, rollout_id: str, exchange: Exchange, failure: str | None
) -> tuple[int | None, str | None]:
    """Runs in the worker process: ``(bytes written, None)`` or ``(None, why not)`` (errors
    come back as text: a store error does not survive pickling whole)."""
    try:
        return append_exchange(CaptureStore(root), rollout_id, exchange, failure)[0].written, None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


class LargeLines:
    """A one-process pool writing large lines (started on first use, closed with the server)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def write(
        self, store: CaptureStore, rollout_id: str, exchange: Exchange, failure: str | None
    ) -> int:
        """Append the line from the worker process (blocks the calling thread).

        Raises:
            CaptureStoreError: the worker could not append it (the reason is in the message).
        """
        args = (str(store.root), rollout_id, exchange, failure)
        pool = self._current()
        try:
            future = pool.submit(_append_in_worker, *args)
        except BrokenProcessPool:  # its worker died since the last large line: start anew
            self._discard(pool)
            pool = self._current()
            future = pool.submit(_append_in_worker, *args)
        try:
            written, error = future.result()
        except BrokenProcessPool as exc:  # the worker died while writing this line
            self._discard(pool)
            raise CaptureStoreError(
                "the process writing a large capture line died", path=store.path_for(rollout_id)
            ) from exc
        if written is None:
            raise CaptureStoreError(
                f"could not append a large capture line: {error}", path=store.path_for(rollout_id)
            )
        return written

    def _current(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn: a fork of a threaded server could inherit a held lock.
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(
                    max_workers=1, mp_context=context, initializer=_ignore_interrupts
                )
            return self._pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        """Drop a broken pool (once, whichever thread sees it first)."""
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False)

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
