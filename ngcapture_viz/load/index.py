"""The sidecar index: call rows of a capture directory in Parquet, refreshed incrementally.

The index lives in ``<capture_dir>/.ngcapture-index/`` (or, when the store is read-only, in the
user cache directory). It holds the call, tool-call and damaged-line rows of every capture file
and, per file, how far it was read (``consumed``, always a line boundary), its size, inode,
modification time and two short hashes of the read prefix. A refresh then does the least work
that stays exact:

* file unchanged (inode, size, mtime)        → rows reused, nothing read;
* file grew and the read prefix still hashes  → only the appended bytes are parsed;
* file shrank, was replaced or rewritten      → the file is read again from the start;
* file gone                                   → its rows are dropped.

Deleting the index is harmless: the next open rebuilds it. One process reads: the lines our
server writes carry their facts (``capture_core.facts``), so a line costs little more than
decoding its bytes, and no pool of processes pays for its start-up (issue 19).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import Final

import polars as pl

from ngcapture_viz.exceptions import CaptureIndexError
from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.frames.gaps import GAPS
from ngcapture_viz.frames.tool_calls import TOOL_CALLS
from ngcapture_viz.load._index_files import (
    FILE_SCHEMA,
    IndexTables,
    read_tables,
    write_delta,
    write_tables,
)
from ngcapture_viz.load._journal import Journals
from ngcapture_viz.load._journal_files import journal_marks
from ngcapture_viz.load._listing import DirListing
from ngcapture_viz.load._merge import merge_tables
from ngcapture_viz.load._plan import plan_refresh
from ngcapture_viz.load._prepared import Prepared, with_paths
from ngcapture_viz.load._progress import progress_bar
from ngcapture_viz.load._scan import FileTask, ScanResult, scan_files

__all__ = ["INDEX_DIR_NAME", "CaptureIndex", "DirListing", "IndexStats", "default_cache_dir"]

logger = logging.getLogger(__name__)

INDEX_DIR_NAME: Final = ".ngcapture-index"


def default_cache_dir() -> Path:
    """Where indexes of read-only stores go: ``$NGCAPTURE_CACHE_DIR``, else the XDG cache."""
    explicit = os.environ.get("NGCAPTURE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ngcapture" / "index"


@dataclass
class IndexStats:
    """What one refresh did. ``bytes_parsed`` counts capture bytes actually parsed."""

    location: Path | None  # None: could not be saved anywhere (the rows are in memory)
    files: int = 0
    reused: int = 0
    appended: int = 0
    reread: int = 0
    new: int = 0
    removed: int = 0
    bytes_parsed: int = 0
    #: Processes that parsed (always 1 since issue 19; kept for callers that print it).
    workers: int = 1
    #: Lines read from their facts (``facts``), from their bodies (``bodies``), by the exact
    #: reader (``exact``), and rows taken from facts journals (``journal``; of those, from
    #: their columnar segments: ``segments``).
    decoded: dict[str, int] = field(default_factory=dict)


class CaptureIndex:
    """The index of one capture directory.

    Example:
        >>> index = CaptureIndex("/abs/results/model-calls")  # doctest: +SKIP
        >>> stats = index.refresh()  # doctest: +SKIP
        >>> index.calls.height, stats.bytes_parsed  # doctest: +SKIP
        (47146, 0)
    """

    def __init__(
        self,
        capture_dir: str | os.PathLike[str],
        *,
        index_dir: str | os.PathLike[str] | None = None,
        workers: int | None = None,
        verify: bool = False,
        engine: str = "local",
        ray_address: str | None = None,
    ) -> None:
        if engine not in ("local", "ray"):
            raise ValueError(f"engine must be 'local' or 'ray', not {engine!r}")
        self.engine = engine  # who parses: this process, or a Ray cluster (load/ray_engine.py)
        self.ray_address = ray_address
        self.root = Path(capture_dir).absolute()
        self._explicit = Path(index_dir).absolute() if index_dir is not None else None
        self.workers = 1  # ``workers`` is accepted and ignored: one process reads (issue 19)
        self.verify = verify
        self.files = pl.DataFrame(schema=FILE_SCHEMA)
        self.calls = CALLS.empty()
        self.tool_calls = TOOL_CALLS.empty()
        self.damaged = GAPS.empty()
        self.unreadable: list[tuple[str, str]] = []
        self._settled: set[str] = set()
        self._journals: dict[str, Journals] = {}
        self._delta: IndexTables | None = None  # what an append adds, when only that
        self._loaded_from: Path | None = None
        self._prepared: Prepared | None = None
        self.listing = DirListing()

    def __repr__(self) -> str:
        return f"CaptureIndex({str(self.root)!r})"

    # -- location -------------------------------------------------------------------------

    def candidates(self) -> list[Path]:
        """Where the index may live, in order of preference."""
        if self._explicit is not None:
            return [self._explicit]
        key = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:20]
        return [self.root / INDEX_DIR_NAME, default_cache_dir() / key]

    def location(self) -> Path | None:
        """The directory of the existing index, if any: the most recently written one.

        An index beside a store that has since become unwritable stays there, stale, while
        refreshed generations go to the cache; the newest ``meta.json`` is the current one
        (on a tie, the earlier candidate).
        """
        found: list[tuple[int, int, Path]] = []
        for rank, place in enumerate(self.candidates()):
            try:
                meta = os.stat(place / "meta.json")
            except OSError:
                continue
            if S_ISREG(meta.st_mode):
                found.append((meta.st_mtime_ns, -rank, place))
        return max(found)[2] if found else None

    # -- refresh --------------------------------------------------------------------------

    def refresh(
        self,
        *,
        progress: bool | None = None,
        write: bool = True,
        reuse: bool = True,
        require_write: bool = False,
    ) -> IndexStats:
        """Bring the rows up to date with the directory and save the index.

        Args:
            progress: show a progress bar (default: only in a terminal, never in notebooks).
            write: save the refreshed index (``False`` keeps it in memory only).
            reuse: start from the saved index (``False`` parses every file again).
            require_write: raise when the index cannot be saved anywhere. By default (and
                unless ``index_dir`` was given) that only logs a warning: the rows are right,
                the next open just parses again.

        Raises:
            CaptureIndexError: the index could not be saved and saving was required.
        """
        scan_ns = time.time_ns()
        self._delta = None
        if self.verify:  # every line is read again from its bodies; nothing is saved
            reuse = write = False
        # Where the journals end before any file is stat'ed: the next refresh reads them from
        # there (``_journal``: every line appended after a ``stat`` has its entry after that).
        marks = {} if self.verify else journal_marks(str(self.root))
        # Reading the saved tables (Polars, off the GIL) overlaps the directory's stats.
        with ThreadPoolExecutor(max_workers=1) as pool:
            saved = pool.submit(self._load) if reuse else None
            self.listing = DirListing.read(self.root)
            old = saved.result() if saved is not None else None
        stats = IndexStats(location=self.location() or self.candidates()[0])
        plan = plan_refresh(self.root, self.listing, old, scan_ns, verify=self.verify)
        tasks, keep, self._settled = plan.tasks, plan.keep, plan.settled
        self._journals = {str(self.root): plan.journals} if plan.journals is not None else {}
        stats.reused, stats.appended, stats.reread = plan.reused, plan.appended, plan.reread
        stats.new, stats.removed = plan.new, plan.removed
        result = self._run(tasks, stats, progress=progress)
        if old is not None and not tasks and not stats.removed:
            self.files, self.calls = old.files, old.calls
            self.tool_calls, self.damaged = old.tool_calls, old.damaged
            self.unreadable = []
            if self._settled:
                self._delta = _empty_delta()
        else:
            self._merge(old, keep, result)
        stats.files = self.listing.data_frame.height
        stats.bytes_parsed = result.bytes_parsed
        # A torn tail is parsed again on every refresh; when no file moved on, the saved
        # index is still right and rewriting every table would only cost time.
        if self._settled:
            # Files last written near an earlier scan, checked by content now and old enough
            # to be trusted by mtime from here on: record that, or every open re-hashes them.
            settled = pl.col("name").is_in(list(self._settled))
            self.files = self.files.with_columns(
                pl.when(settled).then(scan_ns).otherwise(pl.col("scanned_ns")).alias("scanned_ns"),
                pl.when(settled).then(None).otherwise(pl.col("full_hash")).alias("full_hash"),
            )
            if self._delta is not None:
                self._delta.files = pl.concat(
                    [self._delta.files, self.files.filter(settled)]
                ).unique("name", keep="last", maintain_order=True)
        moved = (
            old is None
            or stats.removed > 0
            or bool(self._settled)
            or (bool(tasks) and not _same_states(old.files, self.files))
        )
        if write and moved:
            try:
                stats.location = self._save(old, marks)
            except CaptureIndexError as exc:
                if require_write or self._explicit is not None:
                    raise
                logger.warning("%s; using the rows in memory only", exc)
                stats.location = None
        return stats

    def _run(
        self, tasks: list[FileTask], stats: IndexStats, *, progress: bool | None
    ) -> ScanResult:
        total = sum(self._remaining(task) for task in tasks)
        if self.engine == "ray" and tasks:
            from ngcapture_viz.load.ray_engine import scan_on_ray

            with progress_bar(total, "indexing on Ray", enabled=progress) as bar:
                result = scan_on_ray(
                    tasks,
                    [self._remaining(task) for task in tasks],
                    places=[self._explicit] if self._explicit else self.candidates(),
                    address=self.ray_address,
                    verify=self.verify,
                    on_progress=bar.update,
                )
            stats.workers = result.processes
            stats.decoded = result.decoded
            return result
        with progress_bar(total, "indexing", enabled=progress and total > 0) as bar:
            result = scan_files(tasks, verify=self.verify, journals=self._journals)
            bar.update(total)
        stats.decoded = result.decoded
        return result

    def _merge(self, old: IndexTables | None, keep: pl.Series, result: ScanResult) -> None:
        """Kept rows (before each kept file's ``consumed``) + freshly parsed rows."""
        merged = merge_tables(self.root, old, keep, result)
        self.unreadable = result.unreadable
        self.files, self.calls = merged.files, merged.calls
        self.tool_calls, self.damaged = merged.tool_calls, merged.damaged
        if merged.delta is not None:
            self._delta = merged.delta
            prepared = self._prepared
            if old is not None and prepared is not None and prepared.calls_read is old.calls:
                # Every old row stayed: only the rollouts with new calls have new totals.
                self._prepared = prepared.appended(self.calls, self.damaged, merged.delta.calls,
                                                   self.root)  # fmt: skip

    # -- persistence ----------------------------------------------------------------------

    def _load(self) -> IndexTables | None:
        """The saved tables, and (while the main thread still waits for the files' ``stat``)
        what a warm open returns of them when no file moved: their frames with absolute paths
        and the calls' per-rollout totals (~0.2 s at 1.8M calls, off the open's path)."""
        place = self.location()
        self._loaded_from = place
        tables = None if place is None else read_tables(place)
        if tables is not None:
            try:
                self._prepared = Prepared.of(tables, self.root)
            except pl.exceptions.PolarsError:  # the open makes them itself, as it would anyway
                self._prepared = None
        return tables

    def _save(self, old: IndexTables | None, marks: dict[str, list[int]]) -> Path:
        """Write a delta on top of the generation read, when the refresh only appended; else
        a whole new generation in the first place that can be written (``marks``: where the
        journals ended before this refresh's ``stat`` of the files)."""
        place = self._loaded_from
        if self._delta is not None and old is not None and place is not None:
            try:
                if write_delta(place, old, self._delta, journals=marks):
                    return place
            except OSError:
                pass  # a new generation, wherever it can go
        errors: list[str] = []
        for place in self.candidates():
            try:
                self._write(place, marks)
            except OSError as exc:
                errors.append(f"{place}: {exc.strerror or exc}")
                continue
            return place
        raise CaptureIndexError("could not write the index: " + "; ".join(errors))

    def _write(self, place: Path, marks: dict[str, list[int]]) -> None:
        write_tables(
            place,
            IndexTables(
                files=self.files,
                calls=self.calls,
                tool_calls=self.tool_calls,
                damaged=self.damaged,
                journals=marks,
            ),
        )

    def _remaining(self, task: FileTask) -> int:
        """Bytes left to parse, from the listing's stat (no second stat per file)."""
        return 0 if task.size is None else max(0, task.size - task.start)

    def frames_with_paths(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The calls and damaged rows with absolute ``path`` values."""
        prepared = self._prepared_now()
        if prepared is not None:
            return prepared.calls, prepared.damaged
        return with_paths(self.calls, self.root), with_paths(self.damaged, self.root)

    def saved_totals(self) -> pl.DataFrame | None:
        """The calls' per-rollout totals (``frames.rollouts.call_totals``), when the rows are
        the saved tables' as read (made while they were read); ``None`` otherwise."""
        prepared = self._prepared_now()
        return prepared.totals if prepared is not None else None

    def _prepared_now(self) -> Prepared | None:
        """What the saved tables gave, when the rows are still those tables' (no file moved)."""
        prepared = self._prepared
        return prepared if prepared is not None and prepared.holds(self) else None


def _empty_delta() -> IndexTables:
    return IndexTables(
        pl.DataFrame(schema=FILE_SCHEMA), CALLS.empty(), TOOL_CALLS.empty(), GAPS.empty()
    )


def _same_states(before: pl.DataFrame, after: pl.DataFrame) -> bool:
    """Equal file states, ignoring when they were taken (keeping the older time is safe)."""
    return before.drop("scanned_ns").equals(after.drop("scanned_ns"))
