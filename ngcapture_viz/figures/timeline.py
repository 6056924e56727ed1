"""Per-rollout call timeline: one bar per call, one lane per concurrent call.

``timeline(run, rollout_id)`` draws every call of a rollout as a horizontal bar from
``started_at`` to ``completed_at`` (milliseconds since the rollout's first call started), in
lanes assigned by :func:`assign_lanes` so that overlapping calls never share one (call order
and timestamps do not prove causality: :data:`CAUSALITY_NOTE`, said once where timelines are
shown, not under each one). The TTFT point
sits inside each streamed call's bar, bars are coloured by ``outcome``, idle spans (no call in
flight) are shaded, and the rollout's gaps are listed on the chart.

Example::

    import ngcapture_viz as ngv

    run = ngv.open_run("results/demo/ckpt-100/model-calls", "results/demo/ckpt-100/rollouts.jsonl")
    fig = ngv.timeline(run, run.rollouts["rollout_id"][0])
"""

from __future__ import annotations

import heapq
from typing import Any, Final

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.display.figure import Figure
from ngcapture_viz.figures._timeline_text import gaps_note, subtitle, unplaced_note
from ngcapture_viz.figures._timeline_traces import (
    OUTCOME_COLORS,
    add_bars,
    add_damaged_markers,
    add_idle,
    add_ttft,
    idle_spans,
    outcome_color,
)
from ngcapture_viz.figures.agent_lanes import add_agent_lanes
from ngcapture_viz.frames.calls import CALLS
from ngcapture_viz.interop import accepts_pandas
from ngcapture_viz.run import CaptureRun

__all__ = ["CAUSALITY_NOTE", "OUTCOME_COLORS", "assign_lanes", "outcome_color", "timeline"]

CAUSALITY_NOTE: Final = (
    "Call order and timestamps do not prove causality: a call that starts after another "
    "did not necessarily use its output."
)


