"""How a checkpoint diff reads: the text table and the forest plot of a ``CheckpointDiff``.

``format_diff(d)`` is what ``print(d)`` shows (values, differences, intervals, counts and
coverage, then what was left out); ``diff_figure(d)`` is the forest plot of relative
differences. ``CheckpointDiff.format`` / ``__str__`` / ``figure`` delegate here.

Example:
    >>> import ngcapture_viz as ngv  # doctest: +SKIP
    >>> d = ngv.diff(run_100, run_200)  # doctest: +SKIP
    >>> print(format_diff(d))  # doctest: +SKIP
    >>> diff_figure(d)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.display.figure import Figure

if TYPE_CHECKING:
    from ngcapture_viz.diff.compare import CheckpointDiff

__all__ = [
    "diff_figure",
    "format_diff",
    "interval_text",
    "legend_lines",
    "mark",
    "number_text",
    "only_lines",
    "percent_text",
]


def format_diff(d: CheckpointDiff) -> str:
    """A readable text table: values, differences, intervals, counts and coverage.

    Example:
        >>> print(format_diff(d))  # doctest: +SKIP
    """
    a, b = _short(d.label_a), _short(d.label_b)
    level = f"{d.confidence:.0%}"
    lines = [
        d.summary,
        f"{'metric':<29}{a:>12}{b:>12}{'diff':>12}{'rel':>9}  "
        f"{level + ' interval':<22}{'n a/b':>13}  coverage a/b",
    ]
    for r in d.frame.iter_rows(named=True):
        lines.append(
            f"{r['metric']:<29}{number_text(r['value_a'], r['unit']):>12}"
            f"{number_text(r['value_b'], r['unit']):>12}"
            f"{number_text(r['diff'], r['unit'], sign=True):>12}"
            f"{percent_text(r['rel_diff']):>9}  {interval_text(r):<20}{mark(r, d.confidence):<2}"
            f"{r['n_a']:>6}/{r['n_b']:<6} {percent_text(r['coverage_a'], sign=False)}/"
            f"{percent_text(r['coverage_b'], sign=False)}"
        )
    return "\n".join(lines + legend_lines(d) + only_lines(d))


def interval_text(row: dict[str, Any]) -> str:
    """A row's interval: relative, or absolute where a relative one is unknown."""
    if row["rel_ci_low"] is not None:
        return f"[{percent_text(row['rel_ci_low'])}, {percent_text(row['rel_ci_high'])}]"
    return _abs_interval(row)


def mark(row: dict[str, Any], confidence: float) -> str:
    """``*``: the interval excludes 0; ``**``: and it holds after Holm's correction."""
    holds = row["p_holm"] is not None and row["p_holm"] < 1.0 - confidence
    if not row["ci_excludes_zero"]:
        return ""
    return "**" if holds else "*"


def legend_lines(d: CheckpointDiff) -> list[str]:
    """What the intervals and marks mean."""
    level, alpha = f"{d.confidence:.0%}", 1.0 - d.confidence
    known = d.frame["p_holm"].is_not_null().sum()
    return [
        "intervals are relative, or absolute where a relative one is unknown",
        f"* the {level} interval of the difference excludes 0; ** it still does after Holm's "
        f"correction for the {known} metrics compared (p_holm < {alpha:.2g})",
    ]


def only_lines(d: CheckpointDiff) -> list[str]:
    """What each run had that the other did not, and what became of it."""
    return [
        _only_line(label, only, excluded, by=d.by, paired=d.paired)
        for label, only, excluded in (
            (d.label_a, d.only_a, d.excluded_a),
            (d.label_b, d.only_b, d.excluded_b),
        )
    ]


