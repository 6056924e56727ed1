"""``make demo``'s main job, end to end: finishes, leaves nothing running, reloads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from capture_core import CaptureStore, read_model_call_records


def processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


def test_demo_collects_two_checkpoints_and_stops_everything(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "capture_core.demo", "--out", str(out), "--tasks", "5"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Results are in {out}" in done.stdout
    assert processes_mentioning(str(out)) == []
    for checkpoint in ("ckpt-100", "ckpt-200"):
        rows = [
            orjson.loads(line)
            for line in (out / checkpoint / "rollouts.jsonl").read_bytes().splitlines()
        ]
        failures = (out / checkpoint / "rollouts_failures.jsonl").read_bytes().splitlines()
        assert len(rows) + len(failures) == 10  # 5 tasks x 2 repeats; the injected 429 fails one
        store = CaptureStore(out / checkpoint / "model-calls", create=False)
        for row in rows:
            attachment = row["ng_model_call_capture"]
            calls = read_model_call_records(store, attachment["rollout_id"])
            assert attachment["metrics"]["num_calls"] == len(calls) > 0
