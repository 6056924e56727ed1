"""Assemble a run's frames from its sources: store rows, rollout records, and their comparison.

``RunBuilder`` reads the capture directory (``_store_part``: through the sidecar index) and the
rollout file, turns every problem into a gap row, reconciles the rollout attachments with the
store (calls in one and not the other, different totals), and derives the per-rollout totals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ngcapture_viz.frames.calls import CALLS, CallColumns
from ngcapture_viz.frames.gaps import GAPS, AnalysisGap, GapRows
from ngcapture_viz.frames.rollouts import (
    EVIDENCE,
    ROLLOUTS,
    TOKEN_TOTALS,
    call_totals,
    finish_rollouts,
    rollout_part_columns,
)
from ngcapture_viz.frames.tool_calls import TOOL_CALLS, ToolCallColumns
from ngcapture_viz.load._index_files import is_ordered
from ngcapture_viz.load._store_part import STORE_SCHEMA, PathLike, read_store_part
from ngcapture_viz.load.failures import Failures
from ngcapture_viz.load.index import IndexStats
from ngcapture_viz.load.rollouts import RolloutSource

__all__ = ["RunBuilder", "RunFrames", "Sources"]


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
        self.store_rollouts = pl.DataFrame(schema=STORE_SCHEMA)
        self.store_totals: pl.DataFrame | None = None  # the store calls' per-rollout totals
        self.records: RolloutSource | None = None
        self.failures: Failures | None = None
        self._failed_records: set[int] = set()  # id() of the records read from the failures
        self.index_stats: IndexStats | None = None

    # -- the store ------------------------------------------------------------------------

    def read_store(
        self,
        *,
        index: bool,
        index_dir: PathLike | None,
        workers: int | None,
        progress: bool | None,
        verify: bool = False,
    ) -> None:
        root = self.sources.capture_dir
        assert root is not None
        part = read_store_part(root, self.gaps, index=index, index_dir=index_dir,
                               workers=workers, progress=progress, verify=verify)  # fmt: skip
        self.index_stats = part.stats
        self.store_calls, self.store_tools = part.calls, part.tool_calls
        self.store_totals = part.totals
        self.gap_frames.append(part.damaged)
        self.store_rollouts = part.rollouts

    # -- the rollout file -----------------------------------------------------------------

    def read_rollouts(self, source: RolloutSource) -> None:
        self.records = source
        self.gaps.extend(source.gaps)  # a superseded record is one of those gaps
        for record in latest(source):  # only the record in use speaks for its rollout
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

    def read_failures(self, failures: Failures) -> None:
        """The collector's failed rollouts: records like the rollout file's, with a reason."""
        self.failures = failures
        if self.records is None:
            self.records = RolloutSource(failures.source.path)
        self.gaps.extend(failures.source.gaps)
        seen = {r.rollout_id for r in self.records.records}
        failed = [r for r in latest(failures.source) if r.rollout_id not in seen]
        self.records.records[:0] = failed  # first: a record of the rollout file supersedes
        self._failed_records = {id(r) for r in failed}
        for record in failed:
            for gap in record.attachment.gaps if record.attachment is not None else ():
                self.gaps.add(
                    gap.code,
                    source="attachment",
                    rollout_id=record.rollout_id,
                    detail=gap.detail,
                    path=str(failures.source.path),
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
        # The totals of the calls, when they are the store's alone (read with the index).
        totals = self.store_totals if has_store else None
        if self.records is not None:
            a_calls, a_tools, a_metrics = self._attachment_frames()
            if has_store:
                calls, tools, added = self._reconcile(calls, tools, a_calls, a_tools, a_metrics)
                if added:
                    totals = None
            else:
                calls, tools = a_calls, a_tools
        calls = _sorted(CALLS.conform(calls), "rollout_id", "call_index")
        tools = _sorted(TOOL_CALLS.conform(tools), "rollout_id", "call_index", "tool_index")
        base, fields = self._rollout_base()  # adds the store-vs-file gaps
        gaps = GAPS.conform(
            pl.concat([*self.gap_frames, self.gaps.frame()], how="vertical_relaxed").with_columns(
                run_col
            )
        ).sort("rollout_id", "call_index", "code", "line_number", nulls_last=True)
        rollouts = finish_rollouts(label, base, fields, calls, gaps, totals=totals)
        return RunFrames(calls=calls, rollouts=rollouts, gaps=gaps, tool_calls=tools)

    def _reconcile(
        self,
        calls: pl.DataFrame,
        tools: pl.DataFrame,
        a_calls: pl.DataFrame,
        a_tools: pl.DataFrame,
        a_metrics: pl.DataFrame,
    ) -> tuple[pl.DataFrame, pl.DataFrame, bool]:
        """Compare attachments with the store; disagreements become gaps, nothing is dropped.
        Returns the calls and tool calls, and whether calls only an attachment holds were
        added to the store's."""
        assert self.records is not None
        in_store = self.store_rollouts["rollout_id"]
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
        totals = self.store_totals if self.store_totals is not None else call_totals(calls)
        store_totals = totals.join(attached, on="rollout_id", how="semi")
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
            only_attached.height > 0,
        )

    def _rollout_base(self) -> tuple[pl.DataFrame, list[dict[str, Any]]]:
        """The rollout ids of both sources with their store and record facts."""
        has_store = self.sources.capture_dir is not None
        has_file = self.records is not None
        records = latest(self.records)
        in_file = pl.DataFrame(
            {
                "rollout_id": [r.rollout_id for r in records],
                "task_id": [r.task_id for r in records],
                "record_task_index": [r.task_index for r in records],
                "record_rollout_index": [r.rollout_index for r in records],
                "reward": [r.reward for r in records],
                "rollouts_line": [r.line_number for r in records],
                "attached": [r.attachment is not None for r in records],
                "failure": [self._failure(r) for r in records],
                "_record": range(len(records)),
            },
            schema={
                "rollout_id": pl.String(),
                "task_id": ROLLOUTS.polars["task_id"],
                "record_task_index": pl.Int64(),
                "record_rollout_index": pl.Int64(),
                "reward": ROLLOUTS.polars["reward"],
                "rollouts_line": ROLLOUTS.polars["rollouts_line"],
                "attached": pl.Boolean(),
                "failure": pl.String(),
                "_record": pl.Int64(),
            },
        )
        store = self.store_rollouts.with_columns(pl.lit(True).alias("_stored"))
        joined = (
            store.join(in_file, on="rollout_id", how="full", coalesce=True)
            .sort("rollout_id")
            .with_columns(rollout_part_columns(pl.col("rollout_id")))
        )
        stored = pl.col("_stored").fill_null(False)
        listed = pl.col("_record").is_not_null()
        frame = joined.select(
            "rollout_id",
            "task_id",
            pl.coalesce("record_task_index", "task_index").alias("task_index"),
            pl.coalesce("record_rollout_index", "rollout_index").alias("rollout_index"),
            "attempt",
            "reward",
            (stored if has_store else pl.lit(None, pl.Boolean())).alias("in_store"),
            (listed if has_file else pl.lit(None, pl.Boolean())).alias("in_rollouts"),
            "incomplete",
            "pending_writes",
            "path",
            "rollouts_line",
            # Null where no record tells (no rollout file, or a rollout only the store has).
            pl.when(listed).then(pl.col("failure").is_not_null()).alias("failed"),
            "failure",
            # Call evidence: a capture file or marker, or an attachment listing the calls.
            (stored | pl.col("attached").fill_null(False)).alias(EVIDENCE),
        ).cast({name: ROLLOUTS.polars[name] for name in _BASE})
        if has_store and has_file:
            self._comparison_gaps(joined.filter(~stored | ~listed))
        rows = joined["_record"].to_list()
        fields = [{} if i is None else records[i].fields for i in rows] if records else []
        return frame, fields

    def _failure(self, record: Any) -> str | None:
        """The reason a record of the failures file failed (None: a record of the rollout file)."""
        if self.failures is None or id(record) not in self._failed_records:
            return None
        return self.failures.reasons.get(record.rollout_id)

    def _comparison_gaps(self, one_sided: pl.DataFrame) -> None:
        """Rollouts in the store or in the rollout file, but not in both."""
        columns = ("rollout_id", "_stored", "rollouts_line", "path")
        for rollout_id, stored, line, path in one_sided.select(columns).iter_rows():
            if not stored:
                self.gaps.add(
                    AnalysisGap.NOT_IN_STORE,
                    source="comparison",
                    rollout_id=rollout_id,
                    detail="no capture file, marker or pending write",
                    path=str(self.sources.rollouts),
                    line_number=line,
                )
            else:
                self.gaps.add(
                    AnalysisGap.NOT_IN_ROLLOUTS,
                    source="comparison",
                    rollout_id=rollout_id,
                    detail="captured, but no record in the rollout file",
                    path=path,
                )


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
    "failed",
    "failure",
)


def _sorted(frame: pl.DataFrame, *keys: str) -> pl.DataFrame:
    """``frame`` sorted by ``keys``; a frame already in that order (the index saves its rows
    so) is only checked, in one pass, instead of sorted again (~1 s for 2 million calls)."""
    if frame.height < 2 or frame.select(pl.any_horizontal(pl.col(*keys).is_null().any())).item():
        return frame.sort(*keys)
    if not is_ordered(frame, keys):
        frame = frame.sort(*keys)
    # Sorted by the keys, so by the first: telling Polars speeds up the per-rollout group-by.
    return frame.with_columns(pl.col(keys[0]).set_sorted())


def latest(source: RolloutSource | None) -> list[Any]:
    """The last record of each rollout id (a later line supersedes an earlier one)."""
    if source is None:
        return []
    latest = {r.rollout_id: r for r in source.records}
    return list(latest.values())
