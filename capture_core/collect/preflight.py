"""What a collection checks before it touches anything, and how it keeps earlier data.

* :func:`check_server`: the model URL answers and, when capture directories are given, the
  capture server writes into one of them (their store ids match; see
  :mod:`capture_core.store_id`). A mismatch names both directories.
* :func:`check_output`: an output file with lines is refused unless the run resumes it or
  overwrites it.
* :func:`capture_collisions`: the capture files this run would write that already exist.
* :func:`archive_folder` / :func:`archive_files`: ``--overwrite`` moves earlier data into a
  visible, dated folder beside it (never deletes it).
* :func:`new_run_id` / :func:`run_ids_in`: each run's id, part of its rollout ids, so two runs
  sharing a capture directory never append to each other's files.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx

from capture_core._locking import fsync_dir, os_reason
from capture_core.collect.attempts import CollectError, read_jsonl_rows
from capture_core.exceptions import CaptureStoreError
from capture_core.ids import ROLLOUT_ID_KEY, validate_rollout_id
from capture_core.store import ARCHIVE_PREFIX, CaptureStore
from capture_core.store_id import read_store_id

__all__ = [
    "ARCHIVE_PREFIX",
    "HEALTH_PATH",
    "RUN_ID_KEY",
    "ServerCheck",
    "archive_files",
    "archive_folder",
    "capture_collisions",
    "check_output",
    "check_server",
    "new_run_id",
    "run_ids_in",
    "stamp_run_id",
]

HEALTH_PATH: Final = "/ngcapture/health"
RUN_ID_KEY: Final = "_ng_run_id"
MAX_RUN_ID_LENGTH: Final = 64


@dataclass(frozen=True, slots=True)
class ServerCheck:
    """What the model URL said about itself (``capture_dir`` is ``None`` when it does not say)."""

    url: str
    capture_dir: str | None = None
    store_id: str | None = None


def check_server(model_url: str, dirs: Sequence[Path], *, timeout_s: float = 10.0) -> ServerCheck:
    """Check that ``model_url`` answers and, with ``dirs``, captures into one of them.

    Raises:
        CollectError: nothing answers at the URL; it is not a capture server although capture
            directories were given; it does not capture; or it captures elsewhere.

    Example:
        >>> check_server("http://127.0.0.1:8000", [Path("/abs/model-calls")])  # doctest: +SKIP
        ServerCheck(url='http://127.0.0.1:8000', capture_dir='/abs/model-calls', store_id='5d0f...')
    """
    url = model_url.rstrip("/")
    try:
        answer = httpx.get(url + HEALTH_PATH, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise CollectError(
            f"no server answers at --model-url {model_url}: {_reason(exc)}; start it first "
            "(ngcapture serve) or fix the URL"
        ) from None
    if not dirs:
        return ServerCheck(url)
    capture = _capture_info(answer)
    if capture is None:
        raise CollectError(
            f"{model_url} is not an ngcapture capture server (GET {HEALTH_PATH} answered "
            f"{answer.status_code}), so nothing would be captured into --capture-dir "
            f"{', '.join(map(str, dirs))}: point --model-url at `ngcapture serve`"
        )
    server_dir, server_id = capture.get("dir"), capture.get("store_id")
    if not capture.get("enabled") or not isinstance(server_id, str):
        raise CollectError(
            f"the server at {model_url} does not capture (it was started without "
            f"--capture-dir), but --capture-dir {', '.join(map(str, dirs))} was given"
        )
    for directory in dirs:
        if read_store_id(directory) == server_id:
            return ServerCheck(url, str(server_dir), server_id)
    raise CollectError(
        f"the capture server at {model_url} writes to {server_dir}, but this collect reads "
        f"--capture-dir {', '.join(map(str, dirs))} (a different directory): pass "
        f"--capture-dir {server_dir}, or start the server with the directory you want"
    )


def _capture_info(answer: httpx.Response) -> dict[str, object] | None:
    if answer.status_code != 200:
        return None
    try:
        body = answer.json()
    except ValueError:
        return None
    capture = body.get("capture") if isinstance(body, dict) else None
    return capture if isinstance(capture, dict) else None


def _reason(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection refused or host unreachable"
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    return type(exc).__name__ + (f" ({exc})" if str(exc) else "")


def check_output(output: Path, failures: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to replace an output (or failures) file that holds data, unless asked.

    Raises:
        CollectError: the file has content and neither ``resume`` nor ``overwrite`` is set,
            or it is a directory.
    """
    for path in (output, failures):
        if path.is_dir():
            raise CollectError("the output path is a directory, not a file", path=path)
    if resume or overwrite:
        return
    for path in (output, failures):
        if path.exists() and path.stat().st_size:
            lines = path.read_bytes().count(b"\n")
            raise CollectError(
                f"{path} already holds {lines:,} line(s) of an earlier collect: --resume "
                "continues that run, --overwrite moves the file to a dated folder first "
                "(nothing was changed)"
            )


