"""The appender process: appends the capture server's lines and journals them, then answers.

Started by :class:`capture_core.appender.Appender` with one end of a ``socketpair``; it reads
request frames (:mod:`capture_core.appender.frames`) as they come, appends each batch the
socket holds (:func:`~capture_core.appender.batch.append_batch`), writes the facts journal
entries of the lines that landed, and answers every request, in one ``send`` per batch. A file
that another process holds locked (a reader, ``ngcapture clear``) is waited for on one of a few
threads, so it never holds up the other files' lines.

It runs until the server closes its end (or dies: the socket closes with it), finishing what it
was sent first; it ignores SIGINT and SIGTERM, which a terminal or a service manager sends to
the whole process group while the server is still draining its last calls. It imports no model,
dialect or web code, so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from capture_core._locking import os_reason
from capture_core._spare import Spare
from capture_core.appender.batch import Outcome, append_batch
from capture_core.appender.frames import Answer, FrameError, FrameReader, Request, encode_answer
from capture_core.journal_file import JournalFile, join_entry

__all__ = ["main", "serve"]

logger = logging.getLogger("capture_core.appender")

RECEIVE_BYTES: Final = 1 << 20
#: Threads that wait for files other processes hold locked.
WAITING_THREADS: Final = 4


class _Answers:
    """Journals the lines that landed and answers their requests (from any thread)."""

    def __init__(self, sock: socket.socket, journal: JournalFile) -> None:
        self._sock, self._journal = sock, journal
        self._lock = threading.Lock()

    def send(self, outcomes: list[Outcome]) -> None:
        entries: list[bytes] = []
        answers: list[bytes] = []
        for outcome in outcomes:
            request, appended, error = outcome.request, outcome.appended, outcome.error
            if appended is None:
                code = (error.errno if isinstance(error, OSError) else None) or 0
                answers.append(encode_answer(Answer(request.job, -1, code, _reason(error))))
                continue
            if request.fields and (entry := join_entry(request.name, appended, request.fields)):
                entries.append(entry)
            answers.append(encode_answer(Answer(request.job, appended.written)))
        # Entries describe durable lines only, and are written before the server hears of them.
        self._journal.write(b"".join(entries))
        with self._lock:
            self._sock.sendall(b"".join(answers))


def _reason(error: BaseException | None) -> str:
    if isinstance(error, OSError):
        return os_reason(error)
    # Not the file system's doing: a bug of ours, and the batch's lines may have landed.
    return f"appender error ({type(error).__name__}: {error}); the line may have landed"


def _append_or_fail(
    root: str, requests: list[Request], *, wait: bool, spare: Spare, synced: set[str]
) -> tuple[list[Outcome], list[list[Request]]]:
    """``append_batch``, whose every request is answered even if it raises (not an
    ``OSError``: those are per file): an appender that never answered would hold the calls
    until the server stops."""
    try:
        return append_batch(root, requests, wait=wait, spare=spare, synced=synced)
    except Exception as exc:
        logger.exception("appending a batch of %d line(s) failed", len(requests))
        return [Outcome(request, None, exc) for request in requests], []


def serve(sock: socket.socket, root: str, token: str, *, segment_bytes: int = 0) -> None:
    """Serve the server's requests on ``sock`` until it closes (see the module's doc).

    Raises:
        FrameError: the server sent bytes that are not a request frame.
        OSError: the socket failed.
    """
    journal = JournalFile(Path(root), token, segment_bytes=segment_bytes)
    answers = _Answers(sock, journal)
    spare = Spare()
    frames = FrameReader()
    synced: set[str] = set()  # names this process made durable in the directory

    def wait_for(group: list[Request]) -> None:
        outcomes = _append_or_fail(root, group, wait=True, spare=spare, synced=synced)[0]
        try:
            answers.send(outcomes)
        except OSError as exc:  # the socket: the server is gone, nobody to answer
            logger.warning("could not answer the capture server: %s", os_reason(exc))

    waiting = ThreadPoolExecutor(WAITING_THREADS, thread_name_prefix="ngcapture-appender-wait")
    try:
        while data := sock.recv(RECEIVE_BYTES):
            requests = frames.requests(data)
            if not requests:
                continue
            outcomes, blocked = _append_or_fail(
                root, requests, wait=False, spare=spare, synced=synced
            )
            answers.send(outcomes)
            for group in blocked:
                waiting.submit(wait_for, group)
    finally:
        waiting.shutdown(wait=True)
        journal.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m capture_core.appender")
    parser.add_argument("fd", type=int, help="this end of the socketpair")
    parser.add_argument("root", help="the capture directory")
    parser.add_argument("token", help="the server's writer token (names its facts journal)")
    parser.add_argument("--segment-bytes", type=int, default=0)
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="ngcapture appender: %(message)s")
    with socket.socket(fileno=args.fd) as sock:
        try:
            serve(sock, args.root, args.token, segment_bytes=args.segment_bytes)
        except FrameError as exc:
            logger.error("stopping: %s", exc)
            return 2
        except OSError as exc:
            logger.error("stopping: %s", os_reason(exc))
            return 1
    return 0


if __name__ == "__main__":  # pragma: no cover - run as python -m capture_core.appender
    sys.exit(main())
