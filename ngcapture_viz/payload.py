"""One captured call read back from its capture file by byte offset (``CaptureRun.payload``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import orjson

from capture_core import InvalidRecordError, ModelCallRecord, normalize_line
from ngcapture_viz.exceptions import PayloadUnavailableError


def _read_payload(row: Mapping[str, Any]) -> ModelCallRecord:
    path, offset, length = row["path"], row["byte_offset"], row["line_bytes"]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        record = normalize_line(orjson.loads(data), row["call_index"])
    except (OSError, orjson.JSONDecodeError, InvalidRecordError) as exc:
        raise PayloadUnavailableError(
            f"could not read call {row['model_call_id']!r} at byte {offset} of {path}: {exc}; "
            "the file changed since the run was opened, open it again"
        ) from None
    if record.model_call_id != row["model_call_id"]:
        raise PayloadUnavailableError(
            f"byte {offset} of {path} no longer holds call {row['model_call_id']!r} "
            "(the file was rewritten); open the run again"
        )
    return record
