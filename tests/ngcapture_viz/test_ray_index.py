"""The index build on Ray: a local cluster on 127.0.0.1, a worker killed mid-build, a poisoned
file, the CLI. Frames must equal the local build's.

One Ray node for the module: the head on 127.0.0.1 with two CPUs, so two worker processes parse
at once (one CPU each); no dashboard; shut down whatever happens. The 500 MB store is written
once (``benchmarks.load.build_store``: lines of a fixed base set with fresh call ids and the
facts our server writes) with a damaged line and an empty file added.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import ngcapture_viz as ngv
from capture_core.facts_journal import JOURNAL_DIR
from capture_core.testing import RunSpec, write_run
from ngcapture_viz.load.index import CaptureIndex
from ngcapture_viz.load.ray_engine import plan_parts

ray = pytest.importorskip("ray")

REPO = Path(__file__).parents[2]
FRAMES = ("calls", "rollouts", "gaps", "tool_calls")
STORE_BYTES = 500 * 1024 * 1024

pytestmark = [
    pytest.mark.slow,
    # Ray's own import-time and shutdown warnings, not ours.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A Ray node on 127.0.0.1 with two CPUs; yields its GCS address. Its session folder is
    short (Unix socket paths are limited to 107 bytes) and removed afterwards."""
    temp = tempfile.mkdtemp(prefix="ngray-", dir="/tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
        # Single-node mode: every address Ray binds and advertises is 127.0.0.1 (otherwise
        # ray.init turns 127.0.0.1 into the machine's address), here and in subprocesses.
        patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        patch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        patch.delenv("RAY_ADDRESS", raising=False)
        try:
            for attempt in range(2):
                try:
                    ray.init(
                        address="local",
                        num_cpus=2,
                        include_dashboard=False,
                        _node_ip_address="127.0.0.1",
                        object_store_memory=256 * 1024 * 1024,
                        log_to_driver=False,
                        _temp_dir=temp,
                        runtime_env={
                            "worker_process_setup_hook": "tests.ngcapture_viz._ray_hooks.setup"
                        },
                    )
                    break
                except Exception as exc:  # Ray's agents missed its 30 s deadline: once more
                    ray.shutdown()
                    if attempt or "timed out during startup" not in str(exc):
                        raise
            address = ray.get_runtime_context().gcs_address
            assert address.startswith("127.0.0.1:"), address
            yield address
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from benchmarks.load import build_store

    store = tmp_path_factory.mktemp("ray-store") / "model-calls"
    build_store(store, STORE_BYTES)
    for stamp in store.glob("*.json"):
        stamp.unlink()  # the generator's stamp: a foreign file either way, but not ours
    # Without the facts journal the generator writes as our server would: the Ray workers
    # parse lines (what these tests are about), as for a store of another writer.
    shutil.rmtree(store / JOURNAL_DIR)
    with (store / "0-0.capture.jsonl").open("ab") as out:
        out.write(b'{"model_call_id": "torn", broken\n')
    (store / "9999-0.capture.jsonl").touch()
    return store


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-small")
    written = write_run(root, RunSpec(tasks=12, repeats=2, seed=4))
    with (written.capture_dir / "3-1.capture.jsonl").open("ab") as out:
        out.write(b"not json\n")
    return written.capture_dir


def scan_workers() -> list[int]:
    """Pids of Ray worker processes running a part (their title is ``ray::_scan_part``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::_scan_part"):
                found.append(int(entry))
    return found


def frames(run: ngv.CaptureRun) -> dict[str, pl.DataFrame]:
    return {name: getattr(run, name) for name in FRAMES}


def test_parts_are_balanced_and_consecutive() -> None:
    mb = 1024 * 1024
    parts = plan_parts([40 * mb] * 10 + [300 * mb] + [mb] * 50, cpus=2)
    assert [n for part in parts for n in part] == list(range(61))
    assert [11] not in parts and [10] in parts  # a big file is a part of its own
    assert all(len(part) >= 1 for part in parts)


def test_a_ray_build_with_a_worker_killed_gives_the_local_frames(
    cluster: str, big_store: Path, tmp_path: Path
) -> None:
    local = ngv.open_run(big_store, index=False)
    index_dir = tmp_path / "index"
    built: dict[str, Any] = {}

    def build() -> None:
        try:
            built["run"] = ngv.open_run(big_store, index_dir=index_dir, engine="ray")
        except BaseException as exc:
            built["error"] = exc

    thread = threading.Thread(target=build)
    thread.start()
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and thread.is_alive() and time.monotonic() < deadline:
        running = scan_workers()
        if running:
            time.sleep(0.2)  # well into its part
            os.kill(running[0], signal.SIGKILL)
            killed = running[0]
        else:
            time.sleep(0.02)
    thread.join(timeout=600)
    assert not thread.is_alive()
    assert "error" not in built, built.get("error")
    assert killed is not None, "no worker was seen parsing: the build ended too soon to test"
    run: ngv.CaptureRun = built["run"]
    assert run.calls.height == local.calls.height > 90_000
    for name, frame in frames(run).items():
        assert_frame_equal(frame, getattr(local, name), check_row_order=True)
    assert "capture_file_unreadable" not in set(run.gaps["code"].cast(pl.String))

    # The same index opens warm on one machine, and an append is parsed incrementally.
    warm = ngv.open_run(big_store, index_dir=index_dir)
    assert warm.index_stats is not None
    assert (warm.index_stats.bytes_parsed, warm.index_stats.new) == (0, 0)
    line = (big_store / "1-1.capture.jsonl").read_bytes().splitlines(keepends=True)[0]
    with (big_store / "1-2.capture.jsonl").open("ab") as out:
        out.write(line)
    grown = ngv.open_run(big_store, index_dir=index_dir)
    assert grown.index_stats is not None
    assert (grown.index_stats.appended, grown.index_stats.bytes_parsed) == (1, len(line))
    assert grown.calls.height == local.calls.height + 1


def test_a_file_that_kills_its_worker_twice_is_a_gap_and_the_rest_is_kept(
    cluster: str, small_run: Path, tmp_path: Path
) -> None:
    poisoned = small_run / "5-0.capture.jsonl"
    marker = Path(str(poisoned) + ".poison")
    marker.touch()
    try:
        index = CaptureIndex(small_run, index_dir=tmp_path / "index", engine="ray")
        index.refresh()
    finally:
        marker.unlink()
    assert [name for name, _ in index.unreadable] == ["5-0.capture.jsonl"]
    assert "failed twice" in index.unreadable[0][1]
    local = CaptureIndex(small_run, index_dir=tmp_path / "local")
    local.refresh()
    others = pl.col("path") != "5-0.capture.jsonl"
    assert_frame_equal(
        index.calls.sort("path", "call_index"),
        local.calls.filter(others).sort("path", "call_index"),
    )
    run = ngv.open_run(small_run, index=False)
    assert "5-0.capture.jsonl" in set(run.calls["path"].str.split("/").list.last())
    # The next open reads the file the cluster could not, on one machine.
    again = CaptureIndex(small_run, index_dir=tmp_path / "index")
    again.refresh()
    assert again.unreadable == []
    assert_frame_equal(
        again.calls.sort("path", "call_index"), local.calls.sort("path", "call_index")
    )


def test_ngcapture_index_on_a_ray_cluster_by_address(
    cluster: str, small_run: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "capture_core.cli", "index", str(small_run), "--quiet",
         "--index-dir", str(tmp_path / "index"), "--ray", cluster],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "on Ray" in done.stdout and "24 new" in done.stdout
    warm = ngv.open_run(small_run, index_dir=tmp_path / "index")
    assert warm.index_stats is not None and warm.index_stats.bytes_parsed == 0
    assert_frame_equal(warm.calls, ngv.open_run(small_run, index=False).calls)
