"""The capture server's appender: a process of its own that appends, fsyncs and journals lines.

The server builds each call's line on its event loop and sends it over a ``socketpair``; the
appender writes every line its socket holds to its file, makes each file durable (one file
system journal commit carries many of them), writes their facts journal entries, and answers.
The server holds the call's last response bytes until the answer says the line is durable, as
before; it never waits on a lock or a disk itself, and no writer thread competes with the event
loop for the GIL. ``python -m benchmarks --only proxy`` measures what this saves.

- :mod:`~capture_core.appender.frames`: the wire format.
- :mod:`~capture_core.appender.batch`: appending a batch (group commit).
- :mod:`~capture_core.appender.process`: the process (``python -m capture_core.appender``).
- :mod:`~capture_core.appender.client`: :class:`Appender`, the server's side.
"""

from capture_core.appender.batch import Outcome, append_batch
from capture_core.appender.client import Appender
from capture_core.appender.frames import Answer, FrameError, FrameReader, Request

__all__ = [
    "Answer",
    "Appender",
    "FrameError",
    "FrameReader",
    "Outcome",
    "Request",
    "append_batch",
]
