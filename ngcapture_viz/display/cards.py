"""Notebook HTML of the result objects: a run's card, a dashboard grid, a gap report, a diff.

Each ``*_html`` function is pure: it takes the object (and whether plotly.js must be embedded)
and returns one self-contained HTML fragment, scoped under a ``div.ngc`` with its own small
stylesheet. Each ``*_text`` function is the plain-text twin a text-only front end shows. The
objects' ``_repr_mimebundle_`` / ``_repr_html_`` call :func:`html_bundle`, which asks
:mod:`.plotlyjs` whether this output carries plotly.js.

Example:
    >>> html_bundle("text", lambda plotlyjs: "<b>html</b>")["text/plain"]
    'text'
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import polars as pl

from ngcapture_viz.display._html import table_html
from ngcapture_viz.display.figure import figure_div, plotlyjs_html
from ngcapture_viz.display.plotlyjs import LEDGER

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from ngcapture_viz.diff.compare import CheckpointDiff
    from ngcapture_viz.figures.dashboard import Dashboard
    from ngcapture_viz.figures.gap_report import GapReport
    from ngcapture_viz.run import CaptureRun

__all__ = [
    "dashboard_html",
    "diff_html",
    "gap_report_html",
    "gap_report_text",
    "html_bundle",
    "run_html",
    "run_text",
]

#: Scoped style of every card (``.ngc``): readable in light and dark JupyterLab themes.
TOKEN_CAPTURE_CAPTION: Final = (
    "Token-id capture: rollouts delivered, masked (not to be trained on) and why, and the "
    "token store's states"
)
CSS: Final = """
.ngc { font: 13px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 100%; }
.ngc h3 { font-size: 15px; margin: 4px 0 6px; }
.ngc h4 { font-size: 13px; margin: 12px 0 4px; }
.ngc p.note { opacity: .75; margin: 2px 0 8px; }
.ngc dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 4px 0; }
.ngc dt { font-weight: 600; white-space: nowrap; } .ngc dd { margin: 0; overflow-wrap: anywhere; }
.ngc .table-wrap { overflow-x: auto; max-height: 420px; overflow-y: auto; margin: 4px 0 10px; }
.ngc table { border-collapse: collapse; font-size: 12.5px; }
.ngc th, .ngc td { border: 1px solid rgba(128,128,128,.35); padding: 2px 8px;
  text-align: left !important; vertical-align: top; white-space: nowrap; }
.ngc td.wrap { white-space: normal !important; min-width: 12em; max-width: 48em; }
.ngc td.num { text-align: right !important; font-variant-numeric: tabular-nums; }
.ngc td.unknown { opacity: .6; }
.ngc .grid { display: grid; gap: 10px; grid-auto-flow: dense;
  grid-template-columns: repeat(auto-fill, minmax(min(100%, 560px), 1fr)); }
