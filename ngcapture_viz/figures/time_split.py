"""Where the time goes: each run's rollout wall time split into model, tools and overhead.

Built from the ``perf`` frame (each rollout's ``ng_perf``): :func:`time_split` sums the parts
over the rollouts that have one (``model + tools + overhead = wall`` holds for each, so for the
sums too) and counts the rollouts without one, with their most common reason;
:func:`time_split_figure` draws one stacked bar per run, as shares of its wall time, with the
milliseconds and the coverage in the hover. Rollouts without ``ng_perf`` are never counted as
zero time: they are left out, and the bar's label says how many.

Example:
    >>> time_split_figure(time_split(run.perf), run.labels)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.display.figure import Figure
from ngcapture_viz.figures._timeline_text import fmt_ms

__all__ = ["PARTS", "TIME_SPLIT_SCHEMA", "time_split", "time_split_figure"]

#: The parts of a rollout's wall time, in stacking order, with their legend names and colours.
PARTS: Final = (
    ("model_time_ms", "model calls in flight", "#2ca02c"),
    ("tool_time_ms", "tools only", "#1f77b4"),
    ("overhead_time_ms", "neither (harness overhead)", "#bbbbbb"),
)
_FLOAT = pl.Float64()
_SUMMED: Final = ("wall_time_ms", "model_time_ms", "tool_time_ms", "overhead_time_ms",
                  "tool_model_overlap_ms")  # fmt: skip
TIME_SPLIT_SCHEMA: Final = pl.Schema({
    "run": pl.String(), "rollouts": pl.Int64(), "with_perf": pl.Int64(),
    "wall_time_ms": _FLOAT, "model_time_ms": _FLOAT, "tool_time_ms": _FLOAT,
    "overhead_time_ms": _FLOAT, "tool_model_overlap_ms": _FLOAT, "wall_time_p50_ms": _FLOAT,
    "top_unavailable_reason": pl.String(),
})  # fmt: skip


def time_split(perf: pl.DataFrame) -> pl.DataFrame:
    """Per run: rollouts, those with ``ng_perf``, summed parts (ms) and the main missing reason.

    Example:
        >>> time_split(run.perf)["with_perf"].to_list()  # doctest: +SKIP
        [40]
    """
    if not perf.height:
        return pl.DataFrame(schema=TIME_SPLIT_SCHEMA)
    has = pl.col("wall_time_ms").is_not_null()
    table = (
        perf.with_columns(pl.col("run").cast(pl.String))
        .group_by("run", maintain_order=True)
        .agg(
            pl.len().cast(pl.Int64).alias("rollouts"),
            has.sum().cast(pl.Int64).alias("with_perf"),
            *(pl.col(name).filter(has).sum().alias(name) for name in _SUMMED),
            pl.col("wall_time_ms").median().alias("wall_time_p50_ms"),
            pl.col("unavailable_reason")
            .drop_nulls()
            .mode()
            .sort()
            .first()
            .alias("top_unavailable_reason"),
        )
    )
    return table.with_columns(  # no rollout with ng_perf: the sums are unknown, not 0
        pl.when(pl.col("with_perf") > 0).then(pl.col(c)).alias(c) for c in _SUMMED
    ).cast(dict(TIME_SPLIT_SCHEMA))  # type: ignore[arg-type]


def time_split_figure(table: pl.DataFrame, runs: Sequence[str]) -> go.Figure:
    """One horizontal bar per run: model, tools-only and overhead as shares of wall time."""
    fig = Figure()
    rows = {r["run"]: r for r in table.iter_rows(named=True)}
    labels = [_label(run, rows.get(run)) for run in runs]
    for column, name, color in PARTS:
        shares, texts = [], []
        for run in runs:
            row = rows.get(run)
            wall = row["wall_time_ms"] if row else None
            part = row[column] if row else None
            share = part / wall if wall and part is not None else None
            shares.append(share)
            texts.append(_hover(run, name, part, share, row))
        fig.add_trace(go.Bar(
            orientation="h", y=labels, x=shares, name=name, marker={"color": color},
            text=[f"{s:.0%}" if s is not None and s >= 0.06 else "" for s in shares],
            textposition="inside", textangle=0, hovertext=texts,
            hovertemplate="%{hovertext}<extra></extra>",
            meta={"kind": "time_split", "part": column},
        ))  # fmt: skip
    missing = not any(r and r["with_perf"] for r in rows.values())
    fig.update_layout(
        title={
            "text": "Where the time goes",
            # Two short lines: one long one ran off a figure in a half-width dashboard cell.
            "subtitle": {
                "text": "share of rollout wall time (ng_perf);<br>rollouts without "
                "ng_perf are left out, never counted as 0"
            },
        },
        barmode="stack",
        xaxis={"tickformat": ".0%", "range": [0, 1]},
        yaxis={"autorange": "reversed"},
        height=240 + 40 * len(runs),
        margin={"t": 105},
        # The legend reads in stacking order; a share too narrow for its label at this width
        # shows none (the hover has it) instead of a shrunken, turned one.
        legend={"orientation": "h", "y": -0.25, "traceorder": "normal"},
        uniformtext={"minsize": 11, "mode": "hide"},
    )
    if missing:
        fig.add_annotation(text="No rollout carries ng_perf (collected without agent evidence?)",
                           xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False)  # fmt: skip
    return fig


def _label(run: str, row: dict[str, object] | None) -> str:
    if row is None:
        return f"{run} (no agent evidence)"
    return f"{run} ({row['with_perf']}/{row['rollouts']} rollouts)"


def _hover(run: str, name: str, part: float | None, share: float | None,
           row: dict[str, object] | None) -> str:  # fmt: skip
    if row is None or part is None or share is None:
        reason = row["top_unavailable_reason"] if row else None
        return f"<b>{run}</b>: unknown (no ng_perf{f': {reason}' if reason else ''})"
    lines = [f"<b>{run}</b> · {name}", f"{share:.1%} of wall time · {fmt_ms(part)} in all",
             f"over {row['with_perf']} of {row['rollouts']} rollouts with ng_perf"]  # fmt: skip
    if row["top_unavailable_reason"]:
        lines.append(f"most common reason for none: {row['top_unavailable_reason']}")
    return "<br>".join(lines)
