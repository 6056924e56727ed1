"""Whether the figures being built are validated by plotly, property by property.

The public figure functions return validated figures. The dashboard widget redraws the same
figures on every filter change and only sends their JSON: inside :func:`unvalidated` the
builders skip plotly's validation (``_validate=False`` on the figure and its traces: values are
stored as given) and copy a subplot grid made once instead of making it again: about 0.17 s
of the 0.47 s of kernel CPU a filter change took at 100,000 calls (docs/benchmarks.md). The JSON
must not change: builders give plotly values in the form validation would store them
(``{"text": ...}`` titles, plain lists or numpy arrays), and a test compares both paths' JSON.

Example:
    >>> with unvalidated():
    ...     fig = new_figure()
    >>> fig._validate
    False
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final, TypeVar

from plotly.subplots import make_subplots

from ngcapture_viz.display.figure import Figure

__all__ = ["new_figure", "subplots", "trace", "unvalidated"]

_VALIDATE: Final[ContextVar[bool]] = ContextVar("ngcapture_validate_figures", default=True)
_Trace = TypeVar("_Trace")
#: Unvalidated subplot grids (their layout without a template, ``_grid_ref``, ``_grid_str``)
#: by their options, the titles' text aside.
_GRIDS: Final[dict[str, tuple[dict[str, Any], Any, Any]]] = {}


@contextmanager
def unvalidated() -> Iterator[None]:
    """Figures and traces built inside skip plotly's validation."""
    token = _VALIDATE.set(False)
    try:
        yield
    finally:
        _VALIDATE.reset(token)


def new_figure() -> Figure:
    """An empty :class:`Figure`, validated unless built inside :func:`unvalidated`."""
    return Figure(_validate=_VALIDATE.get())


def trace(kind: Callable[..., _Trace], **props: Any) -> _Trace:
    """``kind(**props)`` (a plotly trace class), validated unless inside :func:`unvalidated`."""
    return kind(**props, _validate=_VALIDATE.get())


def subplots(*, subplot_titles: Sequence[str], **options: Any) -> Figure:
    """``make_subplots(figure=new_figure(), subplot_titles=..., **options)``.

    Inside :func:`unvalidated`, a copy of the grid made once for these options, with these
    titles and the current default template: making the grid (domains, axes, title annotations
    through plotly's update path) cost more than anything else in a figure. Title annotations
    sit where the grid puts them, whatever their text.
    """
    if _VALIDATE.get():
        validated: Figure = make_subplots(
            figure=new_figure(), subplot_titles=subplot_titles, **options
        )
        return validated
    key = repr((len(subplot_titles), sorted(options.items())))
    if key not in _GRIDS:
        grid = make_subplots(figure=new_figure(), subplot_titles=subplot_titles, **options)
        layout = {k: v for k, v in grid._layout.items() if k != "template"}
        _GRIDS[key] = copy.deepcopy((layout, grid._grid_ref, grid._grid_str))
    layout, grid_ref, grid_str = copy.deepcopy(_GRIDS[key])
    for annotation, title in zip(layout["annotations"], subplot_titles, strict=True):
        annotation["text"] = title
    # No template in the copy: the figure takes the default one of now, as new_figure() does.
    spec = {"data": [], "layout": layout, "_grid_ref": grid_ref, "_grid_str": grid_str}
    return Figure(spec, _validate=False)