.ngc .grid > div { min-width: 0; border: 1px solid rgba(128,128,128,.3); border-radius: 4px; }
.ngc .wide { grid-column: 1 / -1; }
.ngc .mark { font-weight: 700; color: #c0392b; }
"""

Render = Callable[[bool], str]


def html_bundle(text: str, render: Render) -> dict[str, str]:
    """``text/html`` (asking the ledger about plotly.js) and ``text/plain`` of one object."""
    return {"text/html": render(LEDGER.needs_plotlyjs(html_only=True)), "text/plain": text}


def card(body: str, *, plotlyjs: bool = False) -> str:
    """``body`` inside the scoped ``div.ngc`` with its stylesheet (and plotly.js if asked)."""
    js = plotlyjs_html() if plotlyjs else ""
    return f'{js}<div class="ngc"><style>{CSS}</style>{body}</div>'


def _esc(value: object) -> str:
    return html.escape(str(value))


def _num(value: object, unit: str = "") -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:,.1f}{unit}"
    return f"{value:,}{unit}" if isinstance(value, int) else f"{value}{unit}"


# -- a run ------------------------------------------------------------------------------------


def _run_rows(run: CaptureRun) -> list[dict[str, Any]]:
    from ngcapture_viz.report import summary_frame

    summary = summary_frame(run)
    latency = run.calls.group_by(pl.col("run").cast(pl.String)).agg(
        pl.col("latency_total_ms").quantile(0.5, "linear").alias("p50"),
        pl.col("latency_total_ms").quantile(0.95, "linear").alias("p95"),
        pl.col("latency_ttft_ms").quantile(0.5, "linear").alias("ttft_p50"),
    )
    failed = run.rollouts.group_by(pl.col("run").cast(pl.String)).agg(
        pl.col("failed").fill_null(False).sum().alias("failed")
        if "failed" in run.rollouts.columns
        else pl.lit(0).alias("failed")
    )
    return summary.join(latency, on="run", how="left").join(failed, on="run", how="left").to_dicts()


def _gap_counts(run: CaptureRun, label: str) -> list[tuple[str, int]]:
    gaps = run.gaps.filter(pl.col("run").cast(pl.String) == label)
    counted = gaps.group_by(pl.col("code").cast(pl.String)).len().sort(["len", "code"])
    return [(code, n) for code, n in reversed(counted.rows())]


def run_text(run: CaptureRun) -> str:
    """A few lines per run: counts, failures, gaps by code, tokens, latency, sources."""
    lines = []
    for row in _run_rows(run):
        label = row["run"]
        one = run.runs.get(label, run)
        gaps = ", ".join(f"{c} {n}" for c, n in _gap_counts(run, label)) or "none"
        lines += [
            f"CaptureRun {label!r}: {row['rollouts']:,} rollouts ({row['failed'] or 0} failed), "
            f"{row['calls']:,} calls ({row['errors']:,} with an error)",
            f"  gaps: {row['gaps']:,} ({gaps})",
            f"  tokens in {_num(row['tokens_in'])} (reported by {row['tokens_in_reported']:,}), "
            f"out {_num(row['tokens_out'])} (reported by {row['tokens_out_reported']:,})",
            f"  latency p50 {_num(row['p50'], ' ms')}, p95 {_num(row['p95'], ' ms')} "
            f"(reported by {row['latency_reported']:,})",
            f"  capture dir: {one.capture_dir or '—'}",
            f"  rollout file: {one.rollouts_path or '—'}",
        ]
    return "\n".join(lines) or "CaptureRun: no run"


def run_html(run: CaptureRun, *, plotlyjs: bool = False) -> str:
    """The run's card: one block per run (counts, gaps by code, headline numbers, sources)."""
    blocks = []
    for row in _run_rows(run):
        label = row["run"]
        one = run.runs.get(label, run)
        failures = getattr(one, "failures_path", None)
        gaps = _gap_counts(run, label)
        gap_items = "".join(
            f"<tr><td>{_esc(code)}</td><td class='num'>{n:,}</td></tr>" for code, n in gaps
        )
        gap_table = (
            f"<table><tr><th>gap code</th><th>count</th></tr>{gap_items}</table>"
            if gaps
            else "none"
        )
        errors = row["errors"] or 0
        rate = f" ({errors / row['calls']:.1%})" if row["calls"] else ""
        span = row["span_s"]
        facts = [
            ("rollouts", f"{row['rollouts']:,} ({row['failed'] or 0} failed in collection)"),
            ("calls", f"{row['calls']:,}; {errors:,} with an error{rate}"),
            (
                "tokens",
                f"in {_num(row['tokens_in'])} · out {_num(row['tokens_out'])} "
                f"(reported by {row['tokens_in_reported']:,} / {row['calls']:,} calls)",
            ),
            (
                "latency",
                f"p50 {_num(row['p50'], ' ms')} · p95 {_num(row['p95'], ' ms')} · "
                f"TTFT p50 {_num(row['ttft_p50'], ' ms')} "
                f"(reported by {row['latency_reported']:,} / {row['calls']:,} calls)",
            ),
            ("time span", "unknown" if span is None else f"{span:,.1f} s of calls"),
            ("gaps", f"{row['gaps']:,}"),
        ]
        sources = [
            ("capture dir", one.capture_dir or "—"),
            ("rollout file", one.rollouts_path or "—"),
        ]
        if failures is not None:
            sources.append(("failures file", failures))
        dl = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in facts + sources)
        failed = run.rollouts.filter(
            (pl.col("run").cast(pl.String) == label) & pl.col("failed").fill_null(False)
        ).select("rollout_id", "failure")
        failed_table = (
            table_html(failed, caption="Rollouts that failed in collection", wrap=["failure"])
            if failed.height
            else ""
        )
        blocks.append(
            f"<h3>CaptureRun {_esc(label)}</h3><dl>{dl}</dl><h4>Gaps by code</h4>{gap_table}"
            + failed_table
        )
    note = (
        '<p class="note">Unknown is never zero: a total sums what calls reported, and says how '
        "many did. <code>run.calls</code>, <code>run.rollouts</code>, <code>run.gaps</code>, "
        "<code>run.tool_calls</code> hold the rows.</p>"
    )
    return card("".join(blocks) + note, plotlyjs=plotlyjs)


