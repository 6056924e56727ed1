"""Errors raised by ``ngcapture_viz``.

Every error the package raises on purpose derives from :class:`VizError`::

    VizError
    ├── SourceError          (also a ValueError)  a capture directory or rollout file is unusable
    │   └── DamagedSourceError                    strict=True met damaged evidence   .gaps
    ├── PayloadUnavailableError (also a KeyError) the payload of a call cannot be read
    ├── CaptureIndexError                         the sidecar index cannot be read or written
    ├── MissingExtraError    (also ImportError)   an optional dependency is not installed
    ├── ExportError                               an export (W&B, Parquet) was refused
    └── RegressionError      (also AssertionError) a checkpoint diff crossed its gate

One warning category: :class:`RolloutFileWarning` (a ``UserWarning``), issued when a rollout
file is not what it claims (not JSON lines, binary, lines that are not objects, empty); filter
it with ``warnings.filterwarnings("ignore"|"error", category=RolloutFileWarning)``.

Damaged evidence is never an exception by default: it becomes a row of ``run.gaps``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "CaptureIndexError",
    "DamagedSourceError",
    "ExportError",
    "MissingExtraError",
    "PayloadUnavailableError",
    "RegressionError",
    "RolloutFileWarning",
    "SourceError",
    "VizError",
]


class VizError(Exception):
    """Base class of the errors ``ngcapture_viz`` raises on purpose."""


class SourceError(VizError, ValueError):
    """A capture directory or rollout file cannot be used at all (missing, not a directory...)."""


class DamagedSourceError(SourceError):
    """``strict=True`` and the sources hold damaged or missing evidence.

    Attributes:
        gaps: the gap rows found, as dictionaries (code, rollout_id, path, line_number, detail).
    """

    def __init__(self, message: str, gaps: Sequence[dict[str, Any]]) -> None:
        self.gaps = list(gaps)
        super().__init__(message)


class PayloadUnavailableError(VizError, KeyError):
    """The payload of a call cannot be read (unknown id, attachment-only run, file rewritten)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CaptureIndexError(VizError):
    """The sidecar index cannot be written anywhere (neither beside the store nor in the cache)."""


class MissingExtraError(VizError, ImportError):
    """An optional dependency is missing; the message names the ``pip install`` that adds it."""


class ExportError(VizError):
    """An export was refused (for example a column outside the allowlist)."""


class RegressionError(VizError, AssertionError):
    """A checkpoint diff moved a metric past the allowed increase."""


class RolloutFileWarning(UserWarning):
    """A rollout file holds lines that are not rollout records, or none at all.

    The lines are still reported as gap rows; the warning says it once per file, with the
    counts and the first bad line, so the damage is seen before anyone opens the gap table.
    """
