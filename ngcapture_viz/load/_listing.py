"""What a capture directory holds, and whether a file still holds what was indexed."""

from __future__ import annotations

import os
from collections.abc import Container
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from stat import S_ISREG
from typing import Any, Final, cast

import polars as pl

from capture_core import DATA_SUFFIX, MARKER_SUFFIX, is_valid_rollout_id
from capture_core.failures import read_capture_failures
from capture_core.ids import MAX_ROLLOUT_ID_LENGTH
from capture_core.pending import PendingCall, pending_calls
from capture_core.records import CaptureFailure
from capture_core.store import ARCHIVE_PREFIX
from ngcapture_viz.exceptions import SourceError
from ngcapture_viz.load._file_bytes import PROBE, fingerprint

__all__ = ["DirListing", "content_matches", "prefix_matches"]


STAT_SCHEMA: Final = pl.Schema(
    {"name": pl.String(), "now_inode": pl.Int64(), "now_size": pl.Int64(), "now_mtime": pl.Int64()}
)


DATA_SCHEMA: Final = pl.Schema({"rollout_id": pl.String(), "name": pl.String()})


@dataclass
class DirListing:
    """The entries of a capture directory, sorted into what they are.

    The data files are kept as columns (``data_frame``, ``stat_frame``) and as the Python
    names ``os.listdir`` gave, with their stats: no dict of every file (building two cost a
    warm open of 358k files ~0.3 s); :meth:`files_outside` gives the few a refresh reads."""

    markers: set[str] = field(default_factory=set)  # rollout ids marked incomplete
    pending: list[PendingCall] = field(default_factory=list)  # markers, live or lost
    failures: list[CaptureFailure] = field(default_factory=list)  # from the failure logs
    foreign: list[str] = field(default_factory=list)
    #: The data files, sorted by name: regular ones, and those that could not be stated.
    data_frame: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=DATA_SCHEMA))
    #: The stats of the regular ones as columns (name, inode, size, mtime_ns), for planning.
    stat_frame: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=STAT_SCHEMA))
    names: list[str] = field(default_factory=list)  # ``data_frame``'s names, in its order
    _stats: list[os.stat_result | None] = field(default_factory=list)  # each name's lstat

    def files_outside(self, keep: Container[str]) -> list[tuple[str, str, os.stat_result | None]]:
        """``(rollout_id, name, lstat)`` of the data files not in ``keep``, in name order
        (``None``: it could not be stated). No dict of every file: an open that reads few
        files of a large store looks at those only."""
        cut = len(DATA_SUFFIX)
        return [(name[:-cut], name, stat)
                for name, stat in zip(self.names, self._stats, strict=True)
                if name not in keep]  # fmt: skip

    @classmethod
    def read(cls, root: Path) -> DirListing:
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            raise SourceError(f"capture directory {str(root)!r} does not exist") from None
        except NotADirectoryError:
            raise SourceError(f"capture directory {str(root)!r} is not a directory") from None
        except OSError as exc:
            raise SourceError(f"capture directory {str(root)!r}: {exc.strerror}") from None
        try:
            listing = cls._classify(fd, os.listdir(fd))
        except OSError as exc:
            raise SourceError(f"capture directory {str(root)!r}: {exc.strerror}") from None
        finally:
            os.close(fd)
        listing.pending = pending_calls(root)
        listing.failures = read_capture_failures(root).failures
        return listing

    @classmethod
    def _classify(cls, fd: int, names: list[str]) -> DirListing:
        """Sort ``names`` into what they are; data files are ``lstat``-ed relative to ``fd``
        (about twice as fast as by path or through ``DirEntry`` on a large directory; ~5 µs
        each on this overlay file system: the floor of a warm open)."""
        listing = cls()
        try:
            data, markers, foreign = _sort_names(names)
        except (UnicodeEncodeError, pl.exceptions.PolarsError):  # a name that is not UTF-8
            data, markers, foreign = _sort_names_slowly(names)
        listing.markers = set(markers)
        frame, names_ = data
        stats = _stat_all(fd, names_)
        # The usual case, every data file stated and regular, checked in C (a Python loop
        # over 358k files costs ~0.4 s of a warm open).
        if None not in stats and all(map(S_ISREG, map(_MODE, stats))):
            listing.data_frame, listing.names, listing._stats = frame, names_, stats
            stated, kept = names_, cast("list[os.stat_result]", stats)
        else:
            # A directory or a link named like a capture file is not one.
            regular = [stat is None or S_ISREG(stat.st_mode) for stat in stats]
            listing.data_frame = frame.filter(pl.Series(regular, dtype=pl.Boolean()))
            listing.names = [n for n, r in zip(names_, regular, strict=True) if r]
            listing._stats = [s for s, r in zip(stats, regular, strict=True) if r]
            foreign += [n for n, r in zip(names_, regular, strict=True) if not r]
            stated = [n for n, s in zip(listing.names, listing._stats, strict=True) if s]
            kept = [s for s in listing._stats if s is not None]
        listing.stat_frame = pl.DataFrame(
            {
                "name": stated,
                "now_inode": list(map(_INODE, kept)),
                "now_size": list(map(_SIZE, kept)),
                "now_mtime": list(map(_MTIME, kept)),
            },
            schema=STAT_SCHEMA,
        )
        listing.foreign = sorted(foreign)
        return listing


