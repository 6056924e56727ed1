"""Open capture runs: ``open_run``, ``open_runs`` and the Inspect-style ``*_df`` functions.

A run is a capture directory, a rollout JSONL file, or both. Frames:

* ``calls``      one row per captured call (store lines; attachment calls when no store has them)
* ``rollouts``   one row per rollout, capture totals beside task fields and reward
* ``gaps``       every piece of evidence known to be missing or damaged, and where
* ``tool_calls`` one row per tool call a response asked for

Payloads stay on disk: ``run.payload(model_call_id)`` reads one line back by its byte offset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from capture_core import MARKER_SUFFIX, InvalidRecordError, ModelCallRecord, normalize_line
from ngcapture_viz.exceptions import DamagedSourceError, PayloadUnavailableError, SourceError
from ngcapture_viz.frames.calls import CALLS, CallColumns
from ngcapture_viz.frames.gaps import GAPS, AnalysisGap, GapRows
from ngcapture_viz.frames.rollouts import (
    ROLLOUTS,
    TOKEN_TOTALS,
    call_totals,
    rollout_parts,
    task_field_columns,
)
from ngcapture_viz.frames.tool_calls import TOOL_CALLS, ToolCallColumns
from ngcapture_viz.index import CaptureIndex, IndexStats
from ngcapture_viz.sources import RolloutSource, read_rollouts

__all__ = [
    "CaptureRun",
    "calls_df",
    "gaps_df",
    "open_run",
    "open_runs",
    "rollouts_df",
    "tool_calls_df",
]

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class _Sources:
    capture_dir: Path | None
    rollouts: Path | None


class CaptureRun:
    """One run (or several stacked by ``open_runs``) as Polars frames.

    Attributes:
        label: the run's label (``None`` for a stack of runs).
        calls, rollouts, gaps, tool_calls: the frames (see ``docs/frames.md``).
        index_stats: what refreshing the sidecar index did (``None`` without a store).
        runs: the runs a stack was built from, by label.
    """

    def __init__(
        self,
        label: str | None,
        *,
        calls: pl.DataFrame,
        rollouts: pl.DataFrame,
        gaps: pl.DataFrame,
        tool_calls: pl.DataFrame,
        capture_dir: Path | None = None,
        rollouts_path: Path | None = None,
        index_stats: IndexStats | None = None,
        runs: Mapping[str, CaptureRun] | None = None,
    ) -> None:
        self.label = label
        self.calls = calls
        self.rollouts = rollouts
        self.gaps = gaps
        self.tool_calls = tool_calls
        self.capture_dir = capture_dir
        self.rollouts_path = rollouts_path
        self.index_stats = index_stats
        self.runs: dict[str, CaptureRun] = dict(runs) if runs else {}
        if label is not None and not self.runs:
            self.runs = {label: self}

    def __repr__(self) -> str:
        name = self.label if self.label is not None else "+".join(self.runs)
        return (
            f"<CaptureRun {name!r}: {self.rollouts.height} rollouts, {self.calls.height} calls, "
            f"{self.gaps.height} gaps>"
        )

    @property
    def labels(self) -> list[str]:
        """The labels of the runs in this object, in order."""
        return list(self.runs)

    def payload(self, model_call_id: str, *, rollout_id: str | None = None) -> ModelCallRecord:
        """The full record of one call, request and response payloads included.

        The line is read back from the capture file by its byte offset (nothing else is read)
        and checked to still hold that call.

        Raises:
            PayloadUnavailableError: unknown id, an id shared by several rollouts (pass
                ``rollout_id``), a call known only from a rollout attachment, or a file that was
                rewritten since the run was opened.
        """
        rows = self.calls.filter(pl.col("model_call_id") == model_call_id)
        if rollout_id is not None:
            rows = rows.filter(pl.col("rollout_id") == rollout_id)
        if rows.height == 0:
            raise PayloadUnavailableError(f"no call with model_call_id {model_call_id!r}")
        stored = rows.filter(pl.col("source") == "store")
        if stored.height == 0:
            raise PayloadUnavailableError(
                f"call {model_call_id!r} is known only from a rollout attachment, which keeps "
                "no payloads; open the run with its capture directory"
            )
        if stored.height > 1:
            where = stored.select("run", "rollout_id").rows()
            raise PayloadUnavailableError(
                f"model_call_id {model_call_id!r} occurs {stored.height} times ({where}); "
                "pass rollout_id="
            )
        row = stored.row(0, named=True)
        return _read_payload(row)

    def to_parquet(self, directory: PathLike) -> dict[str, Path]:
        """Write the four frames as Parquet files into ``directory``; returns their paths."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        written = {}
        for name in ("calls", "rollouts", "gaps", "tool_calls"):
            path = out / f"{name}.parquet"
            getattr(self, name).write_parquet(path)
            written[name] = path
        return written


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