@accepts_pandas(calls=CALLS)
def assign_lanes(calls: pl.DataFrame) -> pl.DataFrame:
    """Add an Int64 ``lane`` column: overlapping calls never share a lane.

    Greedy interval partitioning in ``started_at`` order, each call taking the lowest free lane;
    a lane frees when its call completes (a call starting exactly then may reuse it). The number
    of lanes equals the maximum number of calls in flight at once. Calls without ``started_at``
    or ``completed_at``, or completed before they started, cannot be placed: their lane is null.
    Row order is kept.

    Example:
        >>> from datetime import datetime, UTC
        >>> t = [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in range(4)]
        >>> calls = pl.DataFrame({"started_at": [t[0], t[1], t[2]],
        ...                       "completed_at": [t[2], t[3], t[3]]})
        >>> assign_lanes(calls)["lane"].to_list()
        [0, 1, 0]
    """
    starts = calls["started_at"].dt.epoch("us").to_list()
    ends = calls["completed_at"].dt.epoch("us").to_list()
    placeable = [
        i
        for i, (s, e) in enumerate(zip(starts, ends, strict=True))
        if s is not None and e is not None and e >= s
    ]
    placeable.sort(key=lambda i: (starts[i], ends[i], i))
    lanes: list[int | None] = [None] * calls.height
    busy: list[tuple[int, int]] = []  # (completed_at, lane) of calls in flight
    free: list[int] = []
    for i in placeable:
        while busy and busy[0][0] <= starts[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lane = heapq.heappop(free) if free else len(busy)
        heapq.heappush(busy, (ends[i], lane))
        lanes[i] = lane
    return calls.with_columns(pl.Series("lane", lanes, dtype=pl.Int64))


def timeline(run: CaptureRun, rollout_id: str, *, run_label: str | None = None) -> go.Figure:
    """The calls of one rollout on a time axis, one lane per concurrent call.

    The x axis is milliseconds since the rollout's first call started: a bar's ``base`` is its
    start and its ``x`` its duration. Hover shows model, dialect, tokens (``not reported`` when
    unknown, never 0), finish reason, tool calls, latency and TTFT. Each bar's ``customdata`` is
    ``[model_call_id, call_index]`` (for ``run.payload``).

    Args:
        run: an opened run (or a stack of runs).
        rollout_id: the rollout to draw.
        run_label: which run of a stack, when the rollout id occurs in several.

    Raises:
        KeyError: unknown rollout id (the message names some valid ones) or run label.
        ValueError: the rollout id occurs in several stacked runs and no ``run_label`` was given.

    Example:
        >>> fig = timeline(run, "0-0")  # doctest: +SKIP
        >>> fig.data[0].base  # doctest: +SKIP
    """
    calls, gaps, label = _select(run, rollout_id, run_label)
    laned = assign_lanes(calls)
    placed = laned.filter(pl.col("lane").is_not_null()).sort("started_at", "call_index")
    unplaced = laned.filter(pl.col("lane").is_null()).sort("call_index")
    placed = placed.with_columns(
        _ms_since(pl.col("started_at"), pl.col("started_at").min()).alias("_start_ms"),
        _ms_since(pl.col("completed_at"), pl.col("started_at")).alias("_duration_ms"),
    )
    num_lanes = max(placed["lane"].n_unique(), 1)  # lanes are 0..k-1
    idle = idle_spans(placed)
    fig = Figure()
    add_idle(fig, idle, num_lanes)
    add_bars(fig, placed)
    add_ttft(fig, placed)
    add_damaged_markers(fig, gaps, placed)
    agent = add_agent_lanes(fig, run, rollout_id, placed, label=label, first_lane=num_lanes)
    notes: list[tuple[str, str]] = []  # the causality caveat is said once, by the report
    if unplaced.height:
        notes.append(("unplaced", unplaced_note(unplaced)))
    if gaps.height:
        notes.append(("gaps", gaps_note(gaps)))
    if not placed.height:
        notes.append(("empty", "No captured call of this rollout has both timestamps."))
    bottom = _add_notes(fig, notes)
    origin = placed["started_at"].min()
    run_part = f" · run {label}" if label is not None else ""
    fig.update_layout(
        title={
            "text": f"Rollout {rollout_id}{run_part}",
            "subtitle": {"text": subtitle(placed, num_lanes, idle, gaps.height)},
        },
        height=min(900, 260 + 28 * (num_lanes + len(agent.labels))) + bottom,
        margin={"b": bottom, "t": 90},
    )
    _style_axes(fig, num_lanes + len(agent.labels), origin)
    if agent.labels:  # name the lanes: call lanes by number, then the agent's
        ticks = {**{lane: str(lane) for lane in range(num_lanes)}, **agent.labels}
        fig.update_yaxes(tickmode="array", tickvals=list(ticks), ticktext=list(ticks.values()))
    return fig


# -- selection ------------------------------------------------------------------------------


def _select(
    run: CaptureRun, rollout_id: str, run_label: str | None
) -> tuple[pl.DataFrame, pl.DataFrame, str | None]:
    """The calls and gaps of one rollout of one run, and that run's label."""
    calls, gaps, rollouts = run.calls, run.gaps, run.rollouts
    if run_label is not None:
        if run_label not in run.labels:
            raise KeyError(f"no run labelled {run_label!r}; runs: {run.labels}")
        calls, gaps, rollouts = (
            f.filter(pl.col("run").cast(pl.String) == run_label) for f in (calls, gaps, rollouts)
        )
    is_it = pl.col("rollout_id") == rollout_id
    owners = sorted(
        set(calls.filter(is_it)["run"].cast(pl.String).to_list())
        | set(rollouts.filter(is_it)["run"].cast(pl.String).to_list())
        | set(gaps.filter(is_it)["run"].cast(pl.String).to_list())
    )
    if not owners:
        known = rollouts["rollout_id"].unique(maintain_order=True)
        if known.len() == 0:
            known = calls["rollout_id"].unique(maintain_order=True)
        where = f" in run {run_label!r}" if run_label is not None else ""
        examples = ", ".join(repr(r) for r in known.head(5).to_list()) or "none"
        raise KeyError(
            f"no rollout {rollout_id!r}{where}; valid ids include {examples} ({known.len()} in all)"
        )
    if len(owners) > 1:
        raise ValueError(
            f"rollout {rollout_id!r} occurs in runs {owners}; pass run_label= to pick one"
        )
    mine = is_it & (pl.col("run").cast(pl.String) == owners[0])
    return calls.filter(mine), gaps.filter(mine), owners[0]


def _ms_since(column: pl.Expr, origin: pl.Expr) -> pl.Expr:
    return (column - origin).dt.total_microseconds().cast(pl.Float64) / 1000.0


# -- layout ---------------------------------------------------------------------------------


def _add_notes(fig: go.Figure, notes: list[tuple[str, str]]) -> int:
    """Notes stacked under the x axis; returns the bottom margin they need."""
    above = 0
    for name, text in notes:
        fig.add_annotation(
            name=name,
            text=text,
            xref="paper",
            yref="paper",
            x=0,
            y=0,
            yshift=-50 - 16 * above,
            xanchor="left",
            yanchor="top",
            align="left",
            showarrow=False,
            font={"size": 11, "color": "#444"},
        )
        above += text.count("<br>") + 1
    return 70 + 16 * above


def _style_axes(fig: go.Figure, num_lanes: int, origin: Any) -> None:
    # Milliseconds, not microseconds, and short: the title must fit under a narrow plot.
    start = (
        f"{origin:%Y-%m-%d %H:%M:%S}.{origin.microsecond // 1000:03d} UTC"
        if origin is not None
        else "n/a"
    )
    fig.update_layout(
        barmode="overlay",
        showlegend=True,  # even with one outcome: the colour must say what it means
        legend={"title": {"text": "outcome"}},
        hoverlabel={"align": "left"},
        xaxis={
            "title": {"text": f"ms since the first call ({start})"},
            "rangemode": "tozero",
        },
        yaxis={
            "title": {"text": "lane (calls in flight together)"},
            "autorange": "reversed",
            "tickmode": "linear" if num_lanes <= 30 else "auto",
            "dtick": 1,
            "zeroline": False,
        },
    )