def capture_collisions(dirs: Sequence[Path], ids: Iterable[str]) -> dict[Path, list[str]]:
    """Per capture directory, the ids among ``ids`` that already have a capture file or marker.

    Example:
        >>> capture_collisions([Path("/abs/model-calls")], ["0-0", "0-1"])  # doctest: +SKIP
        {PosixPath('/abs/model-calls'): ['0-0']}
    """
    wanted = list(ids)
    found: dict[Path, list[str]] = {}
    for directory in dirs:
        store = CaptureStore(directory)
        present = set(store.rollout_ids())
        clashing = [rollout_id for rollout_id in wanted if rollout_id in present]
        if clashing:
            found[store.root] = clashing
    return found


def archive_folder(parent: Path, stamp: str) -> Path:
    """A new, visible, dated folder under ``parent`` (``overwritten-<stamp>[-n]``), created."""
    for n in range(1, 1000):
        folder = parent / f"{ARCHIVE_PREFIX}{stamp}{'' if n == 1 else f'-{n}'}"
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            continue
        return folder
    raise CollectError("no free name for an archive folder", path=parent)


def archive_files(paths: Sequence[Path], folder: Path) -> list[Path]:
    """Move the existing ``paths`` into ``folder`` (same names); returns their new paths."""
    moved: list[Path] = []
    for path in paths:
        if not path.exists():
            continue
        target = folder / path.name
        try:
            os.rename(path, target)
        except OSError as exc:
            raise CaptureStoreError(
                f"could not move an earlier output aside: {os_reason(exc)}", path=path
            ) from exc
        moved.append(target)
    if moved:
        fsync_dir(folder)
        fsync_dir(paths[0].parent)
    return moved


def utc_stamp() -> str:
    """Now as ``YYYYMMDDTHHMMSSZ`` (UTC): sortable, and valid in file names and rollout ids."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def new_run_id() -> str:
    """A fresh run id: the UTC start time and 4 random hex digits.

    Example:
        >>> new_run_id()  # doctest: +SKIP
        '20260611T142301Z-3f2a'
    """
    return f"{utc_stamp()}-{secrets.token_hex(2)}"


def validate_run_id(run_id: str) -> str:
    """``run_id`` if it can prefix rollout ids (a rollout id's characters, at most 64)."""
    try:
        validate_rollout_id(run_id)
    except ValueError as exc:
        raise CollectError(f"invalid run id {run_id!r}: {exc}") from None
    if len(run_id) > MAX_RUN_ID_LENGTH:
        raise CollectError(f"invalid run id {run_id!r}: at most {MAX_RUN_ID_LENGTH} characters")
    return run_id


def stamp_run_id(row: dict[str, object], run_id: str) -> dict[str, object]:
    """``row`` with its run id and the rollout id ``<run_id>.<task>-<rollout>`` (or
    ``<run_id>.<explicit id>``) that it runs under.

    Example:
        >>> stamp_run_id({"_ng_task_index": 3, "_ng_rollout_index": 1}, "r1")["_ng_rollout_id"]
        'r1.3-1'
    """
    explicit = row.get(ROLLOUT_ID_KEY)
    base = explicit if isinstance(explicit, str) else (
        f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"
    )  # fmt: skip
    return {**row, RUN_ID_KEY: run_id, ROLLOUT_ID_KEY: validate_rollout_id(f"{run_id}.{base}")}


def run_ids_in(output: Path) -> set[str | None]:
    """The run ids recorded in an output file (``None`` for lines without one)."""
    return {
        value if isinstance(value := row.get(RUN_ID_KEY), str) else None
        for _, row in read_jsonl_rows(output).rows
    }
