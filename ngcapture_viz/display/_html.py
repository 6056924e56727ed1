"""Self-contained HTML pieces for the report: page shell, escaped tables, embedded figures.

Nothing here loads anything from the network: plotly.js is inlined once by :func:`page`, each
figure is a ``<div>`` plus the ``Plotly.newPlot`` call that draws it, and every user string
(run labels, rollout ids, error messages, table cells) goes through :func:`html.escape`.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import plotly.io as pio
import polars as pl
from plotly.offline import get_plotlyjs

__all__ = ["MAX_TABLE_ROWS", "Section", "figure_html", "page", "table_html"]

MAX_TABLE_ROWS = 200
UNKNOWN = "—"  # null means unknown, never zero

_CONFIG = {"displaylogo": False, "responsive": True}

_CSS = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #1f2328; background: #fff; }
header { padding: 16px 32px; background: #f6f8fa; border-bottom: 1px solid #d0d7de; }
header h1 { margin: 0 0 4px; font-size: 22px; }
nav a { margin-right: 14px; color: #0969da; text-decoration: none; }
main { padding: 8px 32px 48px; max-width: 1400px; }
section { margin-top: 28px; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
h3 { margin: 20px 0 6px; font-size: 15px; }
p.note { color: #57606a; margin: 4px 0 10px; }
.figure { border: 1px solid #d0d7de; border-radius: 6px; margin: 10px 0 18px; padding: 4px;
          min-height: 420px; }
.table-wrap { overflow-x: auto; max-height: 480px; overflow-y: auto; margin: 6px 0 14px; }
table { border-collapse: collapse; font-size: 12.5px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; white-space: nowrap; }
th { background: #f6f8fa; position: sticky; top: 0; }
td.wrap { white-space: normal; min-width: 18em; max-width: 48em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.unknown { color: #8c959f; }
"""


@dataclass(frozen=True)
class Section:
    """One ``<section>`` of the page: an anchor, a heading and its (already safe) HTML body."""

    anchor: str
    title: str
    body: str


def page(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The whole document: plotly.js inlined exactly once, then the sections in order."""
    nav = "".join(
        f'<a href="#{html.escape(s.anchor)}">{html.escape(s.title)}</a>' for s in sections
    )
    body = "\n".join(
        f'<section id="{html.escape(s.anchor)}"><h2>{html.escape(s.title)}</h2>\n{s.body}\n'
        "</section>"
        for s in sections
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n"
        f"<style>{_CSS}</style>\n"
        f'<script type="text/javascript">{get_plotlyjs()}</script>\n'
        "</head><body>\n"
        f'<header><h1>{html.escape(title)}</h1><p class="note">{html.escape(subtitle)}</p>'
        f"<nav>{nav}</nav></header>\n"
        f"<main>\n{body}\n</main>\n</body></html>\n"
    )


def figure_html(fig: go.Figure, *, caption: str | None = None) -> str:
    """One figure as a ``<div class="plotly-graph-div">`` and its drawing script (no plotly.js).

    Plotly's JSON encoder escapes ``<`` and ``>`` inside strings, so user text in hover labels
    cannot close the ``<script>``.
    """
    inner = pio.to_html(
        fig,
        full_html=False,
        include_plotlyjs=False,
        config=_CONFIG,
        default_width="100%",
        default_height="100%",
    )
    heading = f"<h3>{html.escape(caption)}</h3>" if caption else ""
    return f'{heading}<div class="figure">{inner}</div>'


def table_html(
    frame: pl.DataFrame,
    *,
    max_rows: int = MAX_TABLE_ROWS,
    caption: str | None = None,
    wrap: Sequence[str] = (),
) -> str:
    """``frame`` as an HTML table, every header and cell escaped; nulls shown as unknown.

    At most ``max_rows`` rows are written; a note says how many were left out. Cells of the
    ``wrap`` columns (meanings, details: text that is the point) wrap instead of being cut.
    """
    heading = f"<h3>{html.escape(caption)}</h3>" if caption else ""
    if frame.height == 0:
        return f'{heading}<p class="note">None.</p>'
    shown = frame.head(max_rows)
    numeric = [dtype.is_numeric() for dtype in shown.dtypes]
    wrapped = [name in wrap for name in shown.columns]
    head = "".join(f"<th>{html.escape(name)}</th>" for name in shown.columns)
    rows = []
    for values in shown.iter_rows():
        cells = []
        for value, is_number, wraps in zip(values, numeric, wrapped, strict=True):
            if value is None:
                cells.append(f'<td class="unknown" title="unknown">{UNKNOWN}</td>')
            else:
                css = ' class="num"' if is_number else ' class="wrap"' if wraps else ""
                cells.append(f"<td{css}>{html.escape(_cell(value))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    note = ""
    if frame.height > shown.height:
        note = (
            f'<p class="note">Showing the first {shown.height:,} of {frame.height:,} rows; '
            "the full frame is in the notebook API.</p>"
        )
    return (
        f'{heading}<div class="table-wrap"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>{note}"
    )


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ", timespec="milliseconds")
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    return str(value)
