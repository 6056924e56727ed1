"""The appender process seen from the capture server's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Final, cast

from capture_core.appender.frames import Answer, FrameReader, encode_request
from capture_core.exceptions import AppenderError

__all__ = ["RESTART_INTERVAL_S", "Appender"]

logger = logging.getLogger(__name__)

#: A new appender process starts at most this often (one that keeps dying is not a fork loop).
RESTART_INTERVAL_S: Final = 1.0
#: How long closing waits for the process to finish what it was sent.
CLOSE_TIMEOUT_S: Final = 30.0
#: After its socket closed, the process's exit code is looked for this many times, this often.
EXIT_POLLS: Final = 20
EXIT_POLL_S: Final = 0.025


class _Link(asyncio.Protocol):
    """One appender process and the socket to it; requests wait here for their answers."""

    def __init__(self, process: subprocess.Popen[bytes], root: Path) -> None:
        self.process, self.root = process, root
        self.transport: asyncio.Transport | None = None
        self.waiting: dict[int, tuple[asyncio.Future[int], str]] = {}
        self.frames = FrameReader()
        self.open = True
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.failing: asyncio.Future[None] | None = None  # failing the unanswered calls
        self.ending = False  # its input was ended: answers still come, no more requests go

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    @property
    def usable(self) -> bool:
        return (
            self.open
            and not self.ending
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def data_received(self, data: bytes) -> None:
        for answer in self.frames.answers(data):
            future, name = self.waiting.pop(answer.job, (None, ""))
            if future is None or future.done():
                continue
            if answer.written >= 0:
                future.set_result(answer.written)
            else:
                future.set_exception(_not_appended(answer, self.root / name))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False  # the next line goes to a new process
        waiting, self.waiting = self.waiting, {}
        if waiting:
            self.failing = asyncio.ensure_future(self._fail(list(waiting.values())))
        if not self.closed.done():
            self.closed.set_result(None)

    async def _fail(self, waiting: list[tuple[asyncio.Future[int], str]]) -> None:
        """Fail the unanswered calls, saying how the process ended (it closes its socket a
        moment before it can be reaped, so its exit code is waited for a little)."""
        for _ in range(EXIT_POLLS):
            if self.process.poll() is not None:
                break
            await asyncio.sleep(EXIT_POLL_S)
        code = self.process.returncode
        how = f"exited with code {code}" if code is not None else "closed its socket"
        for future, name in waiting:
            if not future.done():
                future.set_exception(AppenderError(
                    f"the appender process (pid {self.process.pid}) {how} before confirming "
                    "the line; it may have landed", path=self.root / name,
                ))  # fmt: skip

    def send(self, job: int, name: str, fields: bytes, line: bytes) -> asyncio.Future[int]:
        if not self.usable or self.transport is None:
            raise AppenderError("the appender process is gone", path=self.root / name)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        frame = encode_request(job, name, fields, line)
        self.waiting[job] = (future, name)
        self.transport.write(frame)
        return future


def _not_appended(answer: Answer, path: Path) -> AppenderError:
    error = AppenderError(f"could not append a capture line: {answer.reason}", path=path)
    if answer.errno:
        error.__cause__ = OSError(answer.errno, os.strerror(answer.errno))
    return error


class Appender:
    """The capture server's appender process (:mod:`capture_core.appender.process`): started on
    first use, started again after it dies, closed with the server.

    Args:
        root: the capture directory.
        token: the server's writer token (its facts journal is ``.facts/<token>.jsonl``).
        segment_bytes: journal bytes between runs of ``ngcapture compact`` (0: never).

    Example:
        >>> appender = Appender(Path("/tmp/calls"), "0f" * 16)  # doctest: +SKIP
        >>> await appender.append("0-0.capture.jsonl", b'{"a": 1}\\n', b"")  # doctest: +SKIP
        9
    """

    def __init__(self, root: Path, token: str, *, segment_bytes: int = 0) -> None:
        self.root = Path(root)
        self.token = token
        self.segment_bytes = segment_bytes
        #: Processes started so far (more than one: an earlier one died).
        self.starts = 0
        self._link: _Link | None = None
        self._starting: asyncio.Task[_Link] | None = None
        self._jobs = itertools.count(1)
        self._last_start = float("-inf")
        self._processes: list[subprocess.Popen[bytes]] = []
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The running process's id (``None`` before the first line or after it died)."""
        link = self._link
        return link.process.pid if link is not None and link.usable else None

    async def append(self, name: str, line: bytes, fields: bytes = b"") -> int:
        """Append ``line`` (encoded, newline included) to the capture file ``name`` and journal
        ``fields`` for it; the bytes written, once the line is durable.

        Raises:
            AppenderError: the line was not appended (with the appender's reason, an
                ``OSError`` as cause), or the process died before saying so.
        """
        self._refuse_after_close(name)
        link = self._link
        if link is None or not link.usable:
            link = await self.start()
        return await link.send(next(self._jobs), name, fields, line)

    def submit(self, name: str, line: bytes, fields: bytes = b"") -> asyncio.Future[int]:
        """:meth:`append`, with the line on the socket before this returns when the process
        runs (so the caller can do other work while it is appended).

        Raises:
            AppenderError: the server is stopping.
        """
        self._refuse_after_close(name)
        link = self._link
        if link is not None and link.usable:
            return link.send(next(self._jobs), name, fields, line)
        return asyncio.ensure_future(self.append(name, line, fields))

    def _refuse_after_close(self, name: str) -> None:
        if self._closed:
            raise AppenderError("the capture server is stopping: no more lines",
                                path=self.root / name)  # fmt: skip

    async def start(self) -> _Link:
        """The running process's link, starting a process when none runs.

        Raises:
            AppenderError: the process could not be started.
        """
        link = self._link
        if link is not None and link.usable:
            return link
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._spawn())
        return await asyncio.shield(self._starting)

    async def _spawn(self) -> _Link:
        loop = asyncio.get_running_loop()
        if (wait := self._last_start + RESTART_INTERVAL_S - loop.time()) > 0:
            await asyncio.sleep(wait)
        self._last_start = loop.time()
        self._processes = [process for process in self._processes if process.poll() is None]
        try:
            ours, theirs = socket.socketpair()
        except OSError as exc:
            raise AppenderError(f"could not start the appender process: {exc}",
                                path=self.root) from exc  # fmt: skip
        try:
            with theirs:
                process = subprocess.Popen(  # -P: nothing imported from the working directory
                    [sys.executable, "-P", "-m", "capture_core.appender", str(theirs.fileno()),
                     str(self.root), self.token, "--segment-bytes", str(self.segment_bytes)],
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                )  # fmt: skip
        except OSError as exc:
            ours.close()
            raise AppenderError(f"could not start the appender process: {exc}",
                                path=self.root) from exc  # fmt: skip
        try:
            _, link = await loop.create_unix_connection(lambda: _Link(process, self.root),
                                                        sock=ours)  # fmt: skip
        except OSError as exc:
            ours.close()  # the process reads EOF and exits; reaped with the others
            self._processes.append(process)
            raise AppenderError(f"could not talk to the appender process: {exc}",
                                path=self.root) from exc  # fmt: skip
        self._processes.append(process)
        self.starts += 1
        if self.starts > 1:
            logger.warning("appender process started again (pid %d)", process.pid)
        self._link = link
        return link

    async def aclose(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Take no more lines, tell the process so (end of its input) and wait, up to
        ``timeout_s``, for it to answer what it was sent and exit. A line it never answered
        fails as any line of a dead appender does."""
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        link, self._link = self._link, None
        if link is not None and link.transport is not None:
            if link.usable and link.transport.can_write_eof():
                link.ending = True
                link.transport.write_eof()  # its answers still come in until it exits
            else:
                link.transport.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(link.closed), timeout_s)
            if not link.closed.done():  # still answering: stop waiting, fail the rest
                link.transport.abort()
                await link.closed
            if link.failing is not None:
                await link.failing
        for process in self._processes:
            while process.poll() is None and loop.time() < deadline:
                await asyncio.sleep(0.01)
            if process.returncode is None:
                logger.warning("appender process %d still running after %g s",
                               process.pid, timeout_s)  # fmt: skip
            elif process.returncode != 0:
                logger.warning("appender process %d exited with code %d", process.pid,
                               process.returncode)  # fmt: skip