_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # capture_core.ids.ROLLOUT_ID_PATTERN
_MODE = attrgetter("st_mode")
_INODE = attrgetter("st_ino")
_SIZE = attrgetter("st_size")
_MTIME = attrgetter("st_mtime_ns")


#: ``((rollout ids and names of data files as a frame, the same names), marked rollout ids,
#: foreign names)``, each sorted by name.
_Sorted = tuple[tuple[pl.DataFrame, list[str]], list[str], list[str]]


def _sort_names(names: list[str]) -> _Sorted:
    """``names`` sorted into data files, markers and foreign names; Polars checks the ids of a
    large directory at once, by ``is_valid_rollout_id``'s rules. The data files' names are
    ``names``' own strings, picked by position (turning 358k names back into Python strings
    costs ~0.25 s)."""
    frame = pl.DataFrame({"name": names}, schema={"name": pl.String()}).with_row_index("at")
    frame = frame.sort("name")
    name = pl.col("name")
    owned = name.str.starts_with(".") | name.str.starts_with(ARCHIVE_PREFIX)

    def stem_of(suffix: str) -> tuple[pl.Expr, pl.Expr]:
        stem = name.str.strip_suffix(suffix)
        valid = (
            name.str.ends_with(suffix)
            & stem.str.contains(_ID_PATTERN)
            & ~stem.str.contains("..", literal=True)
            & (stem.str.len_chars() <= MAX_ROLLOUT_ID_LENGTH)
        )
        return stem, valid

    data_stem, is_data = stem_of(DATA_SUFFIX)
    marker_stem, is_marker = stem_of(MARKER_SUFFIX)
    kinds = frame.filter(~owned).with_columns(
        is_data.alias("is_data"), (~is_data & is_marker).alias("is_marker")
    )
    data = kinds.filter("is_data")
    markers = kinds.filter("is_marker").select(marker_stem)["name"].to_list()
    foreign = kinds.filter(~pl.col("is_data") & ~pl.col("is_marker"))["name"].to_list()
    ordered = list(map(names.__getitem__, data["at"].to_list()))
    return (data.select(data_stem.alias("rollout_id"), "name"), ordered), markers, foreign


def _sort_names_slowly(names: list[str]) -> _Sorted:
    """``_sort_names`` one name at a time (names Polars cannot hold: not UTF-8)."""
    data: tuple[list[str], list[str]] = ([], [])
    markers: list[str] = []
    foreign: list[str] = []
    for name in sorted(names):
        if name.startswith((".", ARCHIVE_PREFIX)):
            continue  # tool-owned: .pending, .cleared, the index, overwritten capture...
        stem = name.removesuffix(DATA_SUFFIX)
        if stem != name and is_valid_rollout_id(stem):
            data[0].append(stem)
            data[1].append(name)
            continue
        stem = name.removesuffix(MARKER_SUFFIX)
        if stem != name and is_valid_rollout_id(stem):
            markers.append(stem)
            continue
        foreign.append(name)
    frame = pl.DataFrame({"rollout_id": data[0], "name": data[1]}, schema=DATA_SCHEMA)
    return (frame, data[1]), markers, foreign


def _stat_all(fd: int, names: list[str]) -> list[os.stat_result | None]:
    """``lstat`` of each name relative to ``fd`` (``None`` when it fails), in order. One
    thread: on this overlay file system, threads made 358k ``stat`` calls slower (2.9–3.6 s
    against 1.5–1.7 s), not faster."""
    found: list[os.stat_result | None] = []
    for name in names:
        try:
            found.append(os.stat(name, dir_fd=fd, follow_symlinks=False))
        except OSError:
            found.append(None)
    return found


def content_matches(path: str | Path, row: dict[str, Any]) -> bool:
    """Whether the file's read part still has the full hash recorded at its scan."""
    if row["full_hash"] is None:
        return False
    return _hashes(path, [(0, row["consumed"])]) == [row["full_hash"]]


def prefix_matches(path: str | Path, row: dict[str, Any]) -> bool:
    """Whether the read part still hashes the same: its first and last 4 KiB, and all of it
    when the scan kept a full hash (files modified close to their scan)."""
    consumed = row["consumed"]
    ranges = [(0, min(PROBE, consumed)), (max(0, consumed - PROBE), consumed)]
    expected = [row["head_hash"], row["tail_hash"]]
    if row["full_hash"] is not None:
        ranges.append((0, consumed))
        expected.append(row["full_hash"])
    return _hashes(path, ranges) == expected


def _hashes(path: str | Path, ranges: list[tuple[int, int]]) -> list[str] | None:
    """``fingerprint`` of each byte range of ``path`` (``None`` when it cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return [fingerprint(fd, start, end) for start, end in ranges]
    finally:
        os.close(fd)
