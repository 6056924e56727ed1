"""Planning an index refresh: for each capture file, reuse its rows, read what was appended,
or read it again (the rules are in :mod:`ngcapture_viz.load.index`'s docstring).

The plan compares the directory listing's ``stat`` of every file with the state the saved
index recorded for it, in one vectorized pass (most files are unchanged on a warm open); only
the files that moved get per-file Python: a hash check of what was read of them before, or the
facts journals' word that a growth is an append (:mod:`ngcapture_viz.load._journal`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from capture_core.facts_journal import JOURNAL_DIR
from ngcapture_viz.load._file_state import RACY_NS, FileTask, StatLike, is_racy
from ngcapture_viz.load._index_files import IndexTables
from ngcapture_viz.load._journal import Journals
from ngcapture_viz.load._listing import DirListing, content_matches, prefix_matches

__all__ = ["RefreshPlan", "plan_refresh"]


@dataclass
class RefreshPlan:
    """What a refresh reads, and what it keeps of the saved index."""

    tasks: list[FileTask] = field(default_factory=list)
    #: The files whose rows before ``consumed`` stay, as a column (a set of every name cost
    #: an append to 358k files ~0.1 s).
    keep: pl.Series = field(default_factory=lambda: pl.Series("name", [], dtype=pl.String()))
    #: Files modified near their last scan whose content hash matched now, old enough to be
    #: trusted by mtime from here on (the index records that, or every open re-hashes them).
    settled: set[str] = field(default_factory=set)
    #: The facts journals, read for the files about to be read (``None``: none, or verify).
    journals: Journals | None = None
    #: Every file of the listing is unchanged since the saved index (``keep`` then stays
    #: empty: nothing is merged, the saved tables are the rows).
    everything_kept: bool = False
    reused: int = 0
    appended: int = 0
    reread: int = 0
    new: int = 0
    removed: int = 0


def plan_refresh(
    root: Path,
    listing: DirListing,
    old: IndexTables | None,
    scan_ns: int,
    *,
    verify: bool,
) -> RefreshPlan:
    """Decide per file of ``listing``: reuse, append or re-read, against the saved ``old``.

    Example:
        >>> plan = plan_refresh(root, DirListing.read(root), None, time.time_ns(),
        ...                     verify=False)  # doctest: +SKIP
        >>> plan.new == len(plan.tasks)  # doctest: +SKIP
        True
    """
    plan = RefreshPlan()
    kept = plan.keep
    appends: list[str] = []  # files kept and read on from where they were read to
    previous: dict[str, dict[str, Any]] = {}
    outside: pl.Series | None = None  # by row of the listing: not kept (aligned rows only)
    if old is not None:
        joined, keep, recheck, aligned = _compare(listing, old)
        # Every file listed is one the index holds, unchanged and not racy, and the index
        # holds no other (the usual warm open): nothing to read, nothing to build per file.
        # Through the join, distinct names count: a damaged files table holding a name twice
        # must not stand in for a file it lacks.
        unchanged = int(keep.sum()) if aligned else joined["name"].filter(keep).n_unique()
        if unchanged == listing.data_frame.height == old.files.height:
            plan.reused, plan.everything_kept = unchanged, True
            return plan
        if aligned:
            outside = ~keep
        checked, checked_rows = _content_checked(root, joined, recheck, scan_ns, plan.settled)
        kept = pl.concat(
            [joined["name"].filter(keep), pl.Series("name", checked, dtype=pl.String())]
        )
        if outside is not None and checked_rows:
            outside = outside.scatter(checked_rows, False)
        plan.reused = kept.n_unique() if outside is None else kept.len()
        changed = joined.filter(~keep).select(old.files.columns)
        matched = set(checked)
        previous = {
            row["name"]: row for row in changed.iter_rows(named=True) if row["name"] not in matched
        }
        if outside is None:
            # Gone from the directory (a file that could not be stat'ed is still there).
            present = listing.data_frame["name"]
            plan.removed = old.files.height - int(old.files["name"].is_in(present.implode()).sum())
    prefix = str(root) + os.sep  # pathlib costs ~6 µs a join: too much per file
    todo = listing.files_outside(kept) if outside is None else listing.files_where(outside)
    plan.journals = journals = _read_journals(
        root, listing, todo, scan_ns=scan_ns, old=old, previous=previous, verify=verify
    )
    tasks = plan.tasks
    for rollout_id, name, stat in todo:
        path = prefix + name
        row = previous.get(name)
        if stat is None:  # could not be stat'ed: the scan reports why
            tasks.append(FileTask(path, name, rollout_id, scan_ns=scan_ns))
            continue
        size = stat.st_size
        if row is None:
            plan.new += 1
            tasks.append(FileTask(path, name, rollout_id, scan_ns=scan_ns, size=size))
        elif (
            stat.st_ino == row["inode"]
            and stat.st_size >= row["consumed"]
            and (stat.st_size > row["size"] or stat.st_mtime_ns == row["mtime_ns"])
            and (
                prefix_matches(path, row)
                if row["head_hash"] is not None
                # Read from a journal before (nothing hashed): an append only if it
                # grew and the journal still accounts for all of it, old end included
                # (unchanged but racy, it is read again, as a hash could not vouch).
                else stat.st_size > row["size"]
                and _journal_vouches(journals, name, row["consumed"])
            )
        ):
            plan.appended += 1
            appends.append(name)
            tasks.append(
                FileTask(
                    path,
                    name,
                    rollout_id,
                    start=row["consumed"],
                    call_index=row["next_call_index"],
                    line=row["next_line"],
                    scan_ns=scan_ns,
                    size=size,
                )
            )
        else:
            plan.reread += 1
            tasks.append(FileTask(path, name, rollout_id, scan_ns=scan_ns, size=size))
    plan.keep = pl.concat([kept, pl.Series("name", appends, dtype=pl.String())])
    return plan


def _content_checked(
    root: Path, joined: pl.DataFrame, recheck: pl.Series, scan_ns: int, settled: set[str]
) -> tuple[list[str], list[int]]:
    """The names and rows of ``joined`` among the unchanged-looking files modified near their
    scan (``recheck``) whose content hash still matches (only that is trusted of them); those
    old enough now to be trusted by mtime from here on are added to ``settled``."""
    names: list[str] = []
    rows: list[int] = []
    for candidate in joined.with_row_index("_row").filter(recheck).iter_rows(named=True):
        if content_matches(root / candidate["name"], candidate):
            names.append(candidate["name"])
            rows.append(candidate["_row"])
            if not is_racy(candidate["now_mtime"], scan_ns):
                settled.add(candidate["name"])  # hash-checked once: trust mtime
    return names, rows


def _compare(
    listing: DirListing, old: IndexTables
) -> tuple[pl.DataFrame, pl.Series, pl.Series, bool]:
    """The listing's stats beside the index's file states (``joined``), and per row whether
    the file is unchanged and not racy (``keep``) or unchanged but racy (``recheck``: its
    content hash decides). The saved states have no nulls (``read_tables`` refuses a table
    with any).

    ``aligned``: the rows are the listing's data files, in order (the listing's names, each
    once and sorted, are the index's row for row). They are then compared side by side: no
    join, no distinct count, nothing gone (~0.2 s of an append to 358k files). A file that
    could not be stat'ed has no row here and is re-read."""
    current = listing.stat_frame
    same = (
        (pl.col("now_inode") == pl.col("inode"))
        & (pl.col("now_size") == pl.col("size"))
        & (pl.col("now_mtime") == pl.col("mtime_ns"))
        & (pl.col("consumed") == pl.col("size"))
    )
    racy = pl.col("now_mtime") >= pl.col("scanned_ns") - RACY_NS
    aligned = current.height == listing.data_frame.height and _same_names(
        current["name"], old.files["name"]
    )
    if aligned:
        joined = pl.concat([current.drop("name"), old.files], how="horizontal")
    else:
        joined = current.join(old.files, on="name", how="inner")
    flags = joined.select((same & ~racy).alias("keep"), (same & racy).alias("recheck"))
    return joined, flags["keep"], flags["recheck"], aligned


