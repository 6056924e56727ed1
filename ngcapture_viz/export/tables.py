"""Payload-free copies of a run's frames: the one place that decides what may leave the machine.

Every exported table (W&B, Parquet) is built here from an explicit allowlist per frame
(:data:`ALLOWED_COLUMNS`). Request and response payloads, reasoning text, tool arguments, error
messages and rollout task fields never pass by default. Some columns may be added on purpose
with ``extra_columns=`` (error messages, full paths, task fields); payload columns are refused
even then (:data:`PAYLOAD_COLUMNS`). The allowlist and the refusal rules live in
:mod:`ngcapture_viz.export.columns` and are re-exported here. ``payload_digests=True`` adds
the SHA-256 and size of each call's capture line, so exported rows can be joined back to the
local store.

Absolute paths name users and machines, so the tables carry ``file`` (the file name only)
instead of ``path``; ``path``, when asked for, is relative to the capture directory (capture
files, markers) or to the rollout file's folder (rollout and failures files).
``absolute_paths=True`` keeps the local absolute paths, for local use.

Example:
    >>> import ngcapture_viz as ngv  # doctest: +SKIP
    >>> run = ngv.open_run("results/demo/ckpt-100/model-calls",  # doctest: +SKIP
    ...                    "results/demo/ckpt-100/rollouts.jsonl")
    >>> tables = payload_free_tables(run, payload_digests=True)  # doctest: +SKIP
    >>> to_parquet(run, "export/")  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import polars as pl

from ngcapture_viz.exceptions import ExportError
from ngcapture_viz.export.columns import (
    ALLOWED_COLUMNS,
    DIGEST_COLUMNS,
    PAYLOAD_COLUMNS,
    check_extra_columns,
)
from ngcapture_viz.frames.calls import is_truncated
from ngcapture_viz.run import CaptureRun, stack_runs
from ngcapture_viz.stats import PERCENTILES

__all__ = [
    "ALLOWED_COLUMNS",
    "DIGEST_COLUMNS",
    "PAYLOAD_COLUMNS",
    "RunOrRuns",
    "as_run",
    "cap_rows",
    "payload_free_tables",
    "summary_metrics",
    "to_parquet",
]

logger = logging.getLogger(__name__)

RunOrRuns = CaptureRun | Sequence[CaptureRun]

#: How each table is ordered (the order row caps keep).
_ORDER: Final[Mapping[str, tuple[str, ...]]] = {
    "calls": ("run", "rollout_id", "call_index", "model_call_id"),
    "rollouts": ("run", "rollout_id"),
    "gaps": ("run", "rollout_id", "call_index", "code", "file", "line_number"),
    "tool_calls": ("run", "rollout_id", "call_index", "tool_index"),
}


def as_run(run_or_runs: RunOrRuns) -> CaptureRun:
    """One ``CaptureRun`` from a run or a sequence of runs (stacked; labels must differ)."""
    if isinstance(run_or_runs, CaptureRun):
        return run_or_runs
    return stack_runs(list(run_or_runs))


def payload_free_tables(
    run_or_runs: RunOrRuns,
    *,
    extra_columns: Sequence[str] | None = None,
    payload_digests: bool = False,
    absolute_paths: bool = False,
) -> dict[str, pl.DataFrame]:
    """The calls, rollouts, gaps and tool-calls frames reduced to their allowlisted columns.

    Args:
        run_or_runs: a run, a stack of runs, or a sequence of runs to stack.
        extra_columns: more columns to keep, in every table that has them (for example
            ``"error_message"``, ``"path"`` or a rollout task field). Payload columns are refused.
        payload_digests: add ``payload_sha256`` and ``payload_bytes`` to the calls table: the
            SHA-256 and length of the exact capture-line bytes (read from the store; null for
            calls known only from an attachment or whose line cannot be read).
        absolute_paths: keep ``path`` as the local absolute path (default: relative to the
            capture directory, or to the rollout file's folder, as the files are shared).

    Raises:
        ExportError: an extra column is a payload column, or no frame has it.

    Example:
        >>> tables = payload_free_tables(run, extra_columns=["error_message"])  # doctest: +SKIP
        >>> tables["calls"].columns[-1]  # doctest: +SKIP
        'error_message'
    """
    run = as_run(run_or_runs)
    frames = {name: getattr(run, name) for name in ALLOWED_COLUMNS}
    if isinstance(extra_columns, str):
        extra_columns = [extra_columns]
    extra = list(dict.fromkeys(extra_columns or ()))
    check_extra_columns(frames, extra)
    roots = None if absolute_paths else _roots(run)
    return {
        name: _table(name, frame, extra, payload_digests=payload_digests, roots=roots)
        for name, frame in frames.items()
    }


def _roots(run: CaptureRun) -> dict[str, list[str]]:
    """Per run label, the folders paths are made relative to (capture dir, rollout folder)."""
    roots: dict[str, list[str]] = {}
    for label, member in run.runs.items():
        folders = [member.capture_dir]
        if member.rollouts_path is not None:
            folders.append(member.rollouts_path.parent)
        roots[label] = [str(folder) + os.sep for folder in folders if folder is not None]
    return roots


def relative_paths(path: pl.Expr, roots: Mapping[str, Sequence[str]]) -> pl.Expr:
    """``path`` without the first of its run's ``roots`` it starts with (else its file name).

    Example:
        >>> frame = pl.DataFrame({"run": ["a"], "path": ["/home/me/calls/0-0.capture.jsonl"]})
        >>> frame.select(relative_paths(pl.col("path"), {"a": ["/home/me/calls/"]})).item()
        '0-0.capture.jsonl'
    """
    relative = _file_name(path)  # a path under no known folder: its name, never the full path
    run = pl.col("run").cast(pl.String)
    for label, folders in roots.items():
        for folder in reversed(folders):  # the first folder wins: it is applied last
            relative = (
                pl.when((run == label) & path.str.starts_with(folder))
                .then(path.str.strip_prefix(folder))
                .otherwise(relative)
            )
    return pl.when(path.is_null()).then(None).otherwise(relative)


def _table(
    name: str,
    frame: pl.DataFrame,
    extra: Sequence[str],
    *,
    payload_digests: bool,
    roots: Mapping[str, Sequence[str]] | None,
) -> pl.DataFrame:
    if name == "calls" and payload_digests:
        frame = frame.with_columns(_digests(frame))  # read with the absolute paths
    if "path" in frame.columns:
        frame = frame.with_columns(_file_name(pl.col("path")).alias("file"))
        if roots is not None:
            frame = frame.with_columns(relative_paths(pl.col("path"), roots).alias("path"))
    keep = [c for c in ALLOWED_COLUMNS[name] if c in frame.columns]
    keep += [c for c in extra if c in frame.columns and c not in keep]
    if name == "calls" and payload_digests:
        keep += DIGEST_COLUMNS
    order = [_sort_key(c) for c in _ORDER[name]]
    return frame.select(keep).sort(order, nulls_last=True, maintain_order=True)


def _file_name(path: pl.Expr) -> pl.Expr:
    return path.str.extract(r"([^/\\]*)$", 1)


def _sort_key(column: str) -> pl.Expr:
    return pl.col(column).cast(pl.String) if column == "run" else pl.col(column)


def _digests(calls: pl.DataFrame) -> list[pl.Series]:
    """SHA-256 and length of each call's capture line, read by its offset (one open per file)."""
    digests: list[str | None] = [None] * calls.height
    sizes: list[int | None] = [None] * calls.height
    located = (
        calls.with_row_index("_row")
        .filter(pl.col("source") == "store", pl.col("path").is_not_null())
        .select("_row", "path", "byte_offset", "line_bytes")
    )
    for (path,), rows in located.group_by("path", maintain_order=True):
        try:
            fd = os.open(str(path), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            logger.warning("payload digests: cannot open %s (%s); digests left null", path, exc)
            continue
        try:
            for row, offset, length in rows.select("_row", "byte_offset", "line_bytes").iter_rows():
                data = os.pread(fd, length, offset)
                if len(data) != length:
                    logger.warning("payload digests: %s is shorter than indexed", path)
                    continue
                digests[row] = hashlib.sha256(data).hexdigest()
                sizes[row] = len(data)
        finally:
            os.close(fd)
    return [
        pl.Series("payload_sha256", digests, dtype=pl.String),
        pl.Series("payload_bytes", sizes, dtype=pl.Int64),
    ]


def cap_rows(
    tables: Mapping[str, pl.DataFrame], max_rows: int
) -> tuple[dict[str, pl.DataFrame], list[str]]:
    """Keep at most ``max_rows`` rows per table; returns the tables and a note per capped table.

    The rows kept are deterministic: each run of a stack gets an equal share of its first rows
    (in the table's order), so no checkpoint disappears from the export.

    Example:
        >>> capped, notes = cap_rows({"calls": calls}, 1000)  # doctest: +SKIP
    """
    if max_rows < 1:
        raise ExportError(f"max_rows must be at least 1, not {max_rows}")
    capped: dict[str, pl.DataFrame] = {}
    notes: list[str] = []
    for name, frame in tables.items():
        if frame.height <= max_rows:
            capped[name] = frame
            continue
        rank = pl.int_range(pl.len()).over("run") if "run" in frame.columns else pl.lit(0)
        kept = (
            frame.with_row_index("_position")
            .with_columns(rank.alias("_rank"))
            .sort("_rank", "_position")
            .head(max_rows)
            .sort("_position")
            .drop("_position", "_rank")
        )
        note = (
            f"{name}: kept {max_rows} of {frame.height} rows (the row limit); "
            "the first rows of each run in table order were kept, the rest were not exported"
        )
        logger.warning("%s", note)
        capped[name] = kept
        notes.append(note)
    return capped, notes


def summary_metrics(run_or_runs: RunOrRuns) -> dict[str, float | int | None]:
    """Headline numbers of a run: counts, token totals, latency and TTFT percentiles, rates.

    For a stack of runs every key is prefixed by the run's label (``"ckpt-100/latency_p50_ms"``).
    ``None`` means unknown (no call reported the metric), never zero; each metric has a
    ``*_coverage`` key, the share of calls that reported it. Percentiles are Polars'
    ``quantile(q, interpolation="linear")`` over the reported values.

    Example:
        >>> summary_metrics(run)["error_rate"]  # doctest: +SKIP
        0.05
    """
    run = as_run(run_or_runs)
    if run.label is not None:
        return _metrics(run)
    return {
        f"{label}/{key}": value
        for label, member in run.runs.items()
        for key, value in _metrics(member).items()
    }


_TOKENS: Final = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens")
_TIMES: Final = {"latency": "latency_total_ms", "ttft": "latency_ttft_ms"}


def _metrics(run: CaptureRun) -> dict[str, float | int | None]:
    calls, rollouts = run.calls, run.rollouts
    n = calls.height
    share = (lambda expr: expr.sum() / pl.len()) if n else (lambda expr: pl.lit(None))
    exprs: list[pl.Expr] = []
    for column in _TOKENS:
        exprs += [
            pl.when(pl.col(column).count() > 0).then(pl.col(column).sum()).alias(column),
            share(pl.col(column).is_not_null()).alias(f"{column}_coverage"),
        ]
    for short, column in _TIMES.items():
        exprs += [
            pl.col(column).quantile(q, interpolation="linear").alias(f"{short}_{name}_ms")
            for name, q in PERCENTILES.items()
        ]
        exprs.append(share(pl.col(column).is_not_null()).alias(f"{short}_coverage"))
    exprs += [
        share(pl.col("error_category").is_not_null()).alias("error_rate"),
        share(is_truncated()).alias("truncation_rate"),
    ]
    values = calls.select(exprs).row(0, named=True)
    with_gaps = rollouts.filter(pl.col("num_gaps") > 0).height
    return {
        "calls": n,
        "rollouts": rollouts.height,
        "gaps": run.gaps.height,
        **values,
        "gap_rate": with_gaps / rollouts.height if rollouts.height else None,
    }


def to_parquet(
    run_or_runs: RunOrRuns,
    directory: str | os.PathLike[str],
    *,
    extra_columns: Sequence[str] | None = None,
    payload_digests: bool = False,
    absolute_paths: bool = False,
) -> dict[str, Path]:
    """Write the payload-free tables as ``<directory>/<table>.parquet``; returns their paths.

    Same columns as the W&B export (see :func:`payload_free_tables`), no row cap.

    Example:
        >>> to_parquet(run, "export/", payload_digests=True)["calls"]  # doctest: +SKIP
        PosixPath('export/calls.parquet')
    """
    tables = payload_free_tables(
        run_or_runs,
        extra_columns=extra_columns,
        payload_digests=payload_digests,
        absolute_paths=absolute_paths,
    )
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for name, frame in tables.items():
        path = out / f"{name}.parquet"
        frame.write_parquet(path)
        written[name] = path
    return written
