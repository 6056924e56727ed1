"""The write half of a captured call: its pending mark, its line, and what a failure leaves.

:class:`CallWrites` is a base of :class:`~capture_core.server.captured_call.CapturedCall`:
the mark is set when the call starts; when it ends, the line is built on the event loop and
handed to the server's appender process (:mod:`capture_core.appender`), or, for a middleware
without one, built and appended on a writer thread; lines of calls over
:data:`LARGE_LINE_BYTES` are built and written by a worker process. The write's future clears
the mark and counts the outcome, on the loop only. When the line cannot be written, the failure
goes to the process's failure log (opened at start-up, so it needs no new descriptor) and the
rollout is marked incomplete; when even that fails, the mark stays to say the call was lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from capture_core._locking import os_reason
from capture_core.exceptions import CaptureError, CaptureStoreError
from capture_core.facts_journal import journal_fields
from capture_core.outcome import classify_exception
from capture_core.pending import mark_pending, unmark_pending
from capture_core.records import CaptureFailure
from capture_core.server.exchange import Exchange
from capture_core.server.large_lines import LARGE_LINE_BYTES, append_exchange, encode_exchange
from capture_core.server.logs import RateLimitedLogger
from capture_core.store import DATA_SUFFIX, CaptureStore
from capture_core.writers import out_of_descriptors

if TYPE_CHECKING:
    from capture_core.appender import Appender
    from capture_core.server.middleware import CaptureMiddleware

__all__ = ["CallWrites"]

logger = logging.getLogger("capture_core.server.captured_call")  # one logger for the call
limited = RateLimitedLogger(logger)

T = TypeVar("T")


class CallWrites:
    """What a captured call writes (see the module's doc); the call sets these attributes."""

    owner: CaptureMiddleware
    store: CaptureStore
    rollout_id: str
    exchange: Exchange
    keep_mark: bool

    def _mark(self) -> None:
        writer = self.owner.writer
        if writer is not None:
            if not writer.mark(self.rollout_id, self.exchange.model_call_id):
                self.owner.counters.add("marker_failures")
            return
        call_id = self.exchange.model_call_id
        _guard(lambda: mark_pending(self.store.root, self.rollout_id, call_id), "mark it pending")

    def _start_write(self, failure: BaseException | None) -> asyncio.Future[int | None]:
        appender = self.owner.appender
        write: asyncio.Future[int | None]
        if appender is not None and self.exchange.size < LARGE_LINE_BYTES:
            write = self._send(appender, failure)
        else:
            write = self._in_thread(self._write, failure)
        write.add_done_callback(self._count)
        return write

    def _in_thread(self, action: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        threads = self.owner.executor
        if threads is not None:
            return threads.run(action, *args)
        return asyncio.get_running_loop().run_in_executor(None, action, *args)

    def _send(
        self, appender: Appender, failure: BaseException | None
    ) -> asyncio.Future[int | None]:
        """Build the line and hand it to the appender now (on its socket when this returns);
        the future gets the bytes written, or ``None`` when it failed (logged and recorded, on
        a writer thread)."""
        category = classify_exception(failure).value if failure is not None else None
        exchange = self.exchange
        try:
            name, payload, line = encode_exchange(self.store, self.rollout_id, exchange, category)
            sent: asyncio.Future[int] = appender.submit(name, payload, _journal_fields(line))
        except Exception as exc:
            return asyncio.ensure_future(self._answered(None, exc))
        return asyncio.ensure_future(self._answered(sent, None))

    async def _answered(
        self, sent: asyncio.Future[int] | None, error: Exception | None
    ) -> int | None:
        """The appender's answer, or the failure recorded (never raises)."""
        try:
            if sent is not None:
                return await sent
        except Exception as exc:
            error = exc
        assert error is not None  # either an answer or an error
        try:
            recorded = await self._in_thread(self._failed, error)
        except RuntimeError:  # the server's threads are gone (it is stopping): here, then
            recorded = self._failed(error)
        self.keep_mark = not recorded
        return None

    def _count(self, write: asyncio.Future[int | None]) -> None:
        """Count the write's outcome and clear the call's mark, on the event loop: counters and
        marks are only touched there, so the loop never waits for a lock a writer thread holds
        while it waits for the GIL."""
        counters = self.owner.counters
        written = None if write.cancelled() or write.exception() else write.result()
        if written is None:
            counters.bump(capture_failures=1, writes_outstanding=-1)
        else:
            counters.bump(calls_captured=1, bytes_written=written, writes_outstanding=-1)
        if not self.keep_mark:
            self._unmark()

    def _write(self, failure: BaseException | None) -> int | None:
        """Build and append the line (writer thread); the bytes written, or ``None`` when it
        failed (the failure is logged and recorded). Never raises."""
        category = classify_exception(failure).value if failure is not None else None
        large = self.owner.large_lines
        try:
            if large is not None and self.exchange.size >= LARGE_LINE_BYTES:
                # Parsing and encoding tens of MiB holds the GIL for a fifth of a second:
                # done in another process, so the other calls do not wait for it (which
                # parses the stream again rather than receive its events pickled).
                self.exchange.events = None
                written = large.write(self.store, self.rollout_id, self.exchange, category)
            else:
                written = self._append(self.exchange, category)
        except Exception as exc:
            # When nothing else on disk can say this call was lost, its mark stays to say so.
            self.keep_mark = not self._failed(exc)
            return None
        return written

    def _append(self, exchange: Exchange, category: str | None) -> int:
        writer = self.owner.writer
        try:
            appended, line = append_exchange(self.store, self.rollout_id, exchange, category)
        except CaptureStoreError as exc:
            if writer is None or not out_of_descriptors(exc):
                raise
            # Out of descriptors: free the spare one and try once more.
            appended, line = writer.with_spare_descriptor(
                lambda: append_exchange(self.store, self.rollout_id, exchange, category)
            )
        if writer is not None:
            writer.note_facts(f"{self.rollout_id}{DATA_SUFFIX}", appended, line)
        return appended.written

    def _failed(self, exc: Exception) -> bool:
        """Log and record a failed write; whether it is on disk (the failure log, or at least
        the rollout's incomplete marker)."""
        exchange, writer = self.exchange, self.owner.writer
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        reason = os_reason(cause) if isinstance(cause, OSError) else str(exc)
        limited.warning("capture-failed", "capture of call %s in rollout %s failed: %s",
                        exchange.model_call_id, self.rollout_id, reason)  # fmt: skip
        logged = False
        if writer is not None:
            failure = CaptureFailure(
                rollout_id=self.rollout_id, model_call_id=exchange.model_call_id,
                dialect=exchange.dialect, started_at=exchange.started_at, failed_at=time.time(),
                reason=reason, writer=writer.token,
            )  # fmt: skip
            logged = _guard(lambda: writer.record_failure(failure), "log the capture failure")
        marked = _guard(lambda: self.store.mark_incomplete(self.rollout_id), "mark it incomplete")
        return logged or marked

    def _unmark(self) -> None:
        writer, call_id = self.owner.writer, self.exchange.model_call_id
        if writer is not None:
            _guard(lambda: writer.unmark(self.rollout_id, call_id), "clear its marker")
        else:
            _guard(lambda: unmark_pending(self.store.root, self.rollout_id, call_id),
                   "clear its marker")  # fmt: skip


def _journal_fields(line: dict[str, Any]) -> bytes:
    """What the line's facts journal entry repeats of it (empty: no entry; a line the journal
    cannot encode is read from its bodies, like one without facts)."""
    try:
        return journal_fields(line) or b""
    except (TypeError, ValueError):
        return b""


def _guard(action: Callable[[], object], what: str) -> bool:
    """Capture bookkeeping must never break serving: failures are logged, not raised.
    Returns whether ``action`` succeeded."""
    try:
        action()
    except (OSError, CaptureError, ValueError) as exc:
        limited.warning(what, "could not %s: %s", what, exc)
        return False
    return True
