"""Shared styling of the figures: one colour per run, everywhere.

Example:
    >>> run_colors(["ckpt-100", "ckpt-200"])["ckpt-200"]
    '#EF553B'
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any, Final

import plotly.colors
import polars as pl

__all__ = ["DASHES", "array", "run_colors"]

#: Line dashes that tell apart the groups (model · dialect) of one run, whose colour is shared.
DASHES: Final = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def run_colors(runs: Sequence[str]) -> dict[str, str]:
    """One colour per run, the same in every panel and figure of a dashboard."""
    palette = plotly.colors.qualitative.Plotly
    return {run: palette[n % len(palette)] for n, run in enumerate(runs)}


_NUMPY: Final = importlib.util.find_spec("numpy") is not None


def array(series: pl.Series) -> Any:
    """A column for a large trace: a numpy array when numpy is there (plotly validates it in
    one step instead of value by value), else a list."""
    return series.to_numpy() if _NUMPY else series.to_list()
