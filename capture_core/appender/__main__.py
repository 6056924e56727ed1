"""``python -m capture_core.appender FD ROOT TOKEN``: the capture server's appender process."""

import signal
import sys

# First of all: a Ctrl-C at the terminal while this process starts is the server's to handle.
for _sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_sig, signal.SIG_IGN)

from capture_core.appender.process import main  # noqa: E402

sys.exit(main())
