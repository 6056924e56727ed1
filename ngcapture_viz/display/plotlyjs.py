"""When an HTML output must carry plotly.js: once per notebook, again only when its carrier is gone.

The HTML a result shows in a notebook draws its figures with ``window.Plotly``. plotly.js
(~4.8 MB) is embedded in the first such output of a kernel session and in no later one; the
page they share keeps it. This module is the one place that looks at the kernel to decide.

Two kinds of output carry it:

* a *figure* bundle (plotly's JSON and an HTML fallback): a front end with plotly's renderer
  (JupyterLab with the extension, VS Code) draws the JSON and never runs the fallback, so
  plotly.js in it may never load;
* an *HTML-only* output (a run card, dashboard grid, gap report or diff) is always rendered.

So a figure fallback carries plotly.js when nothing has yet, and an HTML-only output when no
HTML-only output has yet: at most two copies per notebook, one when the first output that
draws is HTML-only. A carrier whose cell ran again (its output replaced) or was deleted in
JupyterLab no longer counts. Outside a kernel every output is standalone and carries it.

Example:
    >>> LEDGER.needs_plotlyjs(html_only=True)  # not in a kernel: always
    True
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["LEDGER", "PlotlyJsLedger", "Where", "current_cell"]


@dataclass(frozen=True)
class Where:
    """The cell (JupyterLab's ``cellId`` when sent) and execution an output belongs to."""

    cell: str | None
    execution: int | None
    deleted: frozenset[str] = frozenset()


def current_cell() -> Where | None:
    """The executing cell, or ``None`` outside a Jupyter kernel."""
    ipython_module = sys.modules.get("IPython")
    if ipython_module is None:
        return None
    shell = ipython_module.get_ipython()
    kernel = getattr(shell, "kernel", None)
    if shell is None or kernel is None:
        return None
    metadata: Mapping[str, Any] = {}
    get_parent = getattr(kernel, "get_parent", None)
    if get_parent is not None:
        parent = get_parent()
        if isinstance(parent, Mapping) and isinstance(parent.get("metadata"), Mapping):
            metadata = parent["metadata"]
    cell = metadata.get("cellId")
    deleted = metadata.get("deletedCells")
    return Where(
        cell if isinstance(cell, str) else None,
        getattr(shell, "execution_count", None),
        frozenset(d for d in deleted if isinstance(d, str))
        if isinstance(deleted, list)
        else frozenset(),
    )


class PlotlyJsLedger:
    """Remembers which outputs of this kernel carry plotly.js (see the module docstring)."""

    def __init__(self) -> None:
        self._any: Where | None = None
        self._html: Where | None = None
        self._deleted: set[str] = set()

    def needs_plotlyjs(self, *, html_only: bool, where: Where | None = None) -> bool:
        """Whether the output being made now must embed plotly.js (and record it if so)."""
        here = where if where is not None else current_cell()
        if here is None:
            return True
        self._deleted |= here.deleted
        if html_only:
            if self._html is None or self._gone(self._html, here):
                self._html = self._any = here
                return True
            return False
        if self._any is None or self._gone(self._any, here):
            self._any = here
            return True
        return False

    def reset(self) -> None:
        """Forget every carrier: the next output embeds plotly.js again."""
        self.__init__()  # type: ignore[misc]

    def _gone(self, carrier: Where, here: Where) -> bool:
        if carrier.cell is not None and carrier.cell in self._deleted:
            return True
        same_cell = carrier.cell is not None and carrier.cell == here.cell
        return same_cell and carrier.execution != here.execution


#: The kernel's ledger (one per process).
LEDGER: Final = PlotlyJsLedger()
