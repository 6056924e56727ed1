"""The plotly.js bundles a page can be given: plotly's full one, and a vendored basic one.

plotly's Python package ships the full plotly.js (~4.8 MB, every trace type). Evaluating it is
the largest single cost of a live dashboard's first paint in a fresh page: ~2.1 s in headless
Chromium on this project's 2-core machine, against ~0.37 s for plotly's *basic* partial bundle
(``scatter``, ``bar`` and ``pie`` traces with every shared component: axes, legends, error
bars, annotations; ~1.2 MB). The basic bundle is vendored in ``assets/`` as npm's
``plotly.js-basic-dist-min`` publishes it (MIT, licence beside it; ``make vendor-plotly``
refreshes it for the installed plotly).

A page is offered the basic bundle only for figures whose every trace it draws, and only while
its major version is the one plotly's Python package targets (figure JSON is stable within a
major version); otherwise the full one.

Example:
    >>> bundle_for({"scatter", "bar"})
    'basic'
    >>> bundle_for({"scatter", "scattergl"})
    'full'
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from importlib import resources
from typing import Final, Literal

from plotly.offline import get_plotlyjs

__all__ = [
    "BASIC_TRACES",
    "Bundle",
    "basic_plotlyjs",
    "bundle_for",
    "bundle_source",
    "plotlyjs_version",
]

Bundle = Literal["basic", "full"]

#: Trace types the basic bundle draws.
BASIC_TRACES: Final = frozenset({"scatter", "bar", "pie"})
BASIC_FILE: Final = "plotly-basic.min.js"

_VERSION = re.compile(r"plotly\.js (?:\([^)]*\) )?v(\d+)\.(\d+)\.(\d+)")


def plotlyjs_version(source: str) -> tuple[int, int, int] | None:
    """The version a plotly.js bundle states in its opening comment (``None`` if it does not)."""
    found = _VERSION.search(source, 0, 400)
    if found is None:
        return None
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch)


@functools.cache
def basic_plotlyjs() -> str | None:
    """The vendored basic bundle, or ``None`` when it is missing or of another major version."""
    try:
        source = resources.files("ngcapture_viz.display").joinpath("assets", BASIC_FILE)
        text = source.read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return None
    basic, full = plotlyjs_version(text), plotlyjs_version(get_plotlyjs())
    if basic is None or full is None or basic[0] != full[0]:
        return None
    return text


def bundle_for(trace_types: Iterable[str]) -> Bundle:
    """The lighter bundle that draws every one of ``trace_types``."""
    if basic_plotlyjs() is not None and set(trace_types) <= BASIC_TRACES:
        return "basic"
    return "full"


def bundle_source(bundle: str) -> tuple[Bundle, str]:
    """The bundle to send when a page asks for ``bundle`` (full when basic is unavailable)."""
    basic = basic_plotlyjs() if bundle == "basic" else None
    if basic is not None:
        return "basic", basic
    return "full", get_plotlyjs()
