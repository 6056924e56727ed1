"""Progress bars for long loads: shown in terminals, quiet in notebooks unless asked for."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

__all__ = ["Progress", "progress_bar"]


class Progress(Protocol):
    def update(self, n: int) -> object: ...


class _Silent:
    def update(self, n: int) -> None:
        del n


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    get = getattr(shell, "get_ipython", None)
    instance = get() if get is not None else None
    return instance is not None and type(instance).__name__ == "ZMQInteractiveShell"


@contextmanager
def progress_bar(total: int, desc: str, *, enabled: bool | None) -> Iterator[Progress]:
    """A byte-counting bar on stderr. ``enabled=None`` means: only in a terminal.

    In a notebook the bar is off unless ``enabled=True`` (then tqdm's notebook widget is used
    when ipywidgets is available).
    """
    if enabled is None:
        enabled = sys.stderr.isatty() and not _in_notebook()
    if not enabled:
        yield _Silent()
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False) as bar:
        yield bar
