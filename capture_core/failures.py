"""Read the failure logs of a capture directory: one line per call whose capture was lost.

Every capture server keeps ``<dir>/.failures/<writer>.jsonl`` (see
:mod:`capture_core.writers`). Readers turn its lines into per-call gaps
(``model_call_capture_failed``). A damaged line (a writer killed mid-line) is counted and
skipped, never raised.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from capture_core._lines import parse_capture
from capture_core.records import CaptureFailure, DamagedLine
from capture_core.writers import FAILURE_LOG_SUFFIX, FAILURES_DIR

__all__ = ["FailureLogs", "read_capture_failures"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class FailureLogs:
    """The failures recorded in a capture directory.

    Attributes:
        failures: every readable failure, in log order (logs sorted by name).
        damaged: unreadable lines, located.
    """

    failures: list[CaptureFailure] = field(default_factory=list)
    damaged: list[DamagedLine] = field(default_factory=list)

    def for_rollout(self, rollout_id: str, *, since: float | None = None) -> list[CaptureFailure]:
        """The failures of one rollout, optionally only those of calls started at ``since`` or
        later (the server's clock: a collector passes when it dispatched the attempt)."""
        return [
            f
            for f in self.failures
            if f.rollout_id == rollout_id
            and (since is None or f.started_at is None or f.started_at >= since)
        ]


def read_capture_failures(root: str | os.PathLike[str]) -> FailureLogs:
    """Read every failure log of the capture directory ``root`` (none: empty).

    Example:
        >>> read_capture_failures("/abs/model-calls").failures  # doctest: +SKIP
        [CaptureFailure(rollout_id='0-0', model_call_id='c0ffee', ...)]
    """
    directory = Path(root) / FAILURES_DIR
    result = FailureLogs()
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(FAILURE_LOG_SUFFIX))
    except FileNotFoundError:
        return result
    for name in names:
        path = directory / name
        try:
            content = path.read_bytes()
        except OSError as exc:
            logger.warning("could not read the capture failure log %s: %s", path, exc)
            continue
        entries, damaged = parse_capture(content, path)
        result.damaged += damaged
        for entry in entries:
            try:
                result.failures.append(CaptureFailure.model_validate(entry.data))
            except ValidationError as exc:
                result.damaged.append(
                    DamagedLine(path=str(path), line_number=entry.line_number,
                                call_index=entry.call_index, byte_offset=entry.byte_offset,
                                length=entry.length, reason=f"not a failure record: {exc}")
                )  # fmt: skip
    return result
