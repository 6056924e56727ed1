"""Ledger lines: encoding a committed call or a failure as one JSON line, and reading them back.

A line is one JSON object with sorted keys, compact separators and ASCII escapes. There are
three kinds, told apart by their keys:

* a custody row (has ``staging_key``): every :class:`CallRecord` column, except that the staged
  digest travels as ``staging_digest`` while ``digest`` holds the cumulative hash, plus the
  lineage keys ``fingerprint`` (the row's ``continuation_fingerprint``), ``staging_chain`` (the
  staging keys from the root to this call) and, when the caller gave the request items,
  ``context_len`` and ``context_digest``; ``capture_key`` only when set;
* a failure row: ``{"failure_reason": ..., "model_call_id": ...}``;
* a lineage-only row (no ``staging_key``, no ``failure_reason``), written by other writers of
  the format: it is kept for resolution but never listed in a manifest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from capture_core.exceptions import CaptureStoreError
from capture_core.staging.manifest import CallRecord, ManifestFailure
from capture_core.staging.reasons import LedgerFailureReason

__all__ = [
    "LedgerCorruptError",
    "LedgerRows",
    "encode_line",
    "failure_row",
    "manifest_parts",
    "parse_ledger",
    "record_from_row",
    "record_row",
]

_log = logging.getLogger("capture_core.lineage")

_RENAMED_IN: Final = {"digest": "staging_digest"}
_LINEAGE_ONLY_KEYS: Final = frozenset(
    {"fingerprint", "staging_chain", "context_len", "context_digest"}
)


class LedgerCorruptError(CaptureStoreError):
    """A ledger line that is not a readable row, with more lines after it.

    A torn last line (a writer that died mid-append) is not corruption: readers skip it.

    Attributes:
        path: the ledger file.
        line_number: 1-based line number.
        reason: what is wrong with the line.
    """

    def __init__(self, *, path: Path, line_number: int, reason: str) -> None:
        self.line_number = line_number
        self.reason = reason
        super().__init__(f"corrupt lineage ledger line {line_number}: {reason}", path=path)


def record_row(
    record: CallRecord,
    *,
    staging_chain: list[str],
    context_len: int | None,
    context_digest: str | None,
) -> dict[str, Any]:
    """The ledger row for a committed call (token-free)."""
    columns = record.model_dump(
        mode="json", exclude={"schema_version", "digest_version", "extras_digest_version"}
    )
    row: dict[str, Any] = {_RENAMED_IN.get(key, key): value for key, value in columns.items()}
    if row.get("capture_key") is None:
        row.pop("capture_key", None)
    row["digest"] = record.cumulative_hash
    row["fingerprint"] = record.continuation_fingerprint
    row["staging_chain"] = staging_chain
    if context_len is not None:
        row["context_len"] = context_len
        row["context_digest"] = context_digest
    return row


def failure_row(failure: ManifestFailure) -> dict[str, Any]:
    """The ledger row for a call that did not commit."""
    return {"failure_reason": failure.reason, "model_call_id": failure.model_call_id}


def encode_line(row: Mapping[str, Any]) -> bytes:
    """One ledger line, newline included."""
    return (json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n").encode("ascii")


def record_from_row(row: Mapping[str, Any]) -> CallRecord:
    """The manifest row for a custody row (raises ``ValidationError`` for a bad one)."""
    columns = {key: value for key, value in row.items() if key not in _LINEAGE_ONLY_KEYS}
    columns["digest"] = columns.pop("staging_digest", None)
    return CallRecord.model_validate(columns)


@dataclass(slots=True)
class LedgerRows:
    """A ledger read back: its rows in file order, and how many torn bytes ended it."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    torn_bytes: int = 0

    def find(self, model_call_id: str, *, failure: bool) -> list[dict[str, Any]]:
        """The rows of one call: its failure rows, or its other rows."""
        return [
            row
            for row in self.rows
            if row.get("model_call_id") == model_call_id and ("failure_reason" in row) == failure
        ]


def parse_ledger(data: bytes, path: Path) -> LedgerRows:
    """Parse a ledger's bytes; a torn last line is skipped and logged, any bad line raises.

    Raises:
        LedgerCorruptError: a complete line that is not a JSON object with a ``model_call_id``.
    """
    result = LedgerRows()
    *lines, tail = data.split(b"\n")
    if tail:  # no newline after it: a writer died mid-append, so the row was never committed
        result.torn_bytes = len(tail)
        _log.warning("ignoring a torn last line (%d bytes) in %s", len(tail), path)
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LedgerCorruptError(
                path=path, line_number=number, reason=f"not JSON: {exc}"
            ) from None
        if not isinstance(row, dict) or not isinstance(row.get("model_call_id"), str):
            reason = "not a JSON object with a model_call_id"
            raise LedgerCorruptError(path=path, line_number=number, reason=reason)
        result.rows.append(row)
    return result


def manifest_parts(
    ledger: LedgerRows, path: Path
) -> tuple[list[CallRecord], list[ManifestFailure]]:
    """Records and failures of a ledger, each call listed once, in ledger order.

    Raises:
        LedgerCorruptError: a custody row that is not a valid manifest row.
    """
    records: list[CallRecord] = []
    failures: list[ManifestFailure] = []
    seen_records: set[str] = set()
    seen_failures: set[tuple[str, str]] = set()

    def fail(call_id: str, reason: str) -> None:
        if (call_id, reason) not in seen_failures:
            seen_failures.add((call_id, reason))
            failures.append(ManifestFailure(model_call_id=call_id, reason=reason))

    for number, row in enumerate(ledger.rows, start=1):
        call_id = row["model_call_id"]
        if "failure_reason" in row:
            fail(call_id, str(row["failure_reason"]))
        elif "staging_key" not in row or call_id in seen_records:
            continue
        elif not row.get("response_id"):
            fail(call_id, LedgerFailureReason.LEDGER_ROW_MISSING_RESPONSE_ID)
        elif not row.get("chain_hash") or not row.get("cumulative_hash"):
            fail(call_id, LedgerFailureReason.LEDGER_ROW_MISSING_CHAIN_HASH)
        else:
            try:
                records.append(record_from_row(row))
            except ValidationError as exc:
                reason = f"not a valid call record: {exc.errors()[0]['msg']}"
                raise LedgerCorruptError(path=path, line_number=number, reason=reason) from None
            seen_records.add(call_id)
    return records, failures