# -- a dashboard ------------------------------------------------------------------------------

#: Figures that span the whole grid (their subplots need the width).
_WIDE: Final = frozenset({"reward", "over_time"})


def figure_grid(figures: Sequence[tuple[str, go.Figure]], *, plotlyjs: bool) -> str:
    """Figures in a responsive grid (two columns when the output is wide, one when narrow)."""
    cells = []
    for n, (name, fig) in enumerate(figures):
        wide = ' class="wide"' if name in _WIDE else ""
        cells.append(f"<div{wide}>{figure_div(fig, plotlyjs=plotlyjs and n == 0)}</div>")
    return f'<div class="grid">{"".join(cells)}</div>'


def dashboard_html(dash: Dashboard, *, plotlyjs: bool = False) -> str:
    """The dashboard's figures in a grid; the tables stay in ``dash.tables``."""
    body = (
        "<h3>Dashboard</h3>"
        '<p class="note">Figures: '
        + ", ".join(_esc(n) for n in dash.figures)
        + ". Tables behind them: <code>.tables</code>; one figure: <code>.figures[name]</code>."
        "</p>" + figure_grid(list(dash.figures.items()), plotlyjs=plotlyjs)
    )
    tokens = dash.tables.get("token_capture")
    if tokens is not None:  # token-id capture: how much of each run may not be trained on
        body += table_html(tokens, caption=TOKEN_CAPTURE_CAPTION, wrap=["mask_reasons"])
    return card(body)


# -- a gap report -----------------------------------------------------------------------------


def worst_rollouts(report: GapReport, limit: int = 10) -> pl.DataFrame:
    """The rollouts with the most gaps: run, rollout_id, gaps, codes."""
    gaps = report.gaps.filter(pl.col("rollout_id").is_not_null())
    return (
        gaps.group_by(pl.col("run").cast(pl.String), "rollout_id")
        .agg(
            pl.len().alias("gaps"),
            pl.col("code").cast(pl.String).unique().sort().str.join(", ").alias("codes"),
            pl.col("detail").drop_nulls().first().alias("first detail"),
        )
        .sort(["gaps", "run", "rollout_id"], descending=[True, False, False])
        .head(limit)
    )


#: Gaps whose detail the plain-text report lists (all of them are in ``report.gaps``).
TEXT_DETAILS: Final = 20


