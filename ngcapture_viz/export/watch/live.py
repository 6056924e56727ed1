"""The live export: one poll opens the run, takes what is new, logs it as one batch to W&B and
remembers it in two phases, so a batch is never lost or logged twice across a crash."""

from __future__ import annotations

import logging
import os
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ngcapture_viz.exceptions import ExportError, RolloutFileWarning
from ngcapture_viz.export.wandb import WANDB_MAX_ROWS, _import_wandb
from ngcapture_viz.export.watch.batch import _checkpoint_step, _payload, _step, _tables
from ngcapture_viz.export.watch.new_rows import _new_calls, _new_rollouts
from ngcapture_viz.export.watch.state import _read_state, _State, _state_place, _write_state
from ngcapture_viz.run import CaptureRun, open_run

if TYPE_CHECKING:
    from wandb import Run

__all__ = ["LiveExport", "PollResult"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PollResult:
    """What one poll logged.

    Attributes:
        batch: the batch number logged (``None``: nothing new, nothing logged).
        step: the step the batch was logged at.
        calls, rollouts, gaps, tool_calls: rows logged per table.
        behind: more new rows than ``max_rows`` were waiting; the rest go in the next poll.
    """

    batch: int | None
    step: int | None
    calls: int = 0
    rollouts: int = 0
    gaps: int = 0
    tool_calls: int = 0
    behind: bool = False


class LiveExport:
    """Log a growing run's new calls and rollouts to a W&B run at each :meth:`poll`.

    Args:
        capture_dir: the capture store being written.
        rollouts: the rollout JSONL being written (optional: without it only calls are logged).
        project, entity, name: the W&B run to start when ``wandb_run`` is not given (resumed
            by id when the state file names one).
        wandb_run: log into this run instead (for example the training script's own run).
        state: the state file (default: ``<capture_dir>/.ngcapture-watch/<project>.json``, or
            the user cache when the store is read-only).
        label: the run's label (the ``run`` column).
        step_field: a rollout field holding the training step (for example ``"step"``).
        checkpoint: a checkpoint label whose trailing number is the step (``"ckpt-1200"``).
        extra_columns, payload_digests: as for :func:`~ngcapture_viz.export.export_to_wandb`.
        max_rows: rows per table and poll at most; the rest waits for the next poll.
        prefix: the key prefix of everything logged.

    Raises:
        ExportError: ``checkpoint`` has no trailing number, or the state file is unreadable.

    Example:
        >>> live = LiveExport("run/model-calls", "run/rollouts.jsonl",  # doctest: +SKIP
        ...                   project="rl")
        >>> live.poll().calls  # doctest: +SKIP
        120
        >>> live.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        capture_dir: str | os.PathLike[str],
        rollouts: str | os.PathLike[str] | None = None,
        *,
        project: str | None = None,
        entity: str | None = None,
        name: str | None = None,
        wandb_run: Run | None = None,
        state: str | os.PathLike[str] | None = None,
        label: str | None = None,
        step_field: str | None = None,
        checkpoint: str | None = None,
        extra_columns: Sequence[str] | None = None,
        payload_digests: bool = False,
        max_rows: int = WANDB_MAX_ROWS,
        prefix: str = "ngcapture",
    ) -> None:
        if max_rows < 1:
            raise ExportError(f"max_rows must be at least 1, not {max_rows}")
        self.capture_dir = Path(capture_dir).absolute()
        self.rollouts = Path(rollouts).absolute() if rollouts is not None else None
        self.label = label
        self.step_field = step_field
        self.checkpoint_step = _checkpoint_step(checkpoint) if checkpoint is not None else None
        self.extra_columns = list(extra_columns or ())
        self.payload_digests = payload_digests
        self.max_rows = max_rows
        self.prefix = prefix
        self._init = {"project": project, "entity": entity, "name": name}
        self._run = wandb_run
        self._started = False
        self._warned: set[str] = set()
        key = project or (wandb_run.project if wandb_run is not None else None) or "default"
        self.state_path = (
            Path(state).absolute() if state is not None else _state_place(self.capture_dir, key)
        )
        self._state = _read_state(self.state_path)

    # -- public ---------------------------------------------------------------------------

    def __enter__(self) -> LiveExport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(exit_code=1 if exc[0] is not None else 0)

    @property
    def wandb_run(self) -> Run | None:
        """The W&B run logged to (``None`` until the first poll that logs)."""
        return self._run

    @property
    def batches(self) -> int:
        """Batches logged so far, over every restart."""
        return self._state.batches

    def poll(self, *, step: int | None = None) -> PollResult:
        """Open the run (incrementally), log what is new, remember it.

        Args:
            step: the training step, when neither ``step_field`` nor ``checkpoint`` gives one.

        Returns:
            What was logged (``batch`` is ``None`` when nothing was new).
        """
        if self._state.pending is not None:  # a batch whose fate must be settled first
            self._target(_import_wandb())
        run = self._open()
        calls, files_after, calls_behind = _new_calls(run, self._state, max_rows=self.max_rows)
        rollouts, records_after, rollouts_behind = _new_rollouts(
            run, self._state, max_rows=self.max_rows
        )
        behind = calls_behind or rollouts_behind
        if calls.height == 0 and rollouts.height == 0:
            self._save_quietly(files_after, records_after)
            return PollResult(batch=None, step=self._state.step, behind=behind)
        wandb = _import_wandb()
        target = self._target(wandb)
        batch_step = _step(
            run,
            rollouts,
            step,
            state=self._state,
            step_field=self.step_field,
            checkpoint_step=self.checkpoint_step,
        )
        tables = _tables(
            run,
            calls,
            rollouts,
            extra_columns=self.extra_columns,
            payload_digests=self.payload_digests,
        )
        batch = self._state.batches + 1
        after = _State(**self._state.committed())
        after.run_id = target.id
        after.batches, after.step = batch, batch_step
        after.calls_logged += tables["calls"].height
        after.rollouts_logged += tables["rollouts"].height
        after.files, after.records = files_after, records_after
        # Phase one: say what is about to be logged. If the process dies before phase two, the
        # next start asks W&B whether this batch arrived (see _resolve_pending).
        self._state.pending = {"batch": batch, "state": after.committed()}
        _write_state(self.state_path, self._state)
        target.log(
            _payload(
                run,
                self._state,
                prefix=self.prefix,
                tables=tables,
                calls=calls,
                rollouts=rollouts,
                batch=batch,
                step=batch_step,
            )
        )
        after.pending = None
        self._state = after
        _write_state(self.state_path, after)
        return PollResult(
            batch=batch,
            step=batch_step,
            calls=tables["calls"].height,
            rollouts=tables["rollouts"].height,
            gaps=tables["gaps"].height,
            tool_calls=tables["tool_calls"].height,
            behind=behind,
        )

    def close(self, *, exit_code: int = 0) -> None:
        """Finish the W&B run if this export started it (a run passed in is left open)."""
        if self._started and self._run is not None:
            self._run.finish(exit_code=exit_code)
            self._started = False

    # -- what is new ----------------------------------------------------------------------

    def _open(self) -> CaptureRun:
        """The run as it stands, through the index's incremental path. A rollout file not
        written yet (missing or empty, as at the start of training) is left out; a warning
        about it is shown once, not at every poll."""
        rollouts = self.rollouts
        if rollouts is not None and (not rollouts.is_file() or rollouts.stat().st_size == 0):
            rollouts = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RolloutFileWarning)
            run = open_run(self.capture_dir, rollouts, label=self.label, progress=False)
        for warning in caught:
            text = str(warning.message)
            if text not in self._warned:
                self._warned.add(text)
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
        return run

    # -- W&B ------------------------------------------------------------------------------

    def _target(self, wandb: Any) -> Run:
        if self._run is None:
            run_id = self._state.run_id or uuid.uuid4().hex[:12]
            self._run = wandb.init(
                **self._init, id=run_id, resume="allow", job_type="ngcapture-watch"
            )
            self._started = True
        assert self._run is not None
        if self._state.run_id is not None and self._run.id != self._state.run_id:
            raise ExportError(
                f"{self.state_path} records what was logged to W&B run {self._state.run_id!r}, "
                f"not {self._run.id!r}: log to that run, or pass another state file"
            )
        self._run.define_metric(f"{self.prefix}/*", step_metric=f"{self.prefix}/step")
        self._resolve_pending()
        return self._run

    def _resolve_pending(self) -> None:
        """A batch handed to W&B before a crash: committed when W&B's summary shows it."""
        pending = self._state.pending
        if pending is None or self._run is None:
            return
        summary: Any = self._run.summary
        seen = summary.get(f"{self.prefix}/batch")
        if seen == pending["batch"]:
            self._state = _State(**pending["state"])
        else:
            logger.warning(
                "batch %s of %s may or may not have reached W&B before the watch stopped "
                "(W&B does not say: offline runs keep no summary); logging it again",
                pending["batch"],
                self.state_path,
            )
            self._state.pending = None
        _write_state(self.state_path, self._state)

    # -- state ----------------------------------------------------------------------------

    def _save_quietly(self, files: dict[str, list[Any]], records: dict[str, Any]) -> None:
        """Nothing new: keep file identities current (a replaced file noticed) if they moved."""
        if files != self._state.files or records != self._state.records:
            self._state.files, self._state.records = files, records
            _write_state(self.state_path, self._state)