def open_run(
    capture_dir: PathLike | None = None,
    rollouts: PathLike | None = None,
    *,
    label: str | None = None,
    strict: bool = False,
    index: bool = True,
    index_dir: PathLike | None = None,
    workers: int | None = None,
    progress: bool | None = None,
) -> CaptureRun:
    """Open a run from a capture directory, a rollout JSONL file, or both.

    Args:
        capture_dir: the capture store (``.../model-calls``).
        rollouts: the rollout JSONL written by collection.
        label: the run's label (the ``run`` column); default: the directory or file name.
        strict: raise ``DamagedSourceError`` when any gap is found instead of reporting it.
        index: use and refresh the sidecar Parquet index (``False``: parse in memory only).
        index_dir: where the index lives (default: beside the store, or the user cache).
        workers: processes for a cold build (default: every core).
        progress: show a progress bar (default: in terminals only, never in notebooks).

    Raises:
        SourceError: neither source given, or one does not exist.

    Example:
        >>> run = open_run("results/demo/ckpt-100/model-calls",  # doctest: +SKIP
        ...                "results/demo/ckpt-100/rollouts.jsonl")
        >>> run.calls.group_by("dialect").len()  # doctest: +SKIP
    """
    if capture_dir is None and rollouts is None:
        raise SourceError("open_run needs a capture directory, a rollout file, or both")
    sources = _Sources(
        Path(capture_dir).absolute() if capture_dir is not None else None,
        Path(rollouts).absolute() if rollouts is not None else None,
    )
    if label is None:
        label = _default_label(sources)
    builder = _RunBuilder(label, sources)
    if sources.capture_dir is not None:
        builder.read_store(
            index=index,
            index_dir=index_dir,
            workers=workers,
            progress=progress,
        )
    if sources.rollouts is not None:
        builder.read_rollouts(read_rollouts(sources.rollouts))
    run = builder.build()
    if strict and run.gaps.height:
        first = run.gaps.row(0, named=True)
        raise DamagedSourceError(
            f"{run.gaps.height} gap(s) in run {label!r}; first: {first['code']} "
            f"({first['detail'] or ''}) at {first['path']}:{first['line_number']}",
            run.gaps.to_dicts(),
        )
    return run


def _default_label(sources: _Sources) -> str:
    if sources.capture_dir is not None:
        directory = sources.capture_dir
        return directory.parent.name if directory.name == "model-calls" else directory.name
    assert sources.rollouts is not None
    return sources.rollouts.stem


