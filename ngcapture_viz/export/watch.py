"""Live export: follow a growing run and log only its new calls and rollouts to W&B.

While a run trains, its capture store and rollout file grow. :class:`LiveExport` opens the run at
each poll through the sidecar index's incremental path (only appended bytes are parsed), keeps
the rows it has not logged yet, and logs them, payload-free, as ``wandb.Table``s plus a few
per-batch numbers. What was logged is remembered in a small JSON state file, so a restarted
watch resumes where it stopped and logs nothing twice.

What "new" means:

* a **call** of the store is new when its file has not been logged up to its ``call_index``
  (capture files are append-only; a file replaced by another one, told by its first call's id,
  starts over);
* a **rollout** is new when its record (a line of the rollout file, or of the collector's
  failures file) lies after the last line logged from that file. Its gaps and the calls its
  attachment lists that the store lacks are logged with it, as they stand when it appears.

The step of a batch is ``poll(step=)`` when given (a training loop knows its step), else the
largest ``step_field`` of the new rollouts, else the trailing number of ``checkpoint``
(``"ckpt-1200"`` → 1200), else the last step seen (calls without new rollouts), else the batch
number. It is logged as ``<prefix>/step`` and declared the x-axis of every
``<prefix>/*`` key, so W&B's own step is never forced.

Example:
    >>> from ngcapture_viz.export import LiveExport  # doctest: +SKIP
    >>> with LiveExport("results/model-calls", "results/rollouts.jsonl",  # doctest: +SKIP
    ...                 project="rl-run", step_field="step") as live:
    ...     for batch in trainer:  # your training loop
    ...         trainer.train(batch)
    ...         live.poll()
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson
import polars as pl

from ngcapture_viz.exceptions import ExportError, RolloutFileWarning
from ngcapture_viz.export.tables import payload_free_tables, summary_metrics
from ngcapture_viz.export.wandb import WANDB_MAX_ROWS, _import_wandb, wandb_table_data
from ngcapture_viz.load.index import default_cache_dir
from ngcapture_viz.run import CaptureRun, open_run

if TYPE_CHECKING:
    from wandb import Run

__all__ = ["STATE_DIR_NAME", "LiveExport", "PollResult", "watch"]

logger = logging.getLogger(__name__)

#: Folder of the state files beside the store (skipped by the store's listing: it starts with .).
STATE_DIR_NAME: Final = ".ngcapture-watch"
_FORMAT: Final = 1
#: Gaps that come and go while a run trains: never logged as rows.
_TRANSIENT: Final = frozenset({"model_call_capture_pending", "rollout_not_in_rollouts"})


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


@dataclass
class _State:
    """What has been logged (the JSON state file)."""

    run_id: str | None = None
    batches: int = 0
    step: int | None = None
    calls_logged: int = 0
    rollouts_logged: int = 0
    #: capture file name -> [model_call_id of its first call, next call_index to log]
    files: dict[str, list[Any]] = field(default_factory=dict)
    #: "rollouts" / "failures" -> {"inode", "head", "next_line"}
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: a batch handed to W&B whose commit was not written yet: {"batch": n, "state": {...}}
    pending: dict[str, Any] | None = None

    def committed(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "batches": self.batches,
            "step": self.step,
            "calls_logged": self.calls_logged,
            "rollouts_logged": self.rollouts_logged,
            "files": self.files,
            "records": self.records,
        }

    def to_json(self) -> bytes:
        return orjson.dumps(
            {"format": _FORMAT, **self.committed(), "pending": self.pending},
            option=orjson.OPT_INDENT_2,
        )

    @classmethod
    def from_json(cls, data: bytes, path: Path) -> _State:
        try:
            raw = orjson.loads(data)
            if raw.get("format") != _FORMAT:
                raise ExportError(f"watch state {path} has format {raw.get('format')!r}")
            return cls(
                **{k: raw[k] for k in cls().committed()},
                pending=raw.get("pending"),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ExportError(
                f"watch state {path} is unreadable ({exc}); delete it to log everything again"
            ) from None


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
        self.state_path = Path(state).absolute() if state is not None else self._state_place(key)
        self._state = self._read_state()

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
        calls, files_after, calls_behind = self._new_calls(run)
        rollouts, records_after, rollouts_behind = self._new_rollouts(run)
        behind = calls_behind or rollouts_behind
        if calls.height == 0 and rollouts.height == 0:
            self._save_quietly(files_after, records_after)
            return PollResult(batch=None, step=self._state.step, behind=behind)
        wandb = _import_wandb()
        target = self._target(wandb)
        batch_step = self._step(run, rollouts, step)
        tables = self._tables(run, calls, rollouts)
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
        self._write_state(self._state)
        target.log(
            self._payload(
                run, tables=tables, calls=calls, rollouts=rollouts, batch=batch, step=batch_step
            )
        )
        after.pending = None
        self._state = after
        self._write_state(after)
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

    def _new_calls(self, run: CaptureRun) -> tuple[pl.DataFrame, dict[str, list[Any]], bool]:
        """Store calls not logged yet (``rollout_id``, ``call_index``, ``file``), the file
        watermarks after logging them, and whether rows were left for later."""
        store = run.calls.filter(pl.col("source") == "store").select(
            "rollout_id",
            "call_index",
            "model_call_id",
            pl.col("path").str.split("/").list.last().alias("file"),
        )
        firsts = store.sort("call_index").group_by("file", maintain_order=True).first()
        known = pl.DataFrame(
            [(name, first, nxt) for name, (first, nxt) in self._state.files.items()],
            schema={"file": pl.String(), "known_first": pl.String(), "next": pl.Int64()},
            orient="row",
        )
        current = firsts.select("file", pl.col("model_call_id").alias("first")).join(
            known, on="file", how="left"
        )
        # A file whose first call is not the one recorded was replaced: it starts over.
        current = current.with_columns(
            pl.when(pl.col("known_first") == pl.col("first"))
            .then(pl.col("next"))
            .otherwise(0)
            .alias("next")
        )
        new = (
            store.join(current.select("file", "next"), on="file", how="left")
            .filter(pl.col("call_index") >= pl.col("next"))
            .sort("file", "call_index")
        )
        behind = new.height > self.max_rows
        new = new.head(self.max_rows).drop("next")
        files = dict(self._state.files)
        for name, first in current.select("file", "first").iter_rows():
            if files.get(name, [None])[0] != first:
                files[name] = [first, 0]
        for name, last in new.group_by("file").agg(pl.col("call_index").max()).iter_rows():
            files[name] = [files[name][0], last + 1]
        return new, files, behind

    def _new_rollouts(
        self, run: CaptureRun
    ) -> tuple[pl.DataFrame, dict[str, dict[str, Any]], bool]:
        """Rollout rows whose record lies after the last logged line of its file."""
        records = dict(self._state.records)
        if run.rollouts_path is None:
            return run.rollouts.clear().select("rollout_id"), records, False
        sources = {"rollouts": run.rollouts_path, "failures": run.failures_path}
        starts: dict[str, int] = {}
        for kind, path in sources.items():
            mark = _file_mark(path)
            known = records.get(kind)
            if mark is None:
                starts[kind] = 1 if known is None else known["next_line"]
                continue
            if known is None:
                known = {**mark, "next_line": 1}
            elif known["head"] is None:  # its first line was not whole when last seen
                known = {**known, **mark}
            elif (known["inode"], known["head"]) != (mark["inode"], mark["head"]):
                logger.warning("%s was replaced: logging its records from the start", path)
                known = {**mark, "next_line": 1}
            records[kind] = known
            starts[kind] = known["next_line"]
        rows = run.rollouts.filter(pl.col("rollouts_line").is_not_null()).with_columns(
            pl.when(pl.col("failure").is_not_null())
            .then(pl.lit("failures"))
            .otherwise(pl.lit("rollouts"))
            .alias("_from")
        )
        start = pl.col("_from").replace_strict(starts, default=1, return_dtype=pl.Int64)
        new = rows.filter(pl.col("rollouts_line") >= start).sort("_from", "rollouts_line")
        behind = new.height > self.max_rows
        new = new.head(self.max_rows)
        for kind, last in new.group_by("_from").agg(pl.col("rollouts_line").max()).iter_rows():
            known = records.get(kind, {"inode": None, "head": None})
            records[kind] = {**known, "next_line": last + 1}
        return new.select("rollout_id", "_from", "rollouts_line"), records, behind

    # -- what is logged -------------------------------------------------------------------

    def _tables(
        self, run: CaptureRun, calls: pl.DataFrame, rollouts: pl.DataFrame
    ) -> dict[str, pl.DataFrame]:
        """The payload-free tables reduced to this batch's rows."""
        tables = payload_free_tables(
            run, extra_columns=self.extra_columns, payload_digests=self.payload_digests
        )
        new_ids = rollouts.select("rollout_id")
        store_keys = calls.select("rollout_id", "call_index")
        # Calls only an attachment knows of travel with their rollout.
        attachment = tables["calls"].filter(pl.col("source") == "attachment")
        return {
            "calls": pl.concat(
                [
                    tables["calls"]
                    .filter(pl.col("source") == "store")
                    .join(store_keys, on=["rollout_id", "call_index"], how="semi"),
                    attachment.join(new_ids, on="rollout_id", how="semi"),
                ]
            ),
            "rollouts": tables["rollouts"].join(new_ids, on="rollout_id", how="semi"),
            "gaps": tables["gaps"]
            .join(new_ids, on="rollout_id", how="semi")
            .filter(~pl.col("code").cast(pl.String).is_in(list(_TRANSIENT))),
            "tool_calls": pl.concat(
                [
                    tables["tool_calls"]
                    .filter(pl.col("source") == "store")
                    .join(store_keys, on=["rollout_id", "call_index"], how="semi"),
                    tables["tool_calls"]
                    .filter(pl.col("source") == "attachment")
                    .join(new_ids, on="rollout_id", how="semi"),
                ]
            ),
        }

    def _payload(
        self,
        run: CaptureRun,
        *,
        tables: dict[str, pl.DataFrame],
        calls: pl.DataFrame,
        rollouts: pl.DataFrame,
        batch: int,
        step: int,
    ) -> dict[str, Any]:
        wandb = _import_wandb()
        p = self.prefix
        data: dict[str, Any] = {
            f"{p}/step": step,
            f"{p}/batch": batch,
            f"{p}/calls_logged": self._state.calls_logged + tables["calls"].height,
            f"{p}/rollouts_logged": self._state.rollouts_logged + tables["rollouts"].height,
            f"{p}/gaps_now": run.gaps.height,
        }
        for table, frame in tables.items():
            data[f"{p}/new_{table}"] = frame.height
            if frame.height:
                columns, rows = wandb_table_data(frame.with_columns(pl.lit(step).alias("step")))
                data[f"{p}/{table}"] = wandb.Table(columns=columns, data=rows)
        # The batch's own numbers (latency percentiles, tokens, error rate of the new calls).
        keys = calls.select("rollout_id", "call_index")
        batch_run = CaptureRun(
            run.label,
            calls=run.calls.join(keys, on=["rollout_id", "call_index"], how="semi"),
            rollouts=run.rollouts.join(rollouts.select("rollout_id"), on="rollout_id", how="semi"),
            gaps=run.gaps.clear(),
            tool_calls=run.tool_calls.clear(),
        )
        for key, value in summary_metrics(batch_run).items():
            if key not in ("gaps",) and not key.endswith("_coverage"):
                data[f"{p}/batch/{key}"] = value
        rewards = batch_run.rollouts["reward"].drop_nulls()
        data[f"{p}/batch/reward_mean"] = rewards.mean() if rewards.len() else None
        return data

    def _step(self, run: CaptureRun, rollouts: pl.DataFrame, step: int | None) -> int:
        """The step of this batch (see the module docstring)."""
        if step is not None:
            return step
        if self.step_field is not None and self.step_field in run.rollouts.columns:
            values = run.rollouts.join(rollouts.select("rollout_id"), on="rollout_id", how="semi")
            numbers = values[self.step_field].cast(pl.Int64, strict=False).drop_nulls()
            if numbers.len():
                return int(numbers.max())  # type: ignore[arg-type]
        if self.checkpoint_step is not None:
            return self.checkpoint_step
        if self.step_field is not None and self._state.step is not None:
            return self._state.step  # calls without new rollouts: the last step seen
        return self._state.batches + 1

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
        self._write_state(self._state)

    # -- state ----------------------------------------------------------------------------

    def _state_place(self, key: str) -> Path:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key)[:100] or "default"
        beside = self.capture_dir / STATE_DIR_NAME / f"{slug}.json"
        if os.access(self.capture_dir, os.W_OK):
            return beside
        digest = hashlib.sha256(f"{self.capture_dir}\0{slug}".encode()).hexdigest()[:20]
        return default_cache_dir().parent / "watch" / f"{digest}.json"

    def _read_state(self) -> _State:
        try:
            data = self.state_path.read_bytes()
        except FileNotFoundError:
            return _State()
        except OSError as exc:
            raise ExportError(f"watch state {self.state_path}: {exc.strerror}") from None
        return _State.from_json(data, self.state_path)

    def _write_state(self, state: _State) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}")
        with open(temporary, "wb") as out:
            out.write(state.to_json())
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.state_path)

    def _save_quietly(self, files: dict[str, list[Any]], records: dict[str, Any]) -> None:
        """Nothing new: keep file identities current (a replaced file noticed) if they moved."""
        if files != self._state.files or records != self._state.records:
            self._state.files, self._state.records = files, records
            self._write_state(self._state)