def _read_journals(
    root: Path,
    listing: DirListing,
    todo: Sequence[tuple[str, str, StatLike | None]],
    *,
    scan_ns: int,
    old: IndexTables | None,
    previous: dict[str, dict[str, Any]],
    verify: bool,
) -> Journals | None:
    """The facts journals, read once for the files about to be read (the planner asks
    them about appends, the scan takes rows from them); ``None`` without any, or when
    ``verify`` (which reads every line). With a saved index, each journal is read from
    where it ended before that index's refresh, and a file the index read to its end
    is checked from there (``previous``: the saved states of the changed files)."""
    if verify or not (root / JOURNAL_DIR).is_dir():
        return None
    # ``todo``: the files not kept, each with its stat (regular files), or None.
    stats = {name: stat for _, name, stat in todo if stat is not None}
    if not stats:  # a warm open: no file to read
        return None
    # A file modified within the racy window is read from its lines; the journal still
    # says whether what was read of it before is intact (an append).
    racy = {name for name, stat in stats.items() if is_racy(stat.st_mtime_ns, scan_ns)}
    # A refresh that reads few files decodes most entries only as far as their file.
    sparse = len(stats) * 4 < listing.stat_frame.height
    # A file that grew since the index read it to its end is checked from there (its
    # entries may be only in the part of the journals read); any other from offset 0.
    bases = {
        name: (row["size"], row["mtime_ns"])
        for name, row in previous.items()
        if name in stats and row["inode"] == stats[name].st_ino
        and row["consumed"] == row["size"] < stats[name].st_size
    }  # fmt: skip
    return Journals(
        str(root), stats, sparse=sparse, racy=racy,
        since=old.journals if old is not None else None, bases=bases,
    )  # fmt: skip


def _same_names(listed: pl.Series, indexed: pl.Series) -> bool:
    """Whether the index's files are the listing's, name for name in the same order (the
    listing names each file once, sorted; an index in another order is matched by the join
    instead): ~5 ms for 358k names, against ~0.1 s for joining them and counting the
    distinct ones."""
    return listed.len() == indexed.len() and listed.equals(indexed, check_names=False)


def _journal_vouches(journals: Journals | None, name: str, consumed: int) -> bool:
    """Whether the journals account for all of ``name`` now, with a line starting at
    ``consumed``: the bytes read before are then the ones the server wrote, and only what
    follows needs reading."""
    return journals is not None and journals.first_at(name, consumed) is not None
