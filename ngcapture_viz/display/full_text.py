"""Frames whose text is the point, shown in full: never cut at Polars' 30-odd characters.

Polars cuts every string cell of a printed or notebook-displayed frame at
``fmt_str_lengths`` characters (32 in text, 30 in HTML). That is right for a frame of data,
and wrong for a column's meaning or a gap's detail, where the end of the sentence is the
point. :class:`FullTextFrame` is a ``pl.DataFrame`` that prints and displays its string cells
in full (Polars wraps long cells over several lines) and shows up to :data:`MAX_ROWS` rows;
everything else is plain Polars (a frame derived from it by ``filter`` or ``select`` is a plain
Polars frame again). The user's own ``pl.Config`` is restored after each display.

Example:
    >>> frame = full_text(pl.DataFrame({"meaning": ["a sentence well beyond thirty characters"]}))
    >>> "a sentence well beyond thirty characters" in str(frame)
    True
"""

from __future__ import annotations

from typing import Final

import polars as pl

__all__ = ["MAX_ROWS", "FullTextFrame", "full_text"]

#: Rows shown before Polars elides the middle ones (a schema's columns all fit).
MAX_ROWS: Final = 100
#: Longest string shown whole: far beyond any meaning or detail.
_MAX_CHARS: Final = 100_000


class FullTextFrame(pl.DataFrame):
    """A ``pl.DataFrame`` whose ``print()``, repr and notebook HTML show every string in full."""

    def __str__(self) -> str:
        with _showing_full_text(self):
            return super().__str__()

    def __repr__(self) -> str:
        return self.__str__()

    def _repr_html_(self, *, _from_series: bool = False) -> str:
        with _showing_full_text(self):
            return super()._repr_html_(_from_series=_from_series)


def full_text(frame: pl.DataFrame) -> FullTextFrame:
    """``frame`` (same columns, same data) as a :class:`FullTextFrame`."""
    return frame if isinstance(frame, FullTextFrame) else FullTextFrame(frame)


def _showing_full_text(frame: pl.DataFrame) -> pl.Config:
    """Polars' display options for ``frame``, restored when the ``with`` block ends."""
    return pl.Config(fmt_str_lengths=_MAX_CHARS, tbl_rows=min(max(frame.height, 1), MAX_ROWS))
