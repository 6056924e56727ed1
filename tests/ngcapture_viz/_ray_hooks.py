"""Runs in every Ray worker of the Ray index tests (``worker_process_setup_hook``).

A capture file with a ``<name>.poison`` file beside it kills the worker process that starts
parsing it, every time: the test's way of making one file fail twice, without a hook in the
product's code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def setup() -> None:
    from ngcapture_viz.load import ray_engine

    parse = ray_engine.scan_files

    def poisoned(tasks: list[Any], **options: Any) -> Any:
        if any(Path(task.path + ".poison").exists() for task in tasks):
            os._exit(3)
        return parse(tasks, **options)

    ray_engine.scan_files = poisoned  # type: ignore[assignment]
