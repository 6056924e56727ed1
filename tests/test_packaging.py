"""The project's own packaging builds quietly and ships what it must."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_builds_without_warnings_and_carries_the_package_data(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # this machine's pip configuration names index folders that may be missing: not ours
    ours = [line for line in output.splitlines() if "warning" in line.lower()
            and "is ignored: it is neither a file nor a directory" not in line]  # fmt: skip
    assert ours == [], output
    (wheel,) = tmp_path.glob("ngcapture-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("capture_core/py.typed", "ngcapture_viz/py.typed",
                   "capture_core/collect/data/mcqa_example.jsonl", "capture_core/__init__.py",
                   "ngcapture_viz/display/assets/plotly-basic.min.js",
                   "ngcapture_viz/display/assets/plotly.js-LICENSE"):  # fmt: skip
        assert needed in names
    assert not any(name.startswith(("tests/", "benchmarks/", "notebooks/")) for name in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata).decode()
