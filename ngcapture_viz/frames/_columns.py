"""Column declarations shared by every frame: name, Polars dtype and meaning."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import polars as pl

__all__ = ["UTC_TIME", "Column", "FrameSchema"]

UTC_TIME: Final = pl.Datetime("us", "UTC")


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a frame.

    Attributes:
        name: the column name.
        dtype: its Polars dtype (nullable, like every Polars column).
        doc: what it holds; ``null`` always means unknown, never zero.
    """

    name: str
    dtype: pl.DataType
    doc: str


class FrameSchema:
    """The ordered columns of one frame, with helpers to build and select from it.

    Example:
        >>> schema = FrameSchema("demo", [Column("a", pl.Int64(), "a number")])
        >>> schema.empty().schema
        Schema({'a': Int64})
    """

    def __init__(self, name: str, columns: Sequence[Column]) -> None:
        self.name = name
        self.columns: tuple[Column, ...] = tuple(columns)
        self.polars: Final = pl.Schema({c.name: c.dtype for c in self.columns})

    def __repr__(self) -> str:
        return f"FrameSchema({self.name!r}, {len(self.columns)} columns)"

    def __str__(self) -> str:
        """Every column with its dtype and meaning, the meanings in full (what ``print`` shows)."""
        return f"The {self.name} frame: {len(self.columns)} columns\n{self.describe()}"

    def _repr_html_(self) -> str:
        """Every column with its dtype and meaning, the meanings in full (never cut)."""
        from ngcapture_viz.display._html import table_html
        from ngcapture_viz.display.cards import card

        caption = f"The {self.name} frame: {len(self.columns)} columns"
        table = table_html(
            self.describe(), caption=caption, max_rows=1000, wrap=["dtype", "meaning"]
        )
        return card(table)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def empty(self) -> pl.DataFrame:
        """A frame with no rows and every column typed."""
        return pl.DataFrame(schema=self.polars)

    def from_columns(self, data: Mapping[str, Sequence[Any]]) -> pl.DataFrame:
        """Build a frame from column lists; missing columns are all null, extras are refused."""
        unknown = set(data) - set(self.polars)
        if unknown:
            raise ValueError(f"unknown {self.name} column(s): {sorted(unknown)}")
        height = len(next(iter(data.values()))) if data else 0
        series = [
            pl.Series(name, data[name] if name in data else [None] * height, dtype=dtype)
            for name, dtype in self.polars.items()
        ]
        return pl.DataFrame(series)

    def from_rows(self, rows: Iterable[Mapping[str, Any]]) -> pl.DataFrame:
        """Build a frame from row dictionaries (missing keys are null)."""
        rows = list(rows)
        return self.from_columns({n: [r.get(n) for r in rows] for n in self.names})

    def conform(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Cast ``frame`` to this schema: same columns, same order, declared dtypes."""
        exprs = [
            (pl.col(n) if n in frame.columns else pl.lit(None)).cast(d).alias(n)
            for n, d in self.polars.items()
        ]
        return frame.select(exprs)

    def select(self, frame: pl.DataFrame, columns: Sequence[str] | None) -> pl.DataFrame:
        """Keep ``columns`` (in the given order); unknown names raise with the valid ones."""
        if columns is None:
            return frame
        unknown = [c for c in columns if c not in frame.columns]
        if unknown:
            raise ValueError(
                f"unknown {self.name} column(s) {unknown}; valid columns: {frame.columns}"
            )
        return frame.select(list(columns))

    def describe(self) -> pl.DataFrame:
        """One row per column: name, dtype and meaning (what ``docs/frames.md`` lists).

        Printed or displayed in a notebook, every meaning shows in full (a
        :class:`~ngcapture_viz.display.full_text.FullTextFrame`), never cut at Polars' 30
        characters.
        """
        from ngcapture_viz.display.full_text import full_text

        return full_text(
            pl.DataFrame(
                {
                    "column": [c.name for c in self.columns],
                    "dtype": [str(c.dtype) for c in self.columns],
                    "meaning": [c.doc for c in self.columns],
                }
            )
        )
