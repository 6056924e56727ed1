"""Before a collection runs: check, read the tasks, plan the attempts, make room.

Everything that can refuse the run is checked in :func:`_plan`, before :func:`_make_room`
touches any file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from capture_core.collect.attempts import (
    AttemptPlan,
    CollectError,
    expand_rows,
    load_resume_state,
    plan_attempts,
    read_jsonl_rows,
    repair_torn_tail,
    rollout_ids,
)
from capture_core.collect.clearing import CLEARED_DIR, clear_rollouts
from capture_core.collect.config import CollectConfig
from capture_core.collect.preflight import (
    ARCHIVE_PREFIX,
    archive_files,
    archive_folder,
    capture_collisions,
    check_output,
    check_server,
    run_ids_in,
    stamp_run_id,
    utc_stamp,
)
from capture_core.collect.summary import CollectSummary

logger = logging.getLogger(__name__)


def _plan(
    config: CollectConfig, source: Path, summary: CollectSummary
) -> tuple[list[Path], AttemptPlan, list[str]]:
    """Check the directories, the server and earlier data; read the tasks and plan the run."""
    dirs = [_capture_dir(d) for d in config.capture_dirs]
    if config.check_server:
        check_server(config.model_url, dirs)
    output = summary.output
    check_output(output, summary.failures, resume=config.resume, overwrite=config.overwrite)
    read = read_jsonl_rows(source)
    for bad in read.bad:
        logger.warning("skipping input line %d of %s: %s", bad.line_number, source, bad.reason)
    tasks = read.rows[: config.limit] if config.limit is not None else read.rows
    summary.tasks, summary.bad_input_lines = len(tasks), read.bad
    summary.run_id = _run_id(config, output)
    rows = expand_rows(tasks, config.num_repeats)
    if summary.run_id is not None:
        rows = [stamp_run_id(row, summary.run_id) for row in rows]
    state = load_resume_state(output) if config.resume else None
    plan = plan_attempts(rows, state, max_attempts=config.max_attempts)
    ids = rollout_ids(plan.dispatch)
    collisions = capture_collisions(dirs, ids) if not config.resume else {}
    if collisions and not config.overwrite:
        root, clashing = next(iter(collisions.items()))
        more = ", ..." if len(clashing) > 3 else ""
        raise CollectError(
            f"capture directory {root} already holds the capture of {len(clashing)} "
            f"rollout(s) this run would write ({', '.join(clashing[:3])}{more}): --resume "
            "continues that run, --overwrite moves them to a dated folder first, --run-id "
            "gives this run ids of its own (nothing was changed)"
        )
    summary.dispatched = len(plan.dispatch)
    summary.already_finished, summary.exhausted = len(plan.finished), len(plan.exhausted)
    return dirs, plan, ids


def _make_room(
    config: CollectConfig, summary: CollectSummary, dirs: list[Path], ids: list[str]
) -> None:
    """Start (or reopen) the output files and archive the capture of the ids about to run.

    ``overwrite`` moves earlier data into a dated ``overwritten-<UTC time>`` folder beside it;
    a resumed run's leftovers (rollouts killed mid-run, rerun under the same id) go to
    ``.cleared/``.
    """
    output, failures = summary.output, summary.failures
    stamp = utc_stamp()
    output.parent.mkdir(parents=True, exist_ok=True)
    if config.resume:
        for path in (output, failures):
            repair_torn_tail(path)
    else:
        if config.overwrite and (output.exists() or failures.exists()):
            folder = archive_folder(output.parent, stamp)
            archive_files([output, failures], folder)
            summary.archived.append(folder)
        for path in (output, failures):
            path.write_bytes(b"")
    if not dirs:
        return
    into = f"{ARCHIVE_PREFIX}{stamp}" if config.overwrite else CLEARED_DIR
    cleared = clear_rollouts(dirs, ids, wait_s=config.drain_timeout_s, into=into)
    summary.cleared_files, summary.cleared_still_pending = len(cleared.moved), cleared.pending_count
    if config.overwrite:
        summary.archived += sorted({path.parent for path in cleared.moved})


def _capture_dir(directory: str | os.PathLike[str]) -> Path:
    """An existing capture directory: a collector reads, it never creates one."""
    path = Path(directory)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise CollectError(
            f"capture directory {path} {what}: the capture server creates it when it starts "
            "with --capture-dir; pass the same directory to both"
        )
    return path


def _run_id(config: CollectConfig, output: Path) -> str | None:
    """The run id: the one a resumed output records, else the configured one."""
    if not config.resume or not output.exists():
        return config.run_id
    recorded = run_ids_in(output)
    if len(recorded) > 1:
        raise CollectError(
            f"{output} mixes several runs ({', '.join(sorted(map(str, recorded)))}); resume "
            "one run per output file"
        )
    found = next(iter(recorded), config.run_id)
    if recorded and config.run_id is not None and found != config.run_id:
        what = f"run id {found!r}" if found else "no run id"
        raise CollectError(
            f"{output} records {what}, not {config.run_id!r}: drop --run-id to resume it"
        )
    return found
