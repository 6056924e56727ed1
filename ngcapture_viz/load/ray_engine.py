"""The index build on a Ray cluster: the same per-file parsing, another scheduler.

``CaptureIndex(..., engine="ray")`` (``open_run(..., engine="ray")``, ``ngcapture index DIR
--ray [ADDRESS]``) hands the files to parse to Ray instead of parsing them in this process. The
files are cut, in name order, into parts of about equal bytes (several per CPU of the cluster,
so a slow or restarted part does not hold up the end); each part is one Ray task that runs
:func:`ngcapture_viz.load._scan.scan_files`, the very function the local build runs, and writes
its rows as Parquet (the index's four tables) into a folder of the index, so the workers write
in parallel. The driver then reads the parts back and merges and saves them like a local build,
so the index is the same Parquet index and a later open on one machine reuses it (warm or
incremental) as if it had been built locally.

Failures: a worker that dies (killed, out of memory, its node lost) fails its task, which Ray
runs again once (``max_retries=1``). A part that fails twice is split into one task per file;
a file whose own task fails twice becomes a ``capture_file_unreadable`` gap naming the failure.
No row is ever dropped silently.

Every node must have ngcapture installed (the same version) and see the store at the same
path (a shared file system), as must the index's folder.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

import polars as pl

from ngcapture_viz.exceptions import CaptureIndexError, MissingExtraError
from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.frames.gaps import GAPS
from ngcapture_viz.frames.tool_calls import TOOL_CALLS
from ngcapture_viz.load._scan import FileState, FileTask, ScanResult, scan_files

__all__ = ["PART_BYTES", "plan_parts", "ray_session", "scan_on_ray"]

#: Bytes per task at most, and at least (below, the task's overhead dominates).
PART_BYTES: Final = 256 * 1024 * 1024
MIN_PART_BYTES: Final = 8 * 1024 * 1024
#: Parts per CPU of the cluster: enough that a retried part does not hold up the end.
PARTS_PER_CPU: Final = 4
_TABLES: Final = ("calls", "tool_calls", "damaged")
_INSTALL_HINT: Final = "pip install 'ngcapture[ray]'"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MissingExtraError(f"building the index on Ray needs ray: {_INSTALL_HINT}") from exc
    return ray


@contextmanager
def ray_session(address: str | None) -> Iterator[Any]:
    """Ray, connected: the session already open in this process, else ``address``
    (``"auto"``: the cluster ``RAY_ADDRESS`` or ``ray start`` names, else a new local one on
    127.0.0.1). A connection opened here is closed on the way out, whatever happens."""
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    try:
        if address in (None, "auto"):
            try:
                ray.init(address="auto", **options)
            except ConnectionError:
                _start_local(ray, options)
        else:
            ray.init(address=address, **options)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise CaptureIndexError(
            f"could not connect to the Ray cluster {address!r}: {exc}"
        ) from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _start_local(ray: Any, options: dict[str, Any]) -> None:
    """A one-machine cluster for this build, reachable from this machine only: Ray's
    single-node mode binds and advertises 127.0.0.1 (by default it would turn 127.0.0.1 into
    the machine's network address)."""
    constants: Any = getattr(getattr(ray, "_private", None), "ray_constants", None)
    before = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if before is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address="local", _node_ip_address="127.0.0.1", **options)
    finally:
        if before is not None:
            constants.ENABLE_RAY_CLUSTER = before


def plan_parts(sizes: list[int], cpus: int) -> list[list[int]]:
    """Indices of consecutive tasks cut into parts of about equal bytes.

    Example:
        >>> plan_parts([10, 10, 10, 10], cpus=1)  # tiny: one part
        [[0, 1, 2, 3]]
    """
    total = sum(sizes)
    target = total // max(1, cpus * PARTS_PER_CPU)
    target = min(PART_BYTES, max(MIN_PART_BYTES, target))
    parts: list[list[int]] = [[]]
    weight = 0
    for n, size in enumerate(sizes):
        if parts[-1] and weight + size > target:
            parts.append([])
            weight = 0
        parts[-1].append(n)
        weight += size
    return [part for part in parts if part]


