"""Where the notebooks find the demo output, and how they make it when it is missing.

The notebooks read ``results/demo/<checkpoint>/{model-calls/, rollouts.jsonl}`` under the
repository root (what ``make demo`` writes). When it is not there, :func:`demo_dir` runs the
demo once (``python -m capture_core.demo --out results/demo``, about 10 s, loopback only).

``NGCAPTURE_DEMO_DIR`` points the notebooks at another demo folder; ``NGCAPTURE_REPO`` at the
repository root when the notebooks run from a copy elsewhere (the test suite does that).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no lock; start one notebook first
    fcntl = None  # type: ignore[assignment]

CHECKPOINTS = ("ckpt-100", "ckpt-200")


def repo_root() -> Path:
    """The ``ngcapture`` checkout: ``$NGCAPTURE_REPO``, else the first parent with its pyproject."""
    if os.environ.get("NGCAPTURE_REPO"):
        return Path(os.environ["NGCAPTURE_REPO"]).resolve()
    for folder in (Path.cwd(), *Path.cwd().parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and 'name = "ngcapture"' in pyproject.read_text(encoding="utf-8"):
            return folder
    raise FileNotFoundError(
        "cannot find the ngcapture repository above the current directory; "
        "set NGCAPTURE_REPO or NGCAPTURE_DEMO_DIR"
    )


@contextlib.contextmanager
def _only_maker(root: Path) -> Iterator[None]:
    """Hold ``<root>.lock``: two notebooks (or test processes) started together would otherwise
    both make the demo in the same folder, and one read it half-written."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with root.with_name(root.name + ".lock").open("a") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def demo_dir() -> Path:
    """The demo output folder, generated with ``capture_core.demo`` when missing."""
    configured = os.environ.get("NGCAPTURE_DEMO_DIR")
    root = Path(configured).resolve() if configured else repo_root() / "results" / "demo"
    with _only_maker(root):
        if not all((root / name / "rollouts.jsonl").is_file() for name in CHECKPOINTS):
            print(f"generating the demo output in {root} (about 10 s)...")
            done = subprocess.run(
                [sys.executable, "-m", "capture_core.demo", "--out", str(root)],
                capture_output=True,
                text=True,
                check=False,
                timeout=300,
            )
            if done.returncode:
                raise RuntimeError(
                    f"the demo failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
                )
    return root


def checkpoint(name: str) -> tuple[Path, Path]:
    """``(capture_dir, rollouts_jsonl)`` of one demo checkpoint, for ``open_run(*...)``."""
    folder = demo_dir() / name
    return folder / "model-calls", folder / "rollouts.jsonl"