def gap_report_text(report: GapReport) -> str:
    """The report as lines: the subtitle, each code with its count and meaning, then the
    details of the first :data:`TEXT_DETAILS` gaps (where each is), all in full."""
    lines = [f"GapReport: {report.subtitle}"]
    for run, code, count, rollouts, meaning in report.by_code.rows():
        lines.append(f"  {run}: {code} ×{count} ({rollouts} rollouts): {meaning}")
    gaps = report.gaps
    if gaps.height:
        more = f" (the first {TEXT_DETAILS}; all in .gaps)" if gaps.height > TEXT_DETAILS else ""
        lines.append(f"Details{more}:")
    for gap in gaps.head(TEXT_DETAILS).iter_rows(named=True):
        where = [f"rollout {gap['rollout_id']}"] if gap["rollout_id"] is not None else []
        if gap["path"] is not None:
            line = f":{gap['line_number']}" if gap["line_number"] is not None else ""
            where.append(f"{gap['path']}{line}")
        lines.append(
            f"  {gap['run']}: {gap['code']} · {' · '.join(where) or 'no rollout'}: "
            f"{gap['detail'] or 'no detail'}"
        )
    return "\n".join(lines)


def gap_report_html(report: GapReport, *, plotlyjs: bool = False) -> str:
    """Summary, counts by code (meanings in full), the figure, the worst rollouts, details."""
    wrap = ("meaning", "detail", "first detail", "codes")
    body = (
        f"<h3>Gap report</h3><p>{_esc(report.subtitle)}</p>"
        + table_html(report.by_code, caption="Gaps by code", wrap=wrap)
        + figure_div(report.figure(), plotlyjs=plotlyjs)
        + table_html(worst_rollouts(report), caption="Rollouts with the most gaps", wrap=wrap)
        + table_html(report.missing, caption="Rollouts missing from a source", wrap=wrap)
        + table_html(report.damaged, caption="Damaged capture lines", wrap=wrap)
        + table_html(report.pending, caption="Pending capture writes", wrap=wrap)
        + table_html(report.summary, caption="Coverage", wrap=["description"])
    )
    return card(body)


# -- a checkpoint diff ------------------------------------------------------------------------


def diff_table(d: CheckpointDiff) -> pl.DataFrame:
    """The diff as display text per metric: both values, the difference, interval, marks."""
    from ngcapture_viz.diff.render import interval_text, mark, number_text, percent_text

    rows = []
    for r in d.frame.iter_rows(named=True):
        rows.append(
            {
                "metric": r["metric"],
                d.label_a: number_text(r["value_a"], r["unit"]),
                d.label_b: number_text(r["value_b"], r["unit"]),
                "diff": number_text(r["diff"], r["unit"], sign=True),
                "rel": percent_text(r["rel_diff"]),
                f"{d.confidence:.0%} interval": interval_text(r),
                "sig": mark(r, d.confidence),
                "p (Holm)": "—" if r["p_holm"] is None else f"{r['p_holm']:.3g}",
                "n a / b": f"{r['n_a']:,} / {r['n_b']:,}",
                "coverage a / b": f"{percent_text(r['coverage_a'], sign=False)} / "
                f"{percent_text(r['coverage_b'], sign=False)}",
            }
        )
    return pl.DataFrame(rows, schema=dict.fromkeys(rows[0], pl.String()) if rows else None)


def diff_html(d: CheckpointDiff, *, plotlyjs: bool = False) -> str:
    """The table with intervals and significance marks, what was left out, the forest plot."""
    from ngcapture_viz.diff.render import legend_lines, only_lines

    notes = "".join(f'<p class="note">{_esc(line)}</p>' for line in legend_lines(d))
    left = "".join(f'<p class="note">{_esc(line)}</p>' for line in only_lines(d))
    body = (
        f"<h3>{_esc(d.label_b)} vs {_esc(d.label_a)}</h3><p>{_esc(d.summary)}</p>"
        + table_html(diff_table(d), max_rows=1000)
        + notes
        + left
        + figure_div(d.figure(), plotlyjs=plotlyjs)
    )
    return card(body)