def watch(
    capture_dir: str | os.PathLike[str],
    rollouts: str | os.PathLike[str] | None = None,
    *,
    interval: float = 30.0,
    max_polls: int | None = None,
    stop: threading.Event | None = None,
    on_poll: Callable[[PollResult], object] | None = None,
    **options: Any,
) -> int:
    """Poll a growing run every ``interval`` seconds until ``stop`` is set (or ``max_polls``).

    A poll that had to leave rows for later (``behind``) is followed at once by the next.
    The W&B run it started is finished when it returns. ``options`` go to :class:`LiveExport`.

    Returns:
        The number of batches logged.

    Example:
        >>> stop = threading.Event()  # doctest: +SKIP
        >>> watch("run/model-calls", "run/rollouts.jsonl",  # doctest: +SKIP
        ...       project="rl", stop=stop)
    """
    stop = stop or threading.Event()
    logged = 0
    polls = 0
    with LiveExport(capture_dir, rollouts, **options) as live:
        while not stop.is_set() and (max_polls is None or polls < max_polls):
            result = live.poll()
            polls += 1
            logged += result.batch is not None
            if on_poll is not None:
                on_poll(result)
            if not result.behind:
                stop.wait(interval)
    return logged


def _checkpoint_step(label: str) -> int:
    match = re.search(r"(\d+)\D*$", label)
    if match is None:
        raise ExportError(f"checkpoint label {label!r} has no number to take the step from")
    return int(match.group(1))


def _file_mark(path: Path | None) -> dict[str, Any] | None:
    """Inode and a hash of the first line of a records file (``None``: no whole line yet)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            head = file.read(65536)
            inode = os.fstat(file.fileno()).st_ino
    except OSError:
        return None
    end = head.find(b"\n")
    if end < 0:
        return None
    return {"inode": inode, "head": hashlib.blake2b(head[:end], digest_size=12).hexdigest()}
