"""Assemble a run's frames from its sources: store rows, rollout records, and their comparison.

``RunBuilder`` reads the capture directory (through the sidecar index) and the rollout file,
turns every problem into a gap row, reconciles the rollout attachments with the store (calls in
one and not the other, different totals), and derives the per-rollout totals.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from capture_core import MARKER_SUFFIX
from capture_core.pending import pending_marker
from ngcapture_viz.frames.calls import CALLS, CallColumns
from ngcapture_viz.frames.gaps import GAPS, AnalysisGap, GapRows
from ngcapture_viz.frames.rollouts import (
    EVIDENCE,
    ROLLOUTS,
    TOKEN_TOTALS,
    call_totals,
    finish_rollouts,
    rollout_parts,
)
from ngcapture_viz.frames.tool_calls import TOOL_CALLS, ToolCallColumns
from ngcapture_viz.index import CaptureIndex, IndexStats
from ngcapture_viz.sources import RolloutSource

__all__ = ["RunBuilder", "RunFrames", "Sources"]

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Sources:
    """Where a run comes from (absolute paths)."""

    capture_dir: Path | None
    rollouts: Path | None


@dataclass(frozen=True)
class RunFrames:
    """The four frames of one run."""

    calls: pl.DataFrame
    rollouts: pl.DataFrame
    gaps: pl.DataFrame
    tool_calls: pl.DataFrame


class RunBuilder:
    """Reads a run's sources and assembles its four frames."""

    def __init__(self, label: str, sources: Sources) -> None:
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
                path=str(pending_marker(root, rollout_id, call_id)),
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
        prefix = str(root) + os.sep  # pathlib costs ~6 µs a join: too much per rollout
        for rollout_id in set(listing.data) | listing.markers | set(pending):
            file_name = listing.data.get(rollout_id)
            self.store_rollouts[rollout_id] = {
                "incomplete": rollout_id in listing.markers,
                "pending_writes": pending.get(rollout_id, 0),
                "path": prefix + file_name if file_name else None,
            }

    # -- the rollout file -----------------------------------------------------------------

    def read_rollouts(self, source: RolloutSource) -> None:
        self.records = source
        self.gaps.extend(source.gaps)
        for record in source.records:
            if record.attachment is None:
                if self.sources.capture_dir is None and not record.attachment_unreadable:
                    self.gaps.add(
                        AnalysisGap.NO_CAPTURE,
                        source="rollouts",
                        rollout_id=record.rollout_id,
                        detail="no ng_model_call_capture and no capture directory given",
                        path=str(source.path),
                        line_number=record.line_number,
                    )
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
        for record in latest(self.records):
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

    def build(self) -> RunFrames:
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
        rollouts = finish_rollouts(label, base, fields, calls, gaps)
        return RunFrames(calls=calls, rollouts=rollouts, gaps=gaps, tool_calls=tools)

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
        records = {r.rollout_id: r for r in latest(self.records)}
        ordered = sorted(set(self.store_rollouts) | set(records))
        base: dict[str, list[Any]] = {name: [] for name in _BASE}
        fields: list[dict[str, Any]] = []
        evidence: list[bool] = []
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
            # Call evidence: a capture file or marker, or an attachment listing the calls.
            evidence.append(
                store is not None or (record is not None and record.attachment is not None)
            )
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
        frame = pl.DataFrame(base, schema=schema).with_columns(
            pl.Series(EVIDENCE, evidence, dtype=pl.Boolean)
        )
        return frame, fields


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


def latest(source: RolloutSource | None) -> list[Any]:
    """The last record of each rollout id (a later line supersedes an earlier one)."""
    if source is None:
        return []
    latest = {r.rollout_id: r for r in source.records}
    return list(latest.values())
