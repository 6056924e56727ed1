"""Stores on object storage: mirror a capture store (and its rollout file) from any fsspec URL.

``open_run("s3://bucket/run-7/model-calls", "s3://bucket/run-7/rollouts.jsonl")`` reads the
objects into a local mirror and opens that, so the frames and gaps are exactly those of a local
copy (same reader, same index, same gap rules) and payloads read back offline. The mirror is
kept under the user cache (``$NGCAPTURE_CACHE_DIR/remote/<hash of the URL>/``, default
``~/.cache/ngcapture/index/remote/...``) and refreshed incrementally:

* an object whose size and version (ETag, generation or mtime) did not change is not fetched;
* an object that grew and whose first and last 4 KiB already held still match is fetched from
  where the copy ends (one range request) and appended to the same local file, so the sidecar
  index, which lives beside the mirror, parses only the appended bytes;
* any other change fetches the object again; an object gone from the store is removed.

Capture itself never writes to object storage (append + fsync + flock need a POSIX file
system); a store is shipped there once finished (see docs/scaling.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

import orjson

from ngcapture_viz.exceptions import MissingExtraError, SourceError
from ngcapture_viz.load.failures import failures_file
from ngcapture_viz.load.index import INDEX_DIR_NAME, default_cache_dir

__all__ = ["Mirror", "MirrorStats", "is_remote", "mirror_sources", "remote_label"]

#: Folders of the store that are never mirrored: indexes, watch states, overwritten captures.
_SKIPPED: Final = (INDEX_DIR_NAME, ".ngcapture-watch", "overwritten-")
_PROBE: Final = 4096
#: Objects fetched per batch of concurrent requests, and bytes per batch at most.
_BATCH: Final = 256
_BATCH_BYTES: Final = 256 * 1024 * 1024
_INSTALL_HINT: Final = "pip install 'ngcapture[s3]'"


def is_remote(location: object) -> bool:
    """Whether ``location`` is a URL of an fsspec file system other than the local one.

    Example:
        >>> is_remote("s3://bucket/run/model-calls"), is_remote("/data/model-calls")
        (True, False)
    """
    if not isinstance(location, str) or "://" not in location:
        return False
    return location.split("://", 1)[0].lower() not in ("", "file", "local")


def remote_label(capture_url: str | None, rollouts_url: str | None) -> str:
    """The default label of a remote run, chosen as for a local one (``model-calls``'s parent)."""
    if capture_url is not None:
        path = PurePosixPath(capture_url.split("://", 1)[1].rstrip("/"))
        return path.parent.name if path.name == "model-calls" else path.name
    assert rollouts_url is not None
    return PurePosixPath(rollouts_url.split("://", 1)[1]).stem


@dataclass
class MirrorStats:
    """What one refresh of a mirror fetched."""

    objects: int = 0
    unchanged: int = 0
    fetched: int = 0
    appended: int = 0
    removed: int = 0
    bytes_fetched: int = 0


class Mirror:
    """A local copy of one remote folder or file, refreshed incrementally.

    Args:
        url: the remote folder (a capture store) or file (a rollout file).
        storage_options: passed to fsspec (for S3: ``endpoint_url``, ``key``, ``secret``,
            ``anon``...; credentials otherwise come from the usual environment and files).
        cache_dir: where mirrors live (default ``default_cache_dir() / "remote"``).
        key: the URL whose hash names the mirror's folder (default ``url``; a rollout file and
            its failures file share their folder's).
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        key: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.fs, self.path = _filesystem(self.url, storage_options or {})
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "remote"
        self.root = root / hashlib.sha256((key or self.url).encode()).hexdigest()[:20]
        name = PurePosixPath(self.path).name
        self.local = self.root / name
        self._state_path = self.root / f".{name}.mirror.json"

    def __repr__(self) -> str:
        return f"Mirror({self.url!r} -> {str(self.local)!r})"

    def sync_folder(self) -> MirrorStats:
        """Bring the local copy of the remote folder up to date.

        Raises:
            SourceError: the folder does not exist or cannot be listed.
        """
        with _remote_errors(self.url, "capture directory"):
            self.fs.invalidate_cache()  # fsspec caches listings: the store may have moved on
            if not self.fs.isdir(self.path):
                raise SourceError(f"capture directory {self.url!r} does not exist")
            listed = self.fs.find(self.path, withdirs=False, detail=True)
        objects = {}
        base = self.path.rstrip("/") + "/"
        for key, info in listed.items():
            relative = key[len(base) :] if key.startswith(base) else None
            if relative and not relative.startswith(_SKIPPED) and not relative.endswith("/"):
                objects[relative] = info
        self.local.mkdir(parents=True, exist_ok=True)
        return self._sync(objects)

    def sync_file(self, *, required: bool, what: str = "rollout file") -> Path | None:
        """Bring the local copy of the remote file up to date; ``None`` when it does not exist
        (and is not ``required``).

        Raises:
            SourceError: a required file does not exist, or the file cannot be read.
        """
        with _remote_errors(self.url, what):
            self.fs.invalidate_cache()
            try:
                info = self.fs.info(self.path)
            except FileNotFoundError:
                info = None
            if info is not None and info.get("type") == "directory":
                raise SourceError(f"{what} {self.url!r} is a directory")
        if info is None:
            self.local.unlink(missing_ok=True)
            self._forget()
            if required:
                raise SourceError(f"{what} {self.url!r} does not exist")
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        self._sync({"": info}, single=True)
        return self.local

    # -- the work -------------------------------------------------------------------------

    def _sync(
        self, objects: Mapping[str, Mapping[str, Any]], *, single: bool = False
    ) -> MirrorStats:
        state = self._read_state()
        stats = MirrorStats(objects=len(objects))
        whole: list[tuple[str, int]] = []
        grown: list[tuple[str, int, int]] = []
        for relative, info in objects.items():
            size, version = int(info.get("size") or 0), _version(info)
            target = self._target(relative)
            known = state.get(relative)
            have = _size(target)
            if known is not None and known == [size, version] and have == size:
                stats.unchanged += 1
            elif have is not None and 0 < have < size and self._prefix_holds(relative, have):
                grown.append((relative, have, size))
            else:
                whole.append((relative, size))
        with _remote_errors(self.url, "store"):
            for batch in _batches(whole):
                stats.bytes_fetched += self._fetch_whole(batch)
                stats.fetched += len(batch)
            for grown_batch in _batches([(r, end - start, start) for r, start, end in grown]):
                stats.bytes_fetched += self._fetch_tails(grown_batch)
                stats.appended += len(grown_batch)
        if not single:
            for relative in set(state).difference(objects):
                self._target(relative).unlink(missing_ok=True)
                stats.removed += 1
        new_state = {r: [int(i.get("size") or 0), _version(i)] for r, i in objects.items()}
        # What was fetched may be newer than what was listed: trust the file's own size.
        for relative in new_state:
            have = _size(self._target(relative))
            if have != new_state[relative][0]:
                new_state[relative] = [have, None]
        self._write_state(new_state)
        return stats

    def _target(self, relative: str) -> Path:
        return self.local / relative if relative else self.local

    def _remote(self, relative: str) -> str:
        return f"{self.path}/{relative}" if relative else self.path

    def _prefix_holds(self, relative: str, have: int) -> bool:
        """Whether the remote object still starts with the bytes of the local copy (its first
        and last 4 KiB): then only the rest needs fetching."""
        ranges = [(0, min(_PROBE, have)), (max(0, have - _PROBE), have)]
        with open(self._target(relative), "rb") as local:
            expected = [os.pread(local.fileno(), end - start, start) for start, end in ranges]
        with _remote_errors(self.url, "store"):
            remote = self.fs.cat_ranges(
                [self._remote(relative)] * 2,
                [start for start, _ in ranges],
                [end for _, end in ranges],
            )
        return list(remote) == expected

    def _fetch_whole(self, batch: list[tuple[str, int, int]]) -> int:
        paths = [self._remote(relative) for relative, _, _ in batch]
        fetched = self.fs.cat(paths, on_error="return") if len(paths) > 1 else None
        total = 0
        for relative, _, _ in batch:
            remote = self._remote(relative)
            data = fetched[remote] if fetched is not None else self.fs.cat_file(remote)
            if isinstance(data, BaseException):
                if isinstance(data, FileNotFoundError):  # gone since it was listed
                    self._target(relative).unlink(missing_ok=True)
                    continue
                raise data
            target = self._target(relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f".{target.name}.mirror-{os.getpid()}")
            temporary.write_bytes(data)
            os.replace(temporary, target)
            total += len(data)
        return total

    def _fetch_tails(self, batch: list[tuple[str, int, int]]) -> int:
        """Fetch each object from where its copy ends to its end; append to the same file."""
        tails = self.fs.cat_ranges(
            [self._remote(relative) for relative, _, _ in batch],
            [start for _, _, start in batch],
            [start + size for _, size, start in batch],
        )
        total = 0
        for (relative, _, start), data in zip(batch, tails, strict=True):
            if isinstance(data, BaseException):
                raise data
            with open(self._target(relative), "r+b") as out:
                out.truncate(start)
                out.seek(start)
                out.write(data)
            total += len(data)
        return total

    # -- state ----------------------------------------------------------------------------

    def _read_state(self) -> dict[str, list[Any]]:
        try:
            data = orjson.loads(self._state_path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        if not isinstance(data, dict) or data.get("url") != self.url:
            return {}
        objects = data.get("objects")
        return objects if isinstance(objects, dict) else {}

    def _write_state(self, objects: dict[str, list[Any]]) -> None:
        temporary = self._state_path.with_name(f"{self._state_path.name}.{os.getpid()}")
        temporary.write_bytes(orjson.dumps({"url": self.url, "objects": objects}))
        os.replace(temporary, self._state_path)

    def _forget(self) -> None:
        self._state_path.unlink(missing_ok=True)


def mirror_sources(
    capture_dir: str | os.PathLike[str] | None,
    rollouts: str | os.PathLike[str] | None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[str | os.PathLike[str] | None, str | os.PathLike[str] | None]:
    """Local paths for ``open_run``'s sources: remote ones mirrored, local ones as given.

    A remote rollout file brings its collector's ``<stem>_failures.jsonl`` along when there is
    one, so failed rollouts read as they do locally.

    Raises:
        SourceError: a remote source does not exist or cannot be read.
        MissingExtraError: fsspec (or the file system's package, such as s3fs) is missing.
    """
    options: dict[str, Any] = {"storage_options": storage_options, "cache_dir": cache_dir}
    if is_remote(capture_dir):
        store = Mirror(str(capture_dir), **options)
        store.sync_folder()
        capture_dir = store.local
    if is_remote(rollouts):
        url = str(rollouts)
        folder = url.rstrip("/").rsplit("/", 1)[0]
        rollouts = Mirror(url, key=folder, **options).sync_file(required=True)
        side = failures_file(Path(PurePosixPath(url.split("://", 1)[1]).name)).name
        failures = Mirror(f"{folder}/{side}", key=folder, **options)
        failures.sync_file(required=False, what="failures file")
    return capture_dir, rollouts


def _filesystem(url: str, options: Mapping[str, Any]) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError as exc:
        raise MissingExtraError(f"reading {url!r} needs fsspec: {_INSTALL_HINT}") from exc
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise MissingExtraError(f"reading {url!r}: {exc} ({_INSTALL_HINT})") from exc
    except ValueError as exc:
        raise SourceError(f"{url!r}: {exc}") from None
    return fs, str(path).rstrip("/")


@contextlib.contextmanager
def _remote_errors(url: str, what: str) -> Iterator[None]:
    """Errors of the remote file system (refused, unreachable, throttled) as ``SourceError``."""
    try:
        yield
    except SourceError:
        raise
    except PermissionError as exc:
        raise SourceError(f"{what} {url!r}: access refused ({exc})") from None
    except FileNotFoundError:
        raise SourceError(f"{what} {url!r} does not exist") from None
    except OSError as exc:
        raise SourceError(f"{what} {url!r}: {exc}") from None


def _version(info: Mapping[str, Any]) -> str | None:
    for key in ("ETag", "etag", "generation", "md5Hash", "version_id", "mtime", "LastModified"):
        value = info.get(key)
        if value is not None:
            return str(value)
    return None


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _batches(items: list[tuple[str, int]] | list[tuple[str, int, int]]) -> Iterator[list[Any]]:
    """Items in groups of at most ``_BATCH`` objects and ``_BATCH_BYTES`` bytes (items are
    ``(relative, size[, start])``; the result always has three fields)."""
    batch: list[tuple[str, int, int]] = []
    weight = 0
    for item in items:
        relative, size = item[0], item[1]
        start = item[2] if len(item) > 2 else 0
        if batch and (len(batch) >= _BATCH or weight + size > _BATCH_BYTES):
            yield batch
            batch, weight = [], 0
        batch.append((relative, size, start))
        weight += size
    if batch:
        yield batch
