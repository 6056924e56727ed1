"""Open capture runs: ``open_run``, ``open_runs`` and the Inspect-style ``*_df`` functions.

A run is a capture directory, a rollout JSONL file, or both. Frames:

* ``calls``      one row per captured call (store lines; attachment calls when no store has them)
* ``rollouts``   one row per rollout, capture totals beside task fields and reward
* ``gaps``       every piece of evidence known to be missing or damaged, and where
* ``tool_calls`` one row per tool call a response asked for
* ``invocations``, ``tool_executions``, ``compactions``, ``sandboxes``: the agent's own account
  of each rollout (from ``ng_trajectory`` / ``ng_agent_observations``)
* ``perf``       one row per rollout with an ``ng_perf`` (or the reason it has none)
* ``tokens``     one row per rollout with token-id capture: calls, lengths, masked or not and
  why (from the records), the token store's state (``tokens_dir``)

Payloads stay on disk: ``run.payload(model_call_id)`` reads one line back by its byte offset.

Beside it, re-exported here: ``stack.py`` (``open_runs``, ``stack_runs``), ``scan.py``
(``scan_calls``), ``payload.py`` (the read by byte offset), ``sources.py`` (a run's label and
sources).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import polars as pl

from capture_core import ModelCallRecord, paused_gc
from ngcapture_viz.exceptions import DamagedSourceError, PayloadUnavailableError, SourceError
from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.frames.gaps import GAPS
from ngcapture_viz.frames.rollouts import (
    ROLLOUTS,
)
from ngcapture_viz.frames.tokens import TOKENS, read_token_store, token_frame
from ngcapture_viz.frames.tool_calls import TOOL_CALLS
from ngcapture_viz.interop import to_pandas, to_polars
from ngcapture_viz.load._assemble import RunBuilder, Sources
from ngcapture_viz.load.evidence import EVIDENCE_FRAMES, evidence_frames
from ngcapture_viz.load.failures import failures_file, read_failures
from ngcapture_viz.load.index import CaptureIndex, IndexStats
from ngcapture_viz.load.remote import is_remote, mirror_sources, remote_label
from ngcapture_viz.load.rollouts import RolloutSource, read_rollouts
from ngcapture_viz.payload import _read_payload
from ngcapture_viz.scan import scan_calls
from ngcapture_viz.sources import PathLike, _default_label
from ngcapture_viz.stack import open_runs, stack_runs

__all__ = [
    "CaptureRun",
    "calls_df",
    "gaps_df",
    "open_run",
    "open_runs",
    "rollouts_df",
    "scan_calls",
    "stack_runs",
    "tool_calls_df",
]

#: The frames of a run, in order.
FRAME_NAMES: Final = ("calls", "rollouts", "gaps", "tool_calls", *EVIDENCE_FRAMES, "tokens")


class CaptureRun:
    """One run (or several stacked by ``open_runs``) as Polars frames.

    Attributes:
        label: the run's label (``None`` for a stack of runs).
        calls, rollouts, gaps, tool_calls: the frames (see ``docs/frames.md``).
        invocations, tool_executions, compactions, sandboxes, perf: the agent-side frames
            (empty when the rollout records carry no such evidence).
        tokens: token-id capture per rollout (empty without delivered records or a token
            store; see ``ngcapture_viz.frames.tokens``).
        tokens_dir: the token store read (``open_run(tokens_dir=...)``), if any.
        index_stats: what refreshing the sidecar index did (``None`` without a store).
        capture_dir, rollouts_path, failures_path: where the data came from (``failures_path``:
            the collector's ``<stem>_failures.jsonl``, read when it was there).
        runs: the runs a stack was built from, by label.
    """

    def __init__(
        self,
        label: str | None,
        *,
        calls: pl.DataFrame | Any,
        rollouts: pl.DataFrame | Any,
        gaps: pl.DataFrame | Any,
        tool_calls: pl.DataFrame | Any,
        capture_dir: Path | None = None,
        rollouts_path: Path | None = None,
        failures_path: Path | None = None,
        index_stats: IndexStats | None = None,
        runs: Mapping[str, CaptureRun] | None = None,
        evidence: Mapping[str, pl.DataFrame] | None = None,
        tokens: pl.DataFrame | Any | None = None,
        tokens_dir: Path | None = None,
    ) -> None:
        self.label = label
        self.tokens = to_polars(tokens, TOKENS) if tokens is not None else token_frame(label, [])
        self.tokens_dir = tokens_dir
        evidence = evidence or evidence_frames(label, [])
        self.invocations = evidence["invocations"]
        self.tool_executions = evidence["tool_executions"]
        self.compactions = evidence["compactions"]
        self.sandboxes = evidence["sandboxes"]
        self.perf = evidence["perf"]
        # pandas frames are converted here, once (the declared columns keep their dtypes).
        self.calls = to_polars(calls, CALLS)
        self.rollouts = to_polars(rollouts, ROLLOUTS)
        self.gaps = to_polars(gaps, GAPS)
        self.tool_calls = to_polars(tool_calls, TOOL_CALLS)
        self.capture_dir = capture_dir
        self.rollouts_path = rollouts_path
        self.failures_path = failures_path
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

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from ngcapture_viz.display.cards import run_html, run_text

        # No figure in the card: it never carries plotly.js.
        return {"text/html": run_html(self), "text/plain": run_text(self)}

    def _repr_html_(self) -> str:
        return self._repr_mimebundle_()["text/html"]

    @property
    def labels(self) -> list[str]:
        """The labels of the runs in this object, in order."""
        return list(self.runs)

    def payload(
        self, model_call_id: str, *, rollout_id: str | None = None, run: str | None = None
    ) -> ModelCallRecord:
        """The full record of one call, request and response payloads included.

        The line is read back from the capture file by its byte offset (nothing else is read)
        and checked to still hold that call.

        Args:
            model_call_id: the call.
            rollout_id: its rollout, when the id occurs in several.
            run: its run's label, when a stack of runs holds the id more than once.

        Raises:
            PayloadUnavailableError: unknown id, an id shared by several rollouts or runs (pass
                ``rollout_id`` / ``run``), a call known only from a rollout attachment, or a
                file that was rewritten since the run was opened.
        """
        rows = self.calls.filter(pl.col("model_call_id") == model_call_id)
        if rollout_id is not None:
            rows = rows.filter(pl.col("rollout_id") == rollout_id)
        if run is not None:
            if run not in self.labels:
                raise PayloadUnavailableError(f"no run {run!r}; this holds {self.labels}")
            rows = rows.filter(pl.col("run").cast(pl.String) == run)
        if rows.height == 0:
            raise PayloadUnavailableError(f"no call with model_call_id {model_call_id!r}")
        stored = rows.filter(pl.col("source") == "store")
        if stored.height == 0:
            raise PayloadUnavailableError(
                f"call {model_call_id!r} is known only from a rollout attachment, which keeps "
                "no payloads; open the run with its capture directory"
            )
        if stored.height > 1:
            where = stored.select(pl.col("run").cast(pl.String), "rollout_id").rows()
            ask = [] if rollout_id is not None else ["rollout_id="]
            if run is None and len({label for label, _ in where}) > 1:
                ask.append("run=")
            raise PayloadUnavailableError(
                f"model_call_id {model_call_id!r} occurs {stored.height} times ({where}); "
                f"pass {' and '.join(ask) or 'rollout_id= and run='}"
            )
        row = stored.row(0, named=True)
        return _read_payload(row)

    def to_pandas(self) -> dict[str, Any]:
        """The four frames as pandas DataFrames (pyarrow-backed: dtypes and nulls kept).

        One frame alone: ``run.calls.to_pandas(use_pyarrow_extension_array=True)``. Needs the
        ``pandas`` extra (``pip install 'ngcapture[pandas]'``); without it this raises
        ``MissingExtraError`` naming it.

        Example:
            >>> frames = run.to_pandas()  # doctest: +SKIP
            >>> frames["calls"]["tokens_in"].isna().sum()  # unknown, not 0  # doctest: +SKIP
        """
        return {name: to_pandas(getattr(self, name)) for name in FRAME_NAMES}

    def write_frames(self, directory: PathLike) -> dict[str, Path]:
        """Save the four frames, every column, as Parquet files in ``directory`` (local use).

        The frames hold no request or response payloads, but they do hold text the model wrote
        (``reasoning_content``, tool-call ``arguments``, ``error_message``) and local paths. To
        share tables, use ``ngcapture_viz.to_parquet``, which keeps the allowlisted columns only.
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        written = {}
        for name in FRAME_NAMES:
            path = out / f"{name}.parquet"
            getattr(self, name).write_parquet(path)
            written[name] = path
        return written


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
    tokens_dir: PathLike | None = None,
    verify: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    engine: str = "local",
    ray_address: str | None = None,
) -> CaptureRun:
    """Open a run from a capture directory, a rollout JSONL file, or both.

    Args:
        capture_dir: the capture store (``.../model-calls``).
        rollouts: the rollout JSONL written by collection.
        label: the run's label (the ``run`` column); default: the directory or file name.
        strict: raise ``DamagedSourceError`` when any gap is found instead of reporting it.
        index: use and refresh the sidecar Parquet index (``False``: parse in memory only).
        index_dir: where the index lives (default: beside the store, or the user cache).
        workers: accepted for compatibility and ignored: one process reads the store.
        progress: show a progress bar (default: in terminals only, never in notebooks).
        verify: read every capture line again (the index is neither used nor saved), recompute
            the facts our server stores in each line from its request and response bodies, use
            the recomputed values, and report each line whose stored facts differ as a
            ``capture_facts_differ`` gap naming the fields.
        tokens_dir: the token-id capture store (``token_id_capture.dir``): adds each
            rollout's store state, lost calls and, while they exist, entry lengths to the
            ``tokens`` frame (which the rollout file's delivery records fill on their own).
        storage_options: for ``capture_dir`` / ``rollouts`` given as URLs of object storage
            (``s3://bucket/run/model-calls``, any fsspec URL): options of the file system,
            such as ``{"endpoint_url": ..., "anon": True}``. Such sources are mirrored to the
            user cache, incrementally, and opened from there (``ngcapture_viz.load.remote``).
        engine: who parses what the index lacks: ``"local"`` (this process) or ``"ray"`` (the
            Ray cluster at ``ray_address``, default: the one ``RAY_ADDRESS`` names or a new
            local one; ``ngcapture_viz.load.ray_engine``). Both write the same index.

    Raises:
        SourceError: neither source given, or one does not exist.

    Example:
        >>> run = open_run("results/demo/ckpt-100/model-calls",  # doctest: +SKIP
        ...                "results/demo/ckpt-100/rollouts.jsonl")
        >>> run.calls.group_by("dialect").len()  # doctest: +SKIP
    """
    if capture_dir is None and rollouts is None:
        raise SourceError("open_run needs a capture directory, a rollout file, or both")
    if is_remote(capture_dir) or is_remote(rollouts):
        label = label or remote_label(
            str(capture_dir) if capture_dir is not None else None,
            str(rollouts) if rollouts is not None else None,
        )
        capture_dir, rollouts = mirror_sources(
            capture_dir, rollouts, storage_options=storage_options
        )
    sources = Sources(
        Path(capture_dir).absolute() if capture_dir is not None else None,
        Path(rollouts).absolute() if rollouts is not None else None,
    )
    if engine != "local" and sources.capture_dir is not None:
        if not index or verify:
            raise SourceError(
                f"engine={engine!r} builds the index: not with index=False or verify=True"
            )
        # The cluster brings the index up to date; the open below then reads it warm.
        CaptureIndex(
            sources.capture_dir, index_dir=index_dir, engine=engine, ray_address=ray_address
        ).refresh(progress=progress)
    if label is None:
        label = _default_label(sources)
    store_rows = None
    if tokens_dir is not None:
        if not Path(tokens_dir).is_dir():
            raise SourceError(f"token store {str(Path(tokens_dir).absolute())!r} does not exist")
        store_rows = read_token_store(tokens_dir)
    builder = RunBuilder(label, sources)
    # Listing and assembly allocate tens of thousands of short-lived containers; the cyclic
    # collector would only rescan them (measured: ~20% of a warm open).
    with paused_gc():
        if sources.capture_dir is not None:
            builder.read_store(
                index=index,
                index_dir=index_dir,
                workers=workers,
                progress=progress,
                verify=verify,
            )
        evidence = None
        token_records: list[tuple[str, Any]] = []
        if sources.rollouts is not None:
            source = read_rollouts(sources.rollouts)
            builder.read_rollouts(source)
            evidence = evidence_frames(label, _last_records(source))
            last = {record.rollout_id: record for record in source.records}
            token_records = [(rid, record.tokens) for rid, record in last.items()]
            failures = read_failures(failures_file(sources.rollouts))
            if failures is not None:
                builder.read_failures(failures)
        frames = builder.build()
    run = CaptureRun(
        label,
        calls=frames.calls,
        rollouts=frames.rollouts,
        gaps=frames.gaps,
        tool_calls=frames.tool_calls,
        capture_dir=sources.capture_dir,
        rollouts_path=sources.rollouts,
        failures_path=builder.failures.source.path if builder.failures is not None else None,
        index_stats=builder.index_stats,
        evidence=evidence,
        tokens=token_frame(label, token_records, store_rows),
        tokens_dir=Path(tokens_dir).absolute() if tokens_dir is not None else None,
    )
    if strict and run.gaps.height:
        first = run.gaps.row(0, named=True)
        raise DamagedSourceError(
            f"{run.gaps.height} gap(s) in run {label!r}; first: {first['code']} "
            f"({first['detail'] or ''}) at {first['path']}:{first['line_number']}",
            run.gaps.to_dicts(),
        )
    return run


def _last_records(source: RolloutSource) -> list[tuple[str, dict[str, Any], Any]]:
    """``(rollout id, evidence, attachment)`` of the last record of each id (the one used)."""
    last = {record.rollout_id: record for record in source.records}
    return [(r.rollout_id, r.evidence, r.attachment) for r in last.values() if r.evidence]


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
