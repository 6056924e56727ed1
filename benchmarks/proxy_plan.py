"""The proxy benchmark's plan: where results go, the load shape, the configurations measured.

``Target`` is one configuration in front of the worker (the worker itself, ngcapture with capture
off or on, NeMo Gym); ``Plan`` is a run's size. Shared by the measuring loop (``proxy``), the
report (``proxy_report``) and the profile mode (``proxy_profile``).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import capture_core
from capture_core.testing.processes import ServiceProcess

OUT = Path(os.environ.get("NGCAPTURE_BENCH_OUT", "results/bench"))
ROLLOUT_IDS = 64
CONCURRENCY = 64


@dataclass
class Target:
    name: str
    service: ServiceProcess
    prefixed: bool  # /ng-rollout/<id> in front of the path
    capture_dir: Path | None
    is_proxy: bool  # False for the worker itself

    def path_for(self, index: int) -> str:
        if self.prefixed:
            return f"/ng-rollout/bench-{index % ROLLOUT_IDS}/v1/chat/completions"
        return "/v1/chat/completions"


@dataclass
class Plan:
    rounds: int
    seconds: float
    requests: int
    gym: bool


def _code_identity() -> str:
    """Which capture_core the ngcapture processes run: its tree, commit and whether it is dirty."""
    root = Path(capture_core.__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "capture_core"],
            check=False,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{root} (not a git checkout)"
    return f"{root} at {head}" + (" with uncommitted changes in capture_core/" if dirty else "")
