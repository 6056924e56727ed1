"""The collector's output files: whole JSON lines, appended under a lock, fsynced."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import orjson

from capture_core.collect.attempts import CollectError


class _Appender:
    """One JSON line per record, appended whole under a lock, flushed and fsynced."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None

    def __enter__(self) -> _Appender:
        self._file = self._path.open("ab")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def write(self, record: Mapping[str, Any]) -> None:
        """Raises TypeError (nothing written) if the record cannot be encoded as JSON."""
        line = orjson.dumps(
            record, default=str, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS
        )
        with self._lock:
            if self._file is None:
                raise CollectError("the output file is closed", path=self._path)
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
