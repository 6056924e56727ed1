"""Live export (``LiveExport``, ``watch``, ``ngcapture watch``) against W&B in offline mode.

A finished synthetic run (payloads carrying a planted marker) is replayed into an empty store in
steps: some rollouts' lines land in two halves, rollout records follow their calls with a
``step`` field. While ``watch`` follows the growing store, the offline W&B run must end up with
every call and rollout exactly once, none of the marker, and a restart must add nothing twice.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

from capture_core.testing import RunSpec, write_run
from ngcapture_viz.exceptions import ExportError
from ngcapture_viz.export import LiveExport, PollResult, watch
from tests.ngcapture_viz.test_wandb_export import files_holding, wandb_root

__all__ = ["wandb_root"]  # the module's offline wandb fixture, shared

wandb = pytest.importorskip("wandb")

REPO = Path(__file__).parents[2]


class GrowingRun:
    """A finished run replayed into ``root`` (``model-calls/``, ``rollouts.jsonl``) in steps."""

    def __init__(self, source: Path, root: Path, marker: str) -> None:
        self.marker = marker
        self.capture_dir = root / "model-calls"
        self.capture_dir.mkdir(parents=True)
        self.rollouts = root / "rollouts.jsonl"
        self.rollouts.touch()
        self.files = sorted((source / "model-calls").glob("*.capture.jsonl"))
        self.records = {
            orjson.loads(line)["ng_model_call_capture"]["rollout_id"]: orjson.loads(line)
            for line in (source / "rollouts.jsonl").read_bytes().splitlines()
        }
        self.lines = {f.name: f.read_bytes().splitlines(keepends=True) for f in self.files}
        self.written: dict[str, int] = {}  # file name -> lines written

    def grow(self, names: list[str], *, half: bool = False, step: int) -> None:
        """Append the (first half of the) remaining lines of ``names``; when a rollout's file is
        complete, append its record with ``step``."""
        for name in names:
            lines = self.lines[name]
            done = self.written.get(name, 0)
            upto = max(done + 1, len(lines) // 2) if half else len(lines)
            with open(self.capture_dir / name, "ab") as out:
                out.write(b"".join(lines[done:upto]))
            self.written[name] = upto
            if upto == len(lines):
                rollout_id = name.removesuffix(".capture.jsonl")
                record = {**self.records[rollout_id], "step": step}
                with open(self.rollouts, "ab") as out:
                    out.write(orjson.dumps(record) + b"\n")

    @property
    def calls_written(self) -> int:
        return sum(self.written.values())


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    marker = f"PLANTED-{uuid.uuid4().hex}"
    root = tmp_path_factory.mktemp("finished")
    write_run(root, RunSpec(tasks=5, repeats=2, calls=(2, 6), seed=3, marker=marker))
    return root, marker


@pytest.fixture
def growing(finished: tuple[Path, str], tmp_path: Path) -> GrowingRun:
    source, marker = finished
    return GrowingRun(source, tmp_path / "live", marker)


def logged_rows(wandb_dir: Path, run_id: str, table: str) -> list[dict[str, Any]]:
    """Every row of every ``ngcapture/<table>`` logged by the offline run(s) with ``run_id``
    (a run resumed within the same second gets the same directory name plus ``-1``, ``-2``)."""
    rows = []
    name = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?")
    run_dirs = [d for d in wandb_dir.rglob("offline-run-*") if name.fullmatch(d.name)]
    for run_dir in sorted(run_dirs):
        for path in (run_dir / "files" / "media" / "table" / "ngcapture").glob(
            f"{table}_*.table.json"
        ):
            data = json.loads(path.read_text())
            rows += [dict(zip(data["columns"], row, strict=True)) for row in data["data"]]
    return rows


def wait_for(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_watch_logs_each_call_and_rollout_once_while_the_store_grows(
    wandb_root: Path, growing: GrowingRun
) -> None:
    names = [f.name for f in growing.files]
    results: list[PollResult] = []
    state = growing.capture_dir.parent / "watch-state.json"
    stop = threading.Event()
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            watch(
                growing.capture_dir,
                growing.rollouts,
                project="ngcapture-watch-test",
                state=state,
                step_field="step",
                interval=0.05,
                stop=stop,
                on_poll=results.append,
            )
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    def logged_calls() -> int:
        return orjson.loads(state.read_bytes())["calls_logged"] if state.exists() else 0

    thread = threading.Thread(target=follow)
    thread.start()
    try:
        growing.grow(names[:3], half=True, step=10)  # three rollouts, half their calls each
        wait_for(lambda: errors or logged_calls() >= growing.calls_written)
        growing.grow(names[:3], step=20)  # their second halves, and their records
        growing.grow(names[3:6], step=20)
        wait_for(lambda: errors or logged_calls() >= growing.calls_written)
        growing.grow(names[6:8], half=True, step=30)
        wait_for(lambda: errors or logged_calls() >= growing.calls_written)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors
    assert not thread.is_alive()
    first = orjson.loads(state.read_bytes())
    run_id = first["run_id"]

    # A restart: the rest of the store lands, the watch runs again from its state.
    growing.grow(names[6:], step=40)
    assert (
        watch(
            growing.capture_dir,
            growing.rollouts,
            project="ngcapture-watch-test",
            state=state,
            step_field="step",
            max_polls=1,
            interval=0,
        )
        == 1
    )
    after = orjson.loads(state.read_bytes())
    assert after["run_id"] == run_id
    # ...and once more with nothing new: no batch at all.
    assert watch(growing.capture_dir, growing.rollouts, project="ngcapture-watch-test",
                 state=state, max_polls=1, interval=0) == 0  # fmt: skip
    assert orjson.loads(state.read_bytes())["batches"] == after["batches"]

    wandb_dir = wandb_root / "wandb_dir"
    calls = logged_rows(wandb_dir, run_id, "calls")
    expected = {
        (f.name.removesuffix(".capture.jsonl"), i)
        for f in growing.files
        for i in range(len(growing.lines[f.name]))
    }
    counted = Counter((row["rollout_id"], row["call_index"]) for row in calls)
    assert set(counted) == expected
    assert max(counted.values()) == 1, [k for k, n in counted.items() if n > 1]
    assert len({row["model_call_id"] for row in calls}) == len(expected)
    rollouts = logged_rows(wandb_dir, run_id, "rollouts")
    assert sorted(r["rollout_id"] for r in rollouts) == sorted(growing.records)
    # Steps come from the rollout rows (step_field); batches with calls only keep the last.
    steps = {r["rollout_id"]: r["step"] for r in rollouts}
    assert {steps[n.removesuffix(".capture.jsonl")] for n in names[:6]} == {20}
    assert {steps[n.removesuffix(".capture.jsonl")] for n in names[6:]} == {40}
    # Payload-free: the marker planted in every payload is in the store, never in W&B's files.
    assert files_holding(growing.capture_dir, growing.marker.encode())
    assert files_holding(wandb_root, growing.marker.encode()) == []
    assert sum(r.calls for r in results) == first["calls_logged"]


def test_a_replaced_capture_file_is_logged_again_and_a_pending_batch_resolved(
    wandb_root: Path, growing: GrowingRun, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f.name for f in growing.files]
    growing.grow(names[:2], step=1)
    state = growing.capture_dir.parent / "state.json"
    with LiveExport(growing.capture_dir, growing.rollouts, project="ngcapture-watch-test",
                    state=state) as live:  # fmt: skip
        assert live.poll().calls == growing.calls_written
        # The collector moved the file away and a new attempt wrote the same name again.
        replaced = growing.capture_dir / names[0]
        replaced.rename(growing.capture_dir.parent / "old.jsonl")
        replaced.write_bytes(b"".join(growing.lines[names[1]][:2]))  # other calls, new first id
        again = live.poll()
        assert (again.calls, again.rollouts) == (2, 0)
        run_id = live.wandb_run.id  # type: ignore[union-attr]
    # A batch handed to W&B just before a crash, its commit never written: an offline run
    # cannot say whether it arrived, so it is logged again (at least once), with a warning.
    saved = orjson.loads(state.read_bytes())
    growing.grow(names[2:3], step=2)
    with LiveExport(growing.capture_dir, growing.rollouts, project="ngcapture-watch-test",
                    state=state) as live:  # fmt: skip
        first = live.poll()
    assert first.calls == len(growing.lines[names[2]])
    crashed = orjson.loads(state.read_bytes())
    crashed["pending"] = {"batch": crashed["batches"], "state": crashed | {"pending": None}}
    for key in ("batches", "files", "records", "calls_logged", "rollouts_logged", "step"):
        crashed[key] = saved[key]
    crashed["pending"]["state"].pop("pending")
    crashed["pending"]["state"].pop("format")
    state.write_bytes(orjson.dumps(crashed))
    with LiveExport(growing.capture_dir, growing.rollouts, project="ngcapture-watch-test",
                    state=state) as live:  # fmt: skip
        retry = live.poll()
    assert retry.calls == first.calls
    assert "may or may not have reached W&B" in caplog.text
    assert orjson.loads(state.read_bytes())["run_id"] == run_id


def test_a_state_of_another_wandb_run_is_refused(
    wandb_root: Path, growing: GrowingRun, tmp_path: Path
) -> None:
    growing.grow([growing.files[0].name], step=1)
    state = tmp_path / "state.json"
    state.write_bytes(orjson.dumps({"format": 1, "run_id": "elsewhere", "batches": 3,
        "step": 1, "calls_logged": 0, "rollouts_logged": 0, "files": {}, "records": {},
        "pending": None}))  # fmt: skip
    run = wandb.init(project="ngcapture-watch-test")
    try:
        live = LiveExport(growing.capture_dir, wandb_run=run, state=state)
        with pytest.raises(ExportError, match="elsewhere"):
            live.poll()
    finally:
        run.finish()
    with pytest.raises(ExportError, match="no number"):
        LiveExport(growing.capture_dir, checkpoint="final", state=state)


def test_checkpoint_label_gives_the_step(wandb_root: Path, growing: GrowingRun) -> None:
    growing.grow([growing.files[0].name], step=1)
    with LiveExport(growing.capture_dir, growing.rollouts, project="ngcapture-watch-test",
                    checkpoint="ckpt-1200", state=growing.capture_dir.parent / "s.json") as live:  # fmt: skip
        assert live.poll().step == 1200
        growing.grow([growing.files[1].name], step=5)
        assert live.poll(step=7).step == 7  # an explicit step wins


def test_ngcapture_watch_follows_stops_on_sigint_and_resumes(
    wandb_root: Path, growing: GrowingRun
) -> None:
    wandb_env = dict(os.environ)  # the offline, local-only wandb of the wandb_root fixture
    names = [f.name for f in growing.files]
    state = growing.capture_dir.parent / "cli-state.json"
    command = [
        sys.executable, "-m", "capture_core.cli", "watch",
        "--capture-dir", str(growing.capture_dir), "--rollouts", str(growing.rollouts),
        "--project", "ngcapture-watch-cli", "--state", str(state), "--step-field", "step",
        "--interval", "0.2",
    ]  # fmt: skip

    def logged() -> int:
        return orjson.loads(state.read_bytes())["calls_logged"] if state.exists() else 0

    growing.grow(names[:4], step=1)
    proc = subprocess.Popen(command, cwd=REPO, env=wandb_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: proc.poll() is not None or logged() >= growing.calls_written)
        growing.grow(names[4:7], step=2)
        wait_for(lambda: proc.poll() is not None or logged() >= growing.calls_written)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "stopped" in out
    growing.grow(names[7:], step=3)
    done = subprocess.run([*command, "--once"], cwd=REPO, env=wandb_env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = orjson.loads(state.read_bytes())["run_id"]
    calls = logged_rows(wandb_root / "wandb_dir", run_id, "calls")
    keys = Counter((row["rollout_id"], row["call_index"]) for row in calls)
    assert sum(keys.values()) == len(keys) == growing.calls_written
    frame = pl.DataFrame(logged_rows(wandb_root / "wandb_dir", run_id, "rollouts"))
    assert frame["rollout_id"].n_unique() == frame.height == len(growing.records)
    assert files_holding(wandb_root, growing.marker.encode()) == []
