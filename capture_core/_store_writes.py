"""The write half of :class:`~capture_core.store.CaptureStore`: a line encoded, then appended.

:class:`StoreWrites` is a base of ``CaptureStore``. A line is encoded as one line of JSON ending
in a newline (a :class:`~capture_core.records.RawCaptureLine` by its ``to_jsonl``, a mapping by
orjson) and appended to its rollout's file by :func:`capture_core._appending.append_line`:
whole, under the file's exclusive lock, fsynced before the lock is released. The two steps are
also methods of their own (:meth:`StoreWrites.encode`, :meth:`StoreWrites.append_encoded`) for
callers that encode in one place and append in another (the capture server).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from capture_core._appending import Appended, append_line
from capture_core._locking import os_reason
from capture_core.exceptions import CaptureStoreError, LineEncodingError
from capture_core.ids import DATA_SUFFIX, is_capture_file_name, validate_rollout_id
from capture_core.records import RawCaptureLine

__all__ = ["StoreWrites"]


class StoreWrites:
    """How a store appends lines (see the module's doc); ``CaptureStore`` sets these attributes."""

    _root: Path
    _root_text: str

    def record(self, rollout_id: str, line: RawCaptureLine | Mapping[str, Any]) -> int:
        """Append one line to a rollout's capture file and fsync it.

        A mapping is serialized with orjson; values it cannot encode natively (a ``Path``, say)
        are written as their ``str``. If the file ends in a line torn by a writer that died,
        a newline is written first so the new line stays readable.

        Returns:
            The number of bytes appended.

        Raises:
            InvalidRolloutIdError: the rollout id is invalid; nothing is touched.
            CaptureStoreError: the line cannot be serialized (nothing is written), or the disk
                refused it; the message names the file and the OS reason.

        Example:
            >>> store.record("3-2", {"model_call_id": "c1", "dialect": "chat"})
            40
        """
        return self.append(rollout_id, line).written

    def append(self, rollout_id: str, line: RawCaptureLine | Mapping[str, Any]) -> Appended:
        """``record``, telling where the line landed: its offset and the file's size, mtime
        and inode right after it (what the capture server's facts journal notes).

        Example:
            >>> store.append("3-2", {"model_call_id": "c2", "dialect": "chat"}).offset
            40
        """
        name, payload = self.encode(rollout_id, line)
        return self.append_encoded(name, payload)

    def encode(
        self, rollout_id: str, line: RawCaptureLine | Mapping[str, Any]
    ) -> tuple[str, bytes]:
        """The name of the file ``line`` goes to and the line encoded as :meth:`append` writes
        it (newline included); nothing is written.

        Raises:
            InvalidRolloutIdError: the rollout id is invalid.
            LineEncodingError: the line is not one line of JSON.

        Example:
            >>> store.encode("3-2", {"model_call_id": "c2"})
            ('3-2.capture.jsonl', b'{"model_call_id":"c2"}\\n')
        """
        name = f"{validate_rollout_id(rollout_id)}{DATA_SUFFIX}"
        return name, _serialize(line, f"{self._root_text}/{name}")

    def append_encoded(self, name: str, payload: bytes) -> Appended:
        """Append a line :meth:`encode` made to the file it named (see :meth:`append`).

        Raises:
            CaptureStoreError: the line could not be appended (nothing of it stays).
        """
        # A plain string path: building a Path costs more than the system calls it names.
        path = f"{self._root_text}/{name}"
        if not is_capture_file_name(name):
            raise CaptureStoreError(f"not a capture file name: {name!r}", path=self._root)
        try:
            appended = append_line(path, payload)
        except OSError as exc:
            raise CaptureStoreError(
                f"could not append a capture line: {os_reason(exc)}", path=Path(path)
            ) from exc
        return appended


def _serialize(line: RawCaptureLine | Mapping[str, Any], path: str | Path) -> bytes:
    """Encode one capture line as a single line of JSON ending in ``\\n``."""
    try:
        if isinstance(line, RawCaptureLine):
            payload = line.to_jsonl()
        elif isinstance(line, Mapping):
            obj = line if isinstance(line, dict) else dict(line)
            payload = orjson.dumps(obj, default=str, option=orjson.OPT_APPEND_NEWLINE)
        else:
            raise TypeError(f"a capture line must be a mapping, not {type(line).__name__}")
    except (TypeError, ValueError) as exc:
        raise LineEncodingError(
            f"could not serialize a capture line: {exc}", path=Path(path)
        ) from exc
    if payload.find(b"\n") != len(payload) - 1:
        raise LineEncodingError("a serialized capture line spans several lines", path=Path(path))
    return payload
