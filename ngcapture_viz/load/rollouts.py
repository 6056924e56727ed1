"""Read a rollout JSONL file: rollout ids, task fields, rewards and capture attachments.

Tolerant like the store reader: a line that is not a JSON object, a record without a rollout id,
a duplicated id or an unreadable attachment becomes a gap row with its line number; nothing is
dropped silently. ``strict=True`` (at the ``open_run`` level) turns gaps into an error.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from pydantic import ValidationError

from capture_core import (
    ATTACHMENT_KEY,
    InvalidRolloutIdError,
    ModelCallCaptureAttachment,
    paused_gc,
    rollout_id_from_body,
    split_attempt,
)
from ngcapture_viz.exceptions import RolloutFileWarning, SourceError
from ngcapture_viz.frames.gaps import AnalysisGap, GapRows
from ngcapture_viz.frames.tokens import compact_tokens
from ngcapture_viz.load.evidence import compact_evidence

__all__ = ["RolloutRecord", "RolloutSource", "read_rollouts"]

_TASK_ID_KEYS: Final = ("task_id", "id", "problem_id", "instance_id")
#: Keys never turned into task columns: payloads, capture evidence and internal fields.
_SKIPPED: Final = frozenset(
    {"response", "responses_create_params", "ng_trajectory", ATTACHMENT_KEY}
)


@dataclass
class RolloutRecord:
    """One readable rollout record of the file."""

    rollout_id: str
    line_number: int
    task_id: str | None
    task_index: int | None
    rollout_index: int | None
    attempt: int
    reward: float | None
    fields: dict[str, Any]
    attachment: ModelCallCaptureAttachment | None
    attachment_unreadable: bool = False
    #: The agent-side evidence, payload-free (``load.evidence.compact_evidence``).
    evidence: dict[str, Any] | None = None
    #: Token-id capture delivery, lengths only (``frames.tokens.compact_tokens``).
    tokens: dict[str, Any] | None = None


@dataclass
class RolloutSource:
    path: Path
    records: list[RolloutRecord] = field(default_factory=list)
    gaps: GapRows = field(default_factory=GapRows)
    lines: int = 0


def read_rollouts(path: str | os.PathLike[str]) -> RolloutSource:
    """Read every line of a rollout JSONL file.

    Raises:
        SourceError: the file does not exist or cannot be read at all.
    """
    file = Path(path).absolute()
    try:
        content = file.read_bytes()
    except FileNotFoundError:
        raise SourceError(f"rollout file {str(file)!r} does not exist") from None
    except IsADirectoryError:
        raise SourceError(f"rollout file {str(file)!r} is a directory") from None
    except OSError as exc:
        raise SourceError(f"rollout file {str(file)!r}: {exc.strerror}") from None
    source = RolloutSource(file)
    seen: dict[str, int] = {}
    offset = 0
    bad: list[tuple[int, str]] = []
    with paused_gc():
        for number, line in enumerate(content.split(b"\n"), start=1):
            start = offset
            offset += len(line) + 1
            if not line.strip(b" \t\r"):
                continue
            source.lines += 1
            problem = _read_line(source, line, number, start, seen)
            if problem is not None:
                bad.append((number, problem))
    _warn_if_not_rollouts(source, bad, binary=b"\x00" in content)
    return source


def _warn_if_not_rollouts(
    source: RolloutSource, bad: list[tuple[int, str]], *, binary: bool
) -> None:
    """One :class:`RolloutFileWarning` for a file that is empty or holds non-rollout lines."""
    if source.lines == 0:
        message = f"rollout file {source.path} is empty: it holds no rollout records"
    elif bad:
        number, problem = bad[0]
        kind = " (it looks binary, not JSON lines)" if binary else ""
        message = (
            f"rollout file {source.path}{kind}: {len(bad):,} of {source.lines:,} line(s) are not "
            f"rollout records; first at line {number}: {problem[:200]}"
        )
    else:
        return
    warnings.warn(message, RolloutFileWarning, stacklevel=3)


def _read_line(
    source: RolloutSource, line: bytes, number: int, offset: int, seen: dict[str, int]
) -> str | None:
    """Read one line into ``source``; returns what is wrong when it is not a rollout record."""
    where = {"path": str(source.path), "line_number": number, "byte_offset": offset}
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        source.gaps.add(
            AnalysisGap.ROLLOUT_LINE_DAMAGED, source="rollouts", detail=str(exc), **where
        )
        return f"not valid JSON ({exc})"
    if not isinstance(row, dict):
        detail = f"a JSON {type(row).__name__}, not an object"
        source.gaps.add(AnalysisGap.ROLLOUT_LINE_DAMAGED, source="rollouts", detail=detail, **where)
        return detail
    attachment, problem = _attachment(row)
    rollout_id, id_problem = _rollout_id(row, attachment)
    if rollout_id is None:
        source.gaps.add(
            AnalysisGap.ROLLOUT_WITHOUT_ID, source="rollouts", detail=id_problem, **where
        )
        return f"no rollout id ({id_problem})"
    if problem is not None:
        source.gaps.add(
            AnalysisGap.ATTACHMENT_UNREADABLE,
            source="rollouts",
            rollout_id=rollout_id,
            detail=problem,
            **where,
        )
    if rollout_id in seen:
        source.gaps.add(
            AnalysisGap.DUPLICATE_ROLLOUT,
            source="rollouts",
            rollout_id=rollout_id,
            detail=f"first seen on line {seen[rollout_id]}; the last record of this id is used",
            **where,
        )
    seen.setdefault(rollout_id, number)  # keep the first line: the detail names it
    parts = split_attempt(rollout_id)
    source.records.append(
        RolloutRecord(
            rollout_id=rollout_id,
            line_number=number,
            task_id=_task_id(row),
            task_index=_int(row.get("_ng_task_index")),
            rollout_index=_int(row.get("_ng_rollout_index")),
            attempt=parts.attempt,
            reward=_reward(row.get("reward")),
            fields={k: v for k, v in row.items() if _is_task_field(k, v)},
            attachment=attachment,
            attachment_unreadable=problem is not None,
            evidence=compact_evidence(row),
            tokens=compact_tokens(row),
        )
    )
    return None


def _attachment(row: Mapping[str, Any]) -> tuple[ModelCallCaptureAttachment | None, str | None]:
    value = row.get(ATTACHMENT_KEY)
    if value is None:
        return None, None
    try:
        return ModelCallCaptureAttachment.model_validate(value), None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or ATTACHMENT_KEY
        return None, f"{ATTACHMENT_KEY}.{where}: {first['msg']}"


def _rollout_id(
    row: Mapping[str, Any], attachment: ModelCallCaptureAttachment | None
) -> tuple[str | None, str]:
    if attachment is not None:
        return attachment.rollout_id, ""
    for holder in (row.get("ng_trajectory"), row):
        if isinstance(holder, Mapping) and isinstance(holder.get("rollout_id"), str):
            return holder["rollout_id"], ""
    try:
        derived = rollout_id_from_body(row)
    except InvalidRolloutIdError as exc:
        return None, str(exc)
    if derived is None:
        return None, "no ng_model_call_capture.rollout_id, rollout_id or _ng_task_index"
    return derived, ""


def _task_id(row: Mapping[str, Any]) -> str | None:
    trajectory = row.get("ng_trajectory")
    if isinstance(trajectory, Mapping) and isinstance(trajectory.get("task_id"), str):
        return str(trajectory["task_id"])
    for key in _TASK_ID_KEYS:
        value = row.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)
    index = row.get("_ng_task_index")
    return None if index is None else str(index)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reward(value: object) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _is_task_field(key: str, value: object) -> bool:
    if key in _SKIPPED or key.startswith("_ng_") or key == "reward":
        return False
    return value is None or isinstance(value, str | int | float | bool)
