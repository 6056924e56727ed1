"""Rollout rows, their ids and resume attempts (clearing their capture before dispatch is
:mod:`~capture_core.collect.clearing`'s).

Every row to run is a task row plus ``_ng_task_index`` (its 0-based line in the input) and
``_ng_rollout_index`` (which repeat); :func:`~capture_core.ids.rollout_id_from_body` gives its
id. On resume, successes are the rows already in the output JSONL, keyed by (task, rollout),
and failures are counted from the sidecar ``<output stem>_failures.jsonl``: a row with ``k``
recorded failures is dispatched again as ``_ng_attempt_index = k`` (id suffix ``-a<k>``), so
its capture never mixes with an earlier attempt's, unless ``k`` reached the attempt cap.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from capture_core.exceptions import CaptureError
from capture_core.ids import (
    ATTEMPT_INDEX_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    rollout_id_from_body,
)

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "AttemptPlan",
    "BadLine",
    "CollectError",
    "JsonlRows",
    "ResumeState",
    "expand_rows",
    "failures_path",
    "load_resume_state",
    "plan_attempts",
    "read_jsonl_rows",
    "repair_torn_tail",
    "rollout_ids",
    "row_key",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS: Final = 3
FAILURES_SUFFIX: Final = "_failures.jsonl"

RowKey = tuple[int, int]
Row = dict[str, Any]


class CollectError(CaptureError):
    """A collection cannot start or go on as asked (bad configuration, clashing ids).

    Attributes:
        path: the file concerned, when there is one.
    """

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        self.path = path
        super().__init__(message if path is None else f"{message} ({path})")


@dataclass(frozen=True, slots=True)
class BadLine:
    """A JSONL line that is not a JSON object: its 1-based line number and what is wrong."""

    path: Path
    line_number: int
    reason: str


@dataclass(slots=True)
class JsonlRows:
    """The object lines of a JSONL file: ``(0-based line index, row)`` pairs, and bad lines."""

    rows: list[tuple[int, Row]] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)


def read_jsonl_rows(path: Path) -> JsonlRows:
    """Read a JSONL file tolerantly: blank lines are skipped, other non-objects reported.

    A missing file reads as empty.

    Example:
        >>> read_jsonl_rows(Path("tasks.jsonl")).rows[0]  # doctest: +SKIP
        (0, {'id': 'mcqa-000', 'question': '...', 'options': {...}, 'answer': 'B'})
    """
    found = JsonlRows()
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return found
    for index, line in enumerate(content.split(b"\n")):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            found.bad.append(BadLine(path, index + 1, f"not valid JSON: {exc}"))
            continue
        if isinstance(value, dict):
            found.rows.append((index, value))
        else:
            found.bad.append(BadLine(path, index + 1, f"not a JSON object: {type(value).__name__}"))
    return found


def failures_path(output: Path) -> Path:
    """The failures sidecar of an output file: ``<dir>/<stem>_failures.jsonl``.

    Example:
        >>> failures_path(Path("/r/rollouts.jsonl"))
        PosixPath('/r/rollouts_failures.jsonl')
    """
    return output.with_name(output.stem + FAILURES_SUFFIX)


def expand_rows(tasks: Iterable[tuple[int, Mapping[str, Any]]], num_repeats: int) -> list[Row]:
    """One row per task and repeat, stamped with ``_ng_task_index`` and ``_ng_rollout_index``.

    Example:
        >>> [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in expand_rows([(4, {})], 2)]
        [(4, 0), (4, 1)]
    """
    if num_repeats < 1:
        raise CollectError(f"num_repeats must be at least 1, got {num_repeats}")
    rows: list[Row] = []
    for task_index, task in tasks:
        for repeat in range(num_repeats):
            rows.append({**task, TASK_INDEX_KEY: task_index, ROLLOUT_INDEX_KEY: repeat})
    return rows


def row_key(row: Mapping[str, Any]) -> RowKey | None:
    """The (task, rollout) key of a row, or ``None`` when it lacks integer indices.

    Example:
        >>> row_key({"_ng_task_index": 3, "_ng_rollout_index": 1})
        (3, 1)
    """
    task, rollout = row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY)
    if type(task) is int and type(rollout) is int:
        return task, rollout
    return None


@dataclass(slots=True)
class ResumeState:
    """What an earlier run left: finished keys, failure attempts per key, unreadable lines."""

    successes: set[RowKey] = field(default_factory=set)
    failures: Counter[RowKey] = field(default_factory=Counter)
    bad: list[BadLine] = field(default_factory=list)


def load_resume_state(output: Path) -> ResumeState:
    """Read the output file and its failures sidecar to know what is done and what failed.

    Example:
        >>> load_resume_state(Path("/r/rollouts.jsonl")).successes  # doctest: +SKIP
        {(0, 0), (0, 1)}
    """
    state = ResumeState()
    for path, target in ((output, state.successes), (failures_path(output), None)):
        read = read_jsonl_rows(path)
        state.bad += read.bad
        for index, row in read.rows:
            key = row_key(row)
            if key is None:
                state.bad.append(BadLine(path, index + 1, "no integer task and rollout indices"))
            elif target is not None:
                target.add(key)
            else:
                state.failures[key] += 1
    return state


def repair_torn_tail(path: Path) -> None:
    """Cut a partial last line (a kill mid-write) so the next append starts on a new line.

    The cut is logged with its size; the whole lines before it are never touched.

    Example:
        >>> repair_torn_tail(Path("/r/rollouts.jsonl"))  # doctest: +SKIP
    """
    try:
        with path.open("rb+") as handle:
            data = handle.read()
            if not data or data.endswith(b"\n"):
                return
            keep = data.rfind(b"\n") + 1
            logger.warning("cutting a torn last line of %d bytes from %s", len(data) - keep, path)
            handle.truncate(keep)
            handle.flush()
            os.fsync(handle.fileno())
    except FileNotFoundError:
        return


@dataclass(slots=True)
class AttemptPlan:
    """Which rows run now (attempt stamped), which are finished, which used up their attempts."""

    dispatch: list[Row] = field(default_factory=list)
    finished: list[RowKey] = field(default_factory=list)
    exhausted: list[RowKey] = field(default_factory=list)


def plan_attempts(
    rows: Sequence[Mapping[str, Any]],
    state: ResumeState | None = None,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> AttemptPlan:
    """Decide what to run: skip finished rows, stamp ``_ng_attempt_index`` on retried ones.

    A row with ``k`` recorded failures runs as attempt ``k`` (the first attempt is never
    stamped, so it keeps the bare id); a row with ``k >= max_attempts`` is not run again.

    Example:
        >>> state = ResumeState(failures=Counter({(0, 0): 1}))
        >>> plan_attempts([{"_ng_task_index": 0, "_ng_rollout_index": 0}], state).dispatch
        [{'_ng_task_index': 0, '_ng_rollout_index': 0, '_ng_attempt_index': 1}]
    """
    state = state or ResumeState()
    plan = AttemptPlan()
    for row in rows:
        key = row_key(row)
        if key is None:
            raise CollectError(f"a row to dispatch has no task and rollout indices: {row!r:.200}")
        attempts = state.failures[key]
        if key in state.successes:
            plan.finished.append(key)
        elif attempts >= max_attempts:
            plan.exhausted.append(key)
        else:
            stamped = dict(row)
            stamped.pop(ATTEMPT_INDEX_KEY, None)
            if attempts > 0:
                stamped[ATTEMPT_INDEX_KEY] = attempts
            plan.dispatch.append(stamped)
    return plan


def rollout_ids(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The rollout-attempt id of every row; raises if a row has none or two rows share one.

    Example:
        >>> rollout_ids([{"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": 1}])
        ['2-0-a1']
    """
    ids: list[str] = []
    seen: set[str] = set()
    for row in rows:
        rollout_id = rollout_id_from_body(row)
        if rollout_id is None:
            raise CollectError(f"cannot derive a rollout id from row {row!r:.200}")
        if rollout_id in seen:
            raise CollectError(
                f"two rows would run as rollout {rollout_id!r}; explicit _ng_rollout_id values "
                "must be unique and cannot be combined with num_repeats > 1"
            )
        seen.add(rollout_id)
        ids.append(rollout_id)
    return ids
