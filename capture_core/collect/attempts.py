"""Rollout rows, their ids and resume attempts, and clearing their capture before dispatch.

Every row to run is a task row plus ``_ng_task_index`` (its 0-based line in the input) and
``_ng_rollout_index`` (which repeat); :func:`~capture_core.ids.rollout_id_from_body` gives its
id. On resume, successes are the rows already in the output JSONL, keyed by (task, rollout),
and failures are counted from the sidecar ``<output stem>_failures.jsonl``: a row with ``k``
recorded failures is dispatched again as ``_ng_attempt_index = k`` (id suffix ``-a<k>``), so
its capture never mixes with an earlier attempt's, unless ``k`` reached the attempt cap.

A collector killed mid-run records no failure for the rows it was running, so their retry reuses
the same id. That is why, before dispatch, the capture of exactly the ids about to run is
cleared: first their in-flight writes are waited for (bounded), then any capture file or
incomplete marker is moved, under the file's exclusive lock, to
``<dir>/.cleared/<id>.<unix-ns>.capture.jsonl`` (never deleted). A writer that was waiting for
the lock notices the move and appends to the new file instead, so no line vanishes; what was
moved and what was still pending is logged and counted.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from capture_core._locking import fsync_dir, locked_fd, os_reason
from capture_core.exceptions import CaptureError, CaptureStoreError
from capture_core.ids import (
    ATTEMPT_INDEX_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    rollout_id_from_body,
    validate_rollout_id,
)
from capture_core.pending import forget_lost, wait_for_pending
from capture_core.store import DATA_SUFFIX, MARKER_SUFFIX, CaptureStore

__all__ = [
    "CLEARED_DIR",
    "DEFAULT_MAX_ATTEMPTS",
    "AttemptPlan",
    "BadLine",
    "ClearReport",
    "CollectError",
    "JsonlRows",
    "ResumeState",
    "clear_rollouts",
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
CLEARED_DIR: Final = ".cleared"
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


@dataclass(slots=True)
class ClearReport:
    """What clearing did: the archived files (their new paths), the writes still pending (of
    running servers), and the calls of the archived attempts whose server died before their
    line landed (their marks are removed: the rerun does not inherit them)."""

    moved: list[Path] = field(default_factory=list)
    still_pending: dict[str, list[str]] = field(default_factory=dict)
    lost: dict[str, list[str]] = field(default_factory=dict)

    @property
    def pending_count(self) -> int:
        return sum(len(calls) for calls in self.still_pending.values())


def clear_rollouts(
    dirs: Sequence[str | os.PathLike[str]],
    ids: Sequence[str],
    *,
    wait_s: float,
    into: str = CLEARED_DIR,
) -> ClearReport:
    """Archive the existing capture of exactly ``ids`` in every directory, after their writes.

    Waits at most ``wait_s`` in all for the ids' in-flight writes, then moves each existing
    ``<id>.capture.jsonl`` and ``<id>.capture.incomplete`` to
    ``<dir>/<into>/<id>.<unix-ns>.<suffix>`` (``into`` is a folder name: ``.cleared`` for a
    resumed run's leftovers, a dated ``overwritten-...`` folder for ``--overwrite``). Writes
    still pending are reported (their markers stay, so the new attempt's attachment reports
    them too). Nothing else is touched.

    Raises:
        InvalidRolloutIdError: an id is invalid (checked before anything is touched).
        CaptureStoreError: a file exists but cannot be moved.

    Example:
        >>> clear_rollouts(["/abs/model-calls"], ["0-0", "0-1-a1"], wait_s=5).moved
        [PosixPath('/abs/model-calls/.cleared/0-0.1786032154120000000.capture.jsonl')]
    """
    for rollout_id in ids:
        validate_rollout_id(rollout_id)
    stores = [CaptureStore(directory) for directory in dirs if Path(directory).is_dir()]
    report = ClearReport()
    deadline = time.monotonic() + max(0.0, wait_s)
    for store in stores:
        for rollout_id in ids:
            left = max(0.0, deadline - time.monotonic())
            pending = wait_for_pending(store.root, rollout_id, timeout_s=left)
            if pending:
                lost = sorted(c.model_call_id for c in forget_lost(store.root, rollout_id))
                if lost:
                    report.lost.setdefault(rollout_id, []).extend(lost)
                if live := [call_id for call_id in pending if call_id not in lost]:
                    report.still_pending.setdefault(rollout_id, []).extend(live)
            report.moved += _archive(store, rollout_id, into)
    if report.moved:
        where = ", ".join(sorted({str(path.parent) for path in report.moved}))
        logger.info("archived %d earlier capture file(s) of the rollouts about to run into %s",
                    len(report.moved), where)  # fmt: skip
    if report.lost:
        named = sorted(report.lost.items())[:10]
        logger.warning(
            "%d call(s) of earlier attempts of %d rollout(s) about to run were lost when their "
            "capture server died: %s; their marks are removed, the rerun starts without them",
            sum(map(len, report.lost.values())), len(report.lost),
            ", ".join(f"{rid}: {' '.join(calls)}" for rid, calls in named),
        )  # fmt: skip
    if report.still_pending:
        logger.warning(
            "%d capture write(s) of %d rollout(s) about to run were still pending after %.1f s: "
            "%s; if they land, they land in the new attempt's file and its attachment says so",
            report.pending_count, len(report.still_pending), wait_s,
            ", ".join(sorted(report.still_pending)[:10]),
        )  # fmt: skip
    return report


def _archive(store: CaptureStore, rollout_id: str, into: str) -> list[Path]:
    """Move a rollout's capture file (under its lock) and marker into ``<root>/<into>/``."""
    moved: list[Path] = []
    data, marker = store.path_for(rollout_id), store.marker_path(rollout_id)
    cleared = store.root / into
    try:
        # Write access: on NFS an exclusive flock is emulated by a POSIX lock, which needs it.
        with locked_fd(data, os.O_WRONLY, exclusive=True, create=False) as held:
            if held is not None:
                moved.append(_move(data, cleared, rollout_id, DATA_SUFFIX))
        if marker.exists():
            moved.append(_move(marker, cleared, rollout_id, MARKER_SUFFIX))
        if moved:
            fsync_dir(cleared)
            fsync_dir(store.root)
    except OSError as exc:
        raise CaptureStoreError(
            f"could not archive the capture of rollout {rollout_id!r}: {os_reason(exc)}",
            path=Path(exc.filename) if isinstance(exc.filename, str) else data,
        ) from exc
    return moved


def _move(path: Path, cleared: Path, rollout_id: str, suffix: str) -> Path:
    cleared.mkdir(exist_ok=True)
    stamp = time.time_ns()
    while True:
        target = cleared / f"{rollout_id}.{stamp}{suffix}"
        if not target.exists():
            break
        stamp += 1
    os.rename(path, target)
    return target
