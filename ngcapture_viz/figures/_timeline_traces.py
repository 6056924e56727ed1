"""A rollout timeline's traces: bars coloured by outcome, TTFT ticks, idle spans, damaged lines.

Each ``add_*`` function adds its traces to the figure that
:func:`ngcapture_viz.figures.timeline.timeline` builds, from the rollout's placed calls (with
their ``lane``, ``_start_ms`` and ``_duration_ms``); every trace names what it shows in
``meta["kind"]``. :data:`OUTCOME_COLORS` and :func:`outcome_color` are public through
:mod:`ngcapture_viz.figures.timeline`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import plotly.graph_objects as go
import polars as pl
from plotly.colors import qualitative

from ngcapture_viz.figures._timeline_text import fmt_ms, hover_text
from ngcapture_viz.frames.gaps import AnalysisGap

__all__ = [
    "OUTCOME_COLORS",
    "add_bars",
    "add_damaged_markers",
    "add_idle",
    "add_ttft",
    "idle_spans",
    "outcome_color",
]

OUTCOME_COLORS: Final[Mapping[str, str]] = {
    "ok": "#2ca02c",
    "length": "#ff7f0e",
    "stream_truncated": "#e377c2",
    "incomplete": "#bcbd22",
    "timeout": "#d62728",
    "rate_limit": "#9467bd",
    "auth": "#8c564b",
    "not_found": "#7f7f7f",
    "client_error": "#e7969c",
    "upstream_error": "#a50f15",
    "connection": "#17becf",
    "exception": "#393b79",
    "capture_parse_error": "#636363",
    "client_disconnected": "#fd8d3c",
}

_MANY_CALLS: Final = 40  # above this: no per-bar text, no bar outlines


def outcome_color(outcome: str | None) -> str:
    """The colour of an outcome (``ok``, an error category, ``length``); stable for new ones.

    Example:
        >>> outcome_color("ok")
        '#2ca02c'
    """
    key = outcome if outcome is not None else "unknown"
    if key in OUTCOME_COLORS:
        return OUTCOME_COLORS[key]
    palette = qualitative.Dark24
    return str(palette[sum(key.encode()) % len(palette)])


def idle_spans(placed: pl.DataFrame) -> list[tuple[float, float]]:
    """Spans (ms) between the first start and the last completion with no call in flight."""
    spans: list[tuple[float, float]] = []
    if not placed.height:
        return spans
    rows = sorted(zip(placed["_start_ms"].to_list(), placed["_duration_ms"].to_list(), strict=True))
    reach = rows[0][0] + rows[0][1]
    for start, duration in rows[1:]:
        if start > reach:
            spans.append((reach, start))
        reach = max(reach, start + duration)
    return spans


def add_idle(fig: go.Figure, idle: list[tuple[float, float]], num_lanes: int) -> None:
    if not idle:
        return
    low, high = -0.5, num_lanes - 0.5
    xs: list[float | None] = []
    ys: list[float | None] = []
    for start, end in idle:
        xs += [start, end, end, start, start, None]
        ys += [low, low, high, high, low, None]
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            fill="toself",
            mode="lines",
            line={"width": 0},
            fillcolor="rgba(120,120,120,0.15)",
            name=f"idle, no call in flight ({fmt_ms(sum(e - s for s, e in idle))})",
            legendgroup="idle",
            hoveron="fills",
            hoverinfo="name",
            meta={"kind": "idle"},
        )
    )


def add_bars(fig: go.Figure, placed: pl.DataFrame) -> None:
    many = placed.height > _MANY_CALLS
    outcomes = placed["outcome"].cast(pl.String).fill_null("unknown")
    placed = placed.with_columns(outcomes.alias("_outcome"))
    order = sorted(set(outcomes.to_list()), key=lambda o: (o != "ok", o))
    for outcome in order:
        part = placed.filter(pl.col("_outcome") == outcome)
        rows = part.to_dicts()
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=part["lane"].to_list(),
                base=part["_start_ms"].to_list(),
                x=part["_duration_ms"].to_list(),
                width=0.8,
                name=outcome,
                legendgroup=outcome,
                marker={
                    "color": outcome_color(outcome),
                    "line": {"width": 0 if many else 0.5, "color": "white"},
                },
                text=None if many else [f"#{r['call_index']}" for r in rows],
                textposition="inside",
                insidetextanchor="middle",
                customdata=[[r["model_call_id"], r["call_index"]] for r in rows],
                hovertext=[hover_text(r) for r in rows],
                hovertemplate="%{hovertext}<extra></extra>",
                meta={"kind": "calls", "outcome": outcome},
            )
        )


def add_ttft(fig: go.Figure, placed: pl.DataFrame) -> None:
    streamed = placed.filter(pl.col("stream") & pl.col("latency_ttft_ms").is_not_null())
    if not streamed.height:
        return
    many = placed.height > _MANY_CALLS
    fig.add_trace(
        go.Scatter(
            x=(streamed["_start_ms"] + streamed["latency_ttft_ms"]).to_list(),
            y=streamed["lane"].to_list(),
            mode="markers",
            marker={
                "symbol": "line-ns",
                "size": 8 if many else 14,
                "line": {"width": 2, "color": "black"},
            },
            name="first token (TTFT)",
            legendgroup="ttft",
            customdata=[[m, i] for m, i in streamed.select("model_call_id", "call_index").rows()],
            hovertext=[
                f"call #{i}: first token after {fmt_ms(t)}"
                for i, t in streamed.select("call_index", "latency_ttft_ms").rows()
            ],
            hovertemplate="%{hovertext}<extra></extra>",
            meta={"kind": "ttft"},
        )
    )


def add_damaged_markers(fig: go.Figure, gaps: pl.DataFrame, placed: pl.DataFrame) -> None:
    """Damaged lines sit where they were written: after the readable line before them."""
    damaged = gaps.filter(
        (pl.col("code").cast(pl.String) == AnalysisGap.DAMAGED_LINE.value)
        & pl.col("call_index").is_not_null()
    )
    if not damaged.height:
        return
    ends = {i: s + d for i, s, d in placed.select("call_index", "_start_ms", "_duration_ms").rows()}
    xs: list[float] = []
    texts: list[str] = []
    for row in damaged.iter_rows(named=True):
        before = [i for i in ends if i < row["call_index"]]
        xs.append(ends[max(before)] if before else 0.0)
        texts.append(
            f"damaged line {row['line_number']} of {row['path']} (call_index "
            f"{row['call_index']}): {row['detail'] or ''}<br>placed after the readable line "
            "written before it (position approximate)"
        )
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=[-0.5] * len(xs),
            mode="markers",
            marker={"symbol": "x", "size": 12, "color": "#d62728"},
            name="damaged capture line",
            legendgroup="damaged",
            hovertext=texts,
            hovertemplate="%{hovertext}<extra></extra>",
            meta={"kind": "damaged"},
        )
    )