def scan_on_ray(
    tasks: list[FileTask],
    sizes: list[int],
    *,
    places: list[Path],
    address: str | None = None,
    verify: bool = False,
    on_progress: Callable[[int], object] | None = None,
) -> ScanResult:
    """Parse ``tasks`` on Ray (see the module docstring). The parts go to a scratch folder in
    the first of the index's ``places`` that can be written (removed afterwards). Returns the
    rows as :func:`scan_files` would.

    Raises:
        MissingExtraError: ray is not installed.
        CaptureIndexError: no place can be written, no cluster could be reached, or the
            workers' parts are not visible here (not a file system the cluster shares).
    """
    scratch = _scratch(places)
    try:
        with ray_session(address) as ray:
            return _scan(ray, tasks, sizes, scratch=scratch, verify=verify, progress=on_progress)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _scratch(places: list[Path]) -> Path:
    errors = []
    for place in places:
        scratch = place / f"ray-{uuid.uuid4().hex[:12]}"
        try:
            scratch.mkdir(parents=True)
        except OSError as exc:
            errors.append(f"{place}: {exc.strerror or exc}")
            continue
        return scratch
    raise CaptureIndexError("no place for the Ray workers' parts: " + "; ".join(errors))


def _scan(
    ray: Any,
    tasks: list[FileTask],
    sizes: list[int],
    *,
    scratch: Path,
    verify: bool,
    progress: Callable[[int], object] | None,
) -> ScanResult:
    remote = ray.remote(num_cpus=1, max_retries=1, retry_exceptions=False)(_scan_part)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    pending: dict[Any, list[int]] = {}

    def submit(indices: list[int]) -> None:
        part = uuid.uuid4().hex[:12]
        shard = [asdict(tasks[n]) for n in indices]
        pending[remote.remote(shard, str(scratch), part, verify)] = indices

    for indices in plan_parts(sizes, cpus):
        submit(indices)
    done: list[dict[str, Any]] = []
    unreadable: list[tuple[str, str]] = []
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        indices = pending.pop(ready[0])
        try:
            done.append(ray.get(ready[0]))
        except ray.exceptions.RayError as exc:  # the task failed twice (a worker died...)
            if len(indices) > 1:
                for n in indices:  # once more, a file per task: find the file, keep the rest
                    submit([n])
                continue
            reason = " ".join(str(exc).split())[:300]
            unreadable.append((tasks[indices[0]].name, f"the index worker failed twice: {reason}"))
        if progress is not None:
            progress(sum(sizes[n] for n in indices))
    return _collect(scratch, done, unreadable)


def _collect(
    scratch: Path, done: list[dict[str, Any]], unreadable: list[tuple[str, str]]
) -> ScanResult:
    frames: dict[str, list[pl.DataFrame]] = {table: [] for table in _TABLES}
    for part in done:
        for table in _TABLES:
            path = scratch / f"{table}-{part['part']}.parquet"
            if not path.is_file():
                raise CaptureIndexError(
                    f"a Ray worker wrote {path}, which this machine cannot see: the index folder "
                    "must be on a file system the whole cluster shares (--index-dir)"
                )
            frames[table].append(pl.read_parquet(path))
    empty = {"calls": CALLS.empty(), "tool_calls": TOOL_CALLS.empty(), "damaged": GAPS.empty()}
    tables = {
        table: pl.concat(parts, how="vertical_relaxed") if parts else empty[table]
        for table, parts in frames.items()
    }
    decoded: dict[str, int] = {}
    for part in done:
        for key, count in part["decoded"].items():
            decoded[key] = decoded.get(key, 0) + count
    return ScanResult(
        CALLS.conform(tables["calls"]),
        TOOL_CALLS.conform(tables["tool_calls"]),
        GAPS.conform(tables["damaged"]),
        states=[FileState(**state) for part in done for state in part["states"]],
        unreadable=[tuple(u) for part in done for u in part["unreadable"]] + unreadable,
        bytes_parsed=sum(part["bytes_parsed"] for part in done),
        processes=len({part["pid"] for part in done}),
        decoded=decoded,
    )


def _scan_part(
    shard: list[dict[str, Any]], scratch: str, part: str, verify: bool
) -> dict[str, Any]:
    """One Ray task: parse the files of a part with the local build's function and leave its
    rows in ``scratch`` as Parquet (written whole, then renamed: a retry overwrites cleanly)."""
    result = scan_files([FileTask(**task) for task in shard], verify=verify)
    for table in _TABLES:
        frame: pl.DataFrame = getattr(result, table)
        final = Path(scratch) / f"{table}-{part}.parquet"
        temporary = final.with_name(f".{final.name}.{os.getpid()}")
        frame.write_parquet(temporary)
        os.replace(temporary, final)
    return {
        "part": part,
        "pid": os.getpid(),
        "states": [asdict(state) for state in result.states],
        "unreadable": [list(u) for u in result.unreadable],
        "bytes_parsed": result.bytes_parsed,
        "decoded": dict(result.decoded),
    }