class _RunBuilder:
    def __init__(self, label: str, sources: _Sources) -> None:
        self.label = label
        self.sources = sources
        self.store_calls = CALLS.empty()
        self.store_tools = TOOL_CALLS.empty()
        self.gaps = GapRows()
        self.gap_frames: list[pl.DataFrame] = []
        self.store_rollouts: dict[str, dict[str, Any]] = {}
        self.records: RolloutSource | None = None
        self.index_stats: IndexStats | None = None

    # -- the store ------------------------------------------------------------------------

    def read_store(
        self,
        *,
        index: bool,
        index_dir: PathLike | None,
        workers: int | None,
        progress: bool | None,
    ) -> None:
        root = self.sources.capture_dir
        assert root is not None
        idx = CaptureIndex(root, index_dir=index_dir, workers=workers)
        self.index_stats = idx.refresh(progress=progress, write=index, reuse=index)
        calls, damaged = idx.frames_with_paths()
        self.store_calls = calls
        self.store_tools = idx.tool_calls
        self.gap_frames.append(damaged)
        listing = idx.listing
        for name, reason in idx.unreadable:
            self.gaps.add(
                AnalysisGap.FILE_UNREADABLE,
                source="store",
                rollout_id=name.removesuffix(".capture.jsonl"),
                detail=reason,
                path=str(root / name),
            )
        for name in listing.foreign:
            self.gaps.add(
                AnalysisGap.FOREIGN_FILE,
                source="store",
                detail="not a <rollout_id>.capture.jsonl file or marker",
                path=str(root / name),
            )
        for rollout_id in sorted(listing.markers):
            self.gaps.add(
                "model_call_capture_incomplete",
                source="store",
                rollout_id=rollout_id,
                detail="the capture server failed to record at least one call",
                path=str(root / f"{rollout_id}{MARKER_SUFFIX}"),
            )
        for rollout_id, call_id in listing.pending:
            self.gaps.add(
                "model_call_capture_pending",
                source="store",
                rollout_id=rollout_id,
                model_call_id=call_id,
                detail="the capture write had not landed when the run was opened",
                path=str(root / ".pending" / f"{rollout_id}@{call_id}"),
            )
        lines = (
            pl.concat([calls.select("rollout_id"), damaged.select("rollout_id")])
            .group_by("rollout_id")
            .len()
        )
        seen = dict(lines.iter_rows())
        for rollout_id, name in listing.data.items():
            if not seen.get(rollout_id) and name not in dict(idx.unreadable):
                self.gaps.add(
                    AnalysisGap.EMPTY_FILE,
                    source="store",
                    rollout_id=rollout_id,
                    detail="the capture file holds no line",
                    path=str(root / name),
                )
        pending: dict[str, int] = {}
        for rollout_id, _ in listing.pending:
            pending[rollout_id] = pending.get(rollout_id, 0) + 1
        for rollout_id in set(listing.data) | listing.markers | set(pending):
            file_name = listing.data.get(rollout_id)
            self.store_rollouts[rollout_id] = {
                "incomplete": rollout_id in listing.markers,
                "pending_writes": pending.get(rollout_id, 0),
                "path": str(root / file_name) if file_name else None,
            }

    # -- the rollout file -----------------------------------------------------------------

    def read_rollouts(self, source: RolloutSource) -> None:
        self.records = source
        self.gaps.extend(source.gaps)
        for record in source.records:
            if record.attachment is None:
                continue
            for gap in record.attachment.gaps:
                self.gaps.add(
                    gap.code,
                    source="attachment",
                    rollout_id=record.rollout_id,
                    detail=gap.detail,
                    path=str(source.path),
                    line_number=record.line_number,
                )

    def _attachment_frames(self) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """Calls, tool calls and metrics of the attachments (latest record per rollout)."""
        calls, tools = CallColumns(), ToolCallColumns()
        metrics: list[dict[str, Any]] = []
        assert self.records is not None
        for record in _latest(self.records):
            attachment = record.attachment
            if attachment is None:
                continue
            for call in attachment.calls:
                calls.add(call, rollout_id=record.rollout_id, source="attachment")
                tools.add(call, rollout_id=record.rollout_id, source="attachment")
            metrics.append({"rollout_id": record.rollout_id, **attachment.metrics.model_dump()})
        schema = {"rollout_id": pl.String(), **dict.fromkeys(TOKEN_TOTALS, pl.Int64())}
        schema |= {"latency_total_ms": pl.Float64(), "num_calls": pl.Int64()}
        return (
            calls.frame(self.label),
            tools.frame(self.label),
            pl.DataFrame(metrics, schema=schema),
        )

    # -- assembly -------------------------------------------------------------------------

    def build(self) -> CaptureRun:
        label = self.label
        run_col = pl.lit(label, dtype=pl.Categorical()).alias("run")
        calls = self.store_calls.with_columns(run_col)
        tools = self.store_tools.with_columns(run_col)
        has_store = self.sources.capture_dir is not None
        if self.records is not None:
            a_calls, a_tools, a_metrics = self._attachment_frames()
            if has_store:
                calls, tools = self._reconcile(calls, tools, a_calls, a_tools, a_metrics)
            else:
                calls, tools = a_calls, a_tools
        calls = CALLS.conform(calls).sort("rollout_id", "call_index")
        tools = TOOL_CALLS.conform(tools).sort("rollout_id", "call_index", "tool_index")
        base, fields = self._rollout_base()  # adds the store-vs-file gaps
        gaps = GAPS.conform(
            pl.concat([*self.gap_frames, self.gaps.frame()], how="vertical_relaxed").with_columns(
                run_col
            )
        ).sort("rollout_id", "call_index", "code", "line_number", nulls_last=True)
        rollouts = _finish_rollouts(label, base, fields, calls, gaps)
        return CaptureRun(
            label,
            calls=calls,
            rollouts=rollouts,
            gaps=gaps,
            tool_calls=tools,
            capture_dir=self.sources.capture_dir,
            rollouts_path=self.sources.rollouts,
            index_stats=self.index_stats,
        )

    def _reconcile(
        self,
        calls: pl.DataFrame,
        tools: pl.DataFrame,
        a_calls: pl.DataFrame,
        a_tools: pl.DataFrame,
        a_metrics: pl.DataFrame,
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Compare attachments with the store; disagreements become gaps, nothing is dropped."""
        assert self.records is not None
        in_store = pl.Series(list(self.store_rollouts), dtype=pl.String)
        both = a_calls.filter(pl.col("rollout_id").is_in(in_store.implode()))
        key = ["rollout_id", "model_call_id"]
        missing = both.join(calls, on=key, how="anti")
        lines = {r.rollout_id: r.line_number for r in self.records.records}
        for row in missing.select(*key, "call_index").iter_rows(named=True):
            self.gaps.add(
                AnalysisGap.CALL_NOT_IN_STORE,
                source="comparison",
                rollout_id=row["rollout_id"],
                model_call_id=row["model_call_id"],
                call_index=row["call_index"],
                detail="kept from the attachment (source=attachment)",
                path=str(self.records.path),
                line_number=lines.get(row["rollout_id"]),
            )
        attached = a_metrics.select("rollout_id")
        extra = calls.join(attached, on="rollout_id", how="semi").join(a_calls, on=key, how="anti")
        for row in extra.select(*key, "call_index", "path", "line_number").iter_rows(named=True):
            self.gaps.add(
                AnalysisGap.CALL_NOT_IN_ATTACHMENT,
                source="comparison",
                **row,
            )
        store_totals = call_totals(calls).join(attached, on="rollout_id", how="semi")
        compared = store_totals.join(a_metrics, on="rollout_id", suffix="_attachment")
        for row in compared.iter_rows(named=True):
            differ = [
                f"{name}: store {row[name]} vs attachment {row[name + '_attachment']}"
                for name in (*TOKEN_TOTALS, "num_calls", "latency_total_ms")
                if row[name] != row[name + "_attachment"]
            ]
            if differ:
                self.gaps.add(
                    AnalysisGap.TOTALS_DIFFER,
                    source="comparison",
                    rollout_id=row["rollout_id"],
                    detail="; ".join(differ),
                    path=str(self.records.path),
                    line_number=lines.get(row["rollout_id"]),
                )
        # Attachment calls of rollouts the store does not hold stay, marked by their source.
        only_attached = a_calls.join(calls, on=key, how="anti")
        kept_tools = a_tools.join(only_attached.select(key), on=key, how="semi")
        return (
            pl.concat([calls, CALLS.conform(only_attached)]),
            pl.concat([tools, TOOL_CALLS.conform(kept_tools)]),
        )

    def _rollout_base(self) -> tuple[pl.DataFrame, list[dict[str, Any]]]:
        """The rollout ids of both sources with their store and record facts."""
        has_store = self.sources.capture_dir is not None
        has_file = self.records is not None
        records = {r.rollout_id: r for r in _latest(self.records)}
        ordered = sorted(set(self.store_rollouts) | set(records))
        base: dict[str, list[Any]] = {name: [] for name in _BASE}
        fields: list[dict[str, Any]] = []
        for rollout_id in ordered:
            record = records.get(rollout_id)
            store = self.store_rollouts.get(rollout_id)
            task_index, rollout_index, attempt = rollout_parts(rollout_id)
            if record is not None:
                task_index = record.task_index if record.task_index is not None else task_index
                if record.rollout_index is not None:
                    rollout_index = record.rollout_index
            base["rollout_id"].append(rollout_id)
            base["task_id"].append(record.task_id if record else None)
            base["task_index"].append(task_index)
            base["rollout_index"].append(rollout_index)
            base["attempt"].append(attempt)
            base["reward"].append(record.reward if record else None)
            base["in_store"].append(store is not None if has_store else None)
            base["in_rollouts"].append(record is not None if has_file else None)
            base["incomplete"].append(store["incomplete"] if store else None)
            base["pending_writes"].append(store["pending_writes"] if store else None)
            base["path"].append(store["path"] if store else None)
            base["rollouts_line"].append(record.line_number if record else None)
            fields.append(record.fields if record else {})
            if has_store and has_file and store is None:
                self.gaps.add(
                    AnalysisGap.NOT_IN_STORE,
                    source="comparison",
                    rollout_id=rollout_id,
                    detail="no capture file, marker or pending write",
                    path=str(self.sources.rollouts),
                    line_number=record.line_number if record else None,
                )
            elif has_store and has_file and record is None:
                self.gaps.add(
                    AnalysisGap.NOT_IN_ROLLOUTS,
                    source="comparison",
                    rollout_id=rollout_id,
                    detail="captured, but no record in the rollout file",
                    path=store["path"] if store else None,
                )
        schema = {name: ROLLOUTS.polars[name] for name in _BASE}
        return pl.DataFrame(base, schema=schema), fields


def _finish_rollouts(
    label: str,
    base: pl.DataFrame,
    fields: list[dict[str, Any]],
    calls: pl.DataFrame,
    gaps: pl.DataFrame,
) -> pl.DataFrame:
    totals = call_totals(calls)
    gap_counts = (
        gaps.filter(pl.col("rollout_id").is_not_null())
        .group_by("rollout_id")
        .agg(
            pl.len().cast(pl.Int64).alias("num_gaps"),
            (pl.col("code") == AnalysisGap.DAMAGED_LINE.value)
            .sum()
            .cast(pl.Int64)
            .alias("num_damaged"),
        )
    )
    frame = (
        # Row order must stay the base's: the task-field columns are attached by position.
        base.join(totals, on="rollout_id", how="left", maintain_order="left")
        .join(gap_counts, on="rollout_id", how="left", maintain_order="left")
        .with_columns(
            pl.col(
                "num_calls", "num_errors", "num_tool_calls", "num_gaps", "num_damaged"
            ).fill_null(0),
            ((pl.col("completed_at") - pl.col("started_at")).dt.total_microseconds() / 1000).alias(
                "wall_ms"
            ),
            pl.lit(label, dtype=pl.Categorical()).alias("run"),
        )
    )
    frame = ROLLOUTS.conform(frame)
    extras = task_field_columns(fields, ROLLOUTS.names)
    return frame.with_columns(list(extras.values())) if extras else frame


_BASE = (
    "rollout_id",
    "task_id",
    "task_index",
    "rollout_index",
    "attempt",
    "reward",
    "in_store",
    "in_rollouts",
    "incomplete",
    "pending_writes",
    "path",
    "rollouts_line",
)


def _latest(source: RolloutSource | None) -> list[Any]:
    """The last record of each rollout id (a later line supersedes an earlier one)."""
    if source is None:
        return []
    latest = {r.rollout_id: r for r in source.records}
    return list(latest.values())


def open_runs(
    runs: Mapping[str, tuple[PathLike | None, PathLike | None] | PathLike],
    *,
    strict: bool = False,
    index: bool = True,
    workers: int | None = None,
    progress: bool | None = None,
) -> CaptureRun:
    """Open several runs and stack their frames; the ``run`` column tells them apart.

    Args:
        runs: label → ``(capture_dir, rollouts)`` (either may be ``None``) or a capture dir.

    Example:
        >>> both = open_runs({"ckpt-100": ("a/model-calls", "a/rollouts.jsonl"),  # doctest: +SKIP
        ...                   "ckpt-200": ("b/model-calls", None)})
        >>> both.calls.group_by("run").len()  # doctest: +SKIP
    """
    if not runs:
        raise SourceError("open_runs needs at least one run")
    opened: dict[str, CaptureRun] = {}
    for label, value in runs.items():
        capture_dir, rollouts = value if isinstance(value, tuple) else (value, None)
        opened[label] = open_run(
            capture_dir,
            rollouts,
            label=label,
            strict=strict,
            index=index,
            workers=workers,
            progress=progress,
        )
    return stack_runs(list(opened.values()))


def stack_runs(runs: Sequence[CaptureRun]) -> CaptureRun:
    """Stack already opened runs (labels must differ)."""
    members: dict[str, CaptureRun] = {}
    for run in runs:
        for label, member in run.runs.items():
            if label in members:
                raise SourceError(f"two runs are labelled {label!r}; labels must differ")
            members[label] = member
    if len(members) == 1:
        return next(iter(members.values()))

    def stacked(name: str) -> pl.DataFrame:
        frames: list[pl.DataFrame] = [getattr(r, name) for r in members.values()]
        return pl.concat(frames, how="diagonal_relaxed")

    return CaptureRun(
        None,
        calls=stacked("calls"),
        rollouts=stacked("rollouts"),
        gaps=stacked("gaps"),
        tool_calls=stacked("tool_calls"),
        runs=members,
    )


def calls_df(
    capture_dir: PathLike | None = None,
    rollouts: PathLike | None = None,
    *,
    columns: Sequence[str] | None = None,
    **options: Any,
) -> pl.DataFrame:
    """The calls frame of one run, optionally only ``columns`` (see ``open_run``)."""
    return CALLS.select(open_run(capture_dir, rollouts, **options).calls, columns)


def rollouts_df(
    capture_dir: PathLike | None = None,
    rollouts: PathLike | None = None,
    *,
    columns: Sequence[str] | None = None,
    **options: Any,
) -> pl.DataFrame:
    """The rollouts frame of one run, optionally only ``columns``."""
    return ROLLOUTS.select(open_run(capture_dir, rollouts, **options).rollouts, columns)


def gaps_df(
    capture_dir: PathLike | None = None,
    rollouts: PathLike | None = None,
    *,
    columns: Sequence[str] | None = None,
    **options: Any,
) -> pl.DataFrame:
    """The gaps frame of one run, optionally only ``columns``."""
    return GAPS.select(open_run(capture_dir, rollouts, **options).gaps, columns)


def tool_calls_df(
    capture_dir: PathLike | None = None,
    rollouts: PathLike | None = None,
    *,
    columns: Sequence[str] | None = None,
    **options: Any,
) -> pl.DataFrame:
    """The tool-calls frame of one run, optionally only ``columns``."""
    return TOOL_CALLS.select(open_run(capture_dir, rollouts, **options).tool_calls, columns)