def diff_figure(d: CheckpointDiff) -> go.Figure:
    """Forest plot: relative difference per metric with its interval and a zero line.

    Metrics whose relative interval excludes 0 are coloured; metrics without a relative
    difference (no value in run a, or a zero one) are left out and named in the title.

    Example:
        >>> diff_figure(d)  # doctest: +SKIP
    """
    shown = d.frame.filter(pl.col("rel_diff").is_not_null())
    missing = d.frame.filter(pl.col("rel_diff").is_null())["metric"].to_list()
    excludes = (pl.col("rel_ci_low") > 0) | (pl.col("rel_ci_high") < 0)
    groups = (
        ("interval excludes 0", excludes.fill_null(False), "#d62728"),
        ("interval includes 0", ~excludes.fill_null(True), "#7f7f7f"),
        ("no interval", pl.col("rel_ci_low").is_null(), "#bcbd22"),
    )
    fig = Figure()
    for name, condition, colour in groups:
        part = shown.filter(condition)
        if part.height == 0:
            continue
        point = part["rel_diff"] * 100
        low = part["rel_ci_low"].fill_null(part["rel_diff"]) * 100
        high = part["rel_ci_high"].fill_null(part["rel_diff"]) * 100
        fig.add_trace(
            go.Scatter(
                name=name,
                x=point.to_list(),
                y=part["metric"].to_list(),
                mode="markers",
                marker={"color": colour, "size": 9},
                error_x={
                    "type": "data",
                    "symmetric": False,
                    "array": (high - point).to_list(),
                    "arrayminus": (point - low).to_list(),
                    "color": colour,
                },
                customdata=part.select("value_a", "value_b").rows(),
                hovertemplate=(
                    "%{y}: %{x:+.1f}%<br>a %{customdata[0]:.4g} → b %{customdata[1]:.4g}"
                    "<extra></extra>"
                ),
            )
        )
    fig.add_vline(x=0, line={"color": "black", "width": 1})
    title = f"{d.label_b} vs {d.label_a}: relative difference, {d.confidence:.0%} CI"
    lines = _wrap(["not shown (no relative difference):", *missing]) if missing else []
    if lines:  # short lines: a long list must wrap, not run off a narrow figure
        title += "<br><sup>" + "<br>".join(lines) + "</sup>"
    fig.update_layout(
        title=title,
        xaxis_title=f"{d.label_b} relative to {d.label_a} (%)",
        yaxis={"categoryorder": "array", "categoryarray": shown["metric"].to_list()[::-1]},
        height=max(320, 40 * shown.height + 140 + 20 * len(lines)),
        margin={"t": 90 + 20 * len(lines)},
        template="plotly_white",
    )
    return fig


#: Characters per line of the forest plot's "not shown" list (fits a 500 px wide figure).
_LINE_CHARS: Final = 60


def _wrap(words: list[str]) -> list[str]:
    """The heading then the metric names, comma-separated, in lines of at most ``_LINE_CHARS``."""
    lines = [words[0]]
    current = ""
    for n, word in enumerate(words[1:]):
        piece = word + ("," if n < len(words) - 2 else "")
        if current and len(current) + 1 + len(piece) > _LINE_CHARS:
            lines.append(current)
            current = piece
        else:
            current = f"{current} {piece}" if current else piece
    return [*lines, current] if current else lines


def number_text(value: float | None, unit: str, *, sign: bool = False) -> str:
    """A metric value in its unit (shares as %, their differences in pp); ``unknown`` for None.

    Example:
        >>> number_text(0.05, "share", sign=True)
        '+5.00 pp'
    """
    if value is None:
        return "unknown"
    plus = "+" if sign else ""
    if unit == "share":  # a difference of shares is in percentage points
        return f"{value * 100:+.2f} pp" if sign else f"{value:.2%}"
    return f"{value:{plus},.1f}" if unit in ("tokens", "ms") else f"{value:{plus},.2f}"


def percent_text(value: float | None, *, sign: bool = True) -> str:
    """A relative value as a percentage (``unknown`` for None).

    Example:
        >>> percent_text(0.123)
        '+12.3%'
    """
    if value is None:
        return "unknown"
    return f"{value:+.1%}" if sign else f"{value:.0%}"


def _short(label: str, width: int = 11) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def _abs_interval(row: dict[str, Any]) -> str:
    if row["ci_low"] is None:
        return "no interval"
    low, high = (number_text(row[k], row["unit"], sign=True) for k in ("ci_low", "ci_high"))
    return f"[{low}, {high}]"


def _only_line(label: str, only: tuple[str, ...], excluded: int, *, by: str, paired: bool) -> str:
    what = "tasks" if by == "task" else "rollouts"
    if not only:
        return f"only in {label}: none"
    shown = ", ".join(only[:8]) + (f", … ({len(only) - 8} more)" if len(only) > 8 else "")
    fate = f"left out ({excluded} rollouts)" if paired else "compared unpaired"
    return f"only in {label}: {len(only)} {what}, {fate}: {shown}"
