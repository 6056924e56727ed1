"""The agent's side of a rollout timeline: tool executions, sub-agents, compactions.

Below the call lanes, :func:`add_agent_lanes` gives each invocation that ran tools a lane of its
tool executions (bars from ``started_at`` to ``completed_at``, coloured by status, hover names
who measured the times), and each sub-agent a lane spanning the tool call that spawned it (or,
without one, its own calls and tools). A dotted link runs from the end of the model call whose
response asked for a tool call (by ``tool_call_id``) to the start of that tool's execution.
Compactions are marked at the top of the chart where the agent observed them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz.figures._timeline_text import fmt_ms
from ngcapture_viz.run import CaptureRun

__all__ = ["AgentLanes", "add_agent_lanes"]

TOOL_COLORS: Final = {"completed": "#1f77b4", "failed": "#d62728", "timeout": "#9467bd",
                      "cancelled": "#7f7f7f", "incomplete": "#bcbd22"}  # fmt: skip
SUBAGENT_COLOR: Final = "#8c6d31"


@dataclass
class AgentLanes:
    """What was added: the lane labels (y position -> label) and how many tool bars."""

    labels: dict[int, str] = field(default_factory=dict)
    tools: int = 0
    subagents: int = 0
    compactions: int = 0


def add_agent_lanes(
    fig: go.Figure,
    run: CaptureRun,
    rollout_id: str,
    placed: pl.DataFrame,
    *,
    label: str | None,
    first_lane: int,
) -> AgentLanes:  # fmt: skip
    """Add the agent lanes of one rollout under the call lanes (starting at ``first_lane``).

    ``placed`` is the timeline's placed calls (``lane``, ``_start_ms``, ``_duration_ms``,
    ``model_call_id``); times are drawn in ms since its first start.
    """
    added = AgentLanes()
    if not placed.height:
        return added
    mine = pl.col("rollout_id") == rollout_id
    if label is not None:
        mine &= pl.col("run").cast(pl.String) == label
    tools = run.tool_executions.filter(mine)
    invocations = run.invocations.filter(mine).sort("depth", "invocation_id", nulls_last=True)
    origin = placed["started_at"].min()
    tools = tools.with_columns(
        _ms(pl.col("started_at"), origin).alias("_start_ms"),
        _ms(pl.col("completed_at"), origin).alias("_end_ms"),
    )
    lane = first_lane
    tool_lane: dict[str | None, int] = {}
    for invocation in [*invocations["invocation_id"].to_list(), None]:
        own = tools.filter(_same(pl.col("invocation_id"), invocation))
        timed = own.filter(pl.col("_start_ms").is_not_null() & pl.col("_end_ms").is_not_null())
        if not timed.height:
            continue
        tool_lane[invocation] = lane
        added.labels[lane] = f"tools · {invocation or '?'}"
        added.tools += timed.height
        _add_tool_bars(fig, timed, lane)
        lane += 1
    for row in invocations.filter(pl.col("depth").fill_null(1) > 0).iter_rows(named=True):
        span = _subagent_span(row, tools, placed)
        if span is None:
            continue
        added.labels[lane] = f"sub-agent · {row['invocation_id']}"
        added.subagents += 1
        _add_subagent(fig, row, span, lane)
        lane += 1
    _add_links(fig, tools, placed, tool_lane)
    added.compactions = _add_compactions(fig, run.compactions.filter(mine), origin)
    return added


def _same(column: pl.Expr, value: str | None) -> pl.Expr:
    return column.is_null() if value is None else column == value


def _ms(column: pl.Expr, origin: Any) -> pl.Expr:
    return (column - pl.lit(origin)).dt.total_microseconds().cast(pl.Float64) / 1000.0


def _add_tool_bars(fig: go.Figure, timed: pl.DataFrame, lane: int) -> None:
    for status in sorted(set(timed["status"].cast(pl.String).fill_null("unknown").to_list())):
        part = timed.filter(pl.col("status").cast(pl.String).fill_null("unknown") == status)
        rows = part.to_dicts()
        fig.add_trace(go.Bar(
            orientation="h", y=[lane] * part.height, base=part["_start_ms"].to_list(),
            x=[max(r["_end_ms"] - r["_start_ms"], 0.0) for r in rows], width=0.6,
            name=f"tool · {status}", legendgroup=f"tool-{status}",
            showlegend=not any(t.legendgroup == f"tool-{status}" for t in fig.data),
            marker={"color": TOOL_COLORS.get(status, "#17becf"), "line": {"width": 0}},
            customdata=[[r["tool_call_id"], r["requested_by_model_call_id"]] for r in rows],
            hovertext=[_tool_text(r) for r in rows], hovertemplate="%{hovertext}<extra></extra>",
            meta={"kind": "tools", "status": status},
        ))  # fmt: skip


def _tool_text(row: dict[str, Any]) -> str:
    lines = [
        f"<b>tool {row['tool_name'] or '?'}</b> · {row['status'] or 'unknown'}",
        f"ran {fmt_ms(row['_end_ms'] - row['_start_ms'])} · from +{fmt_ms(row['_start_ms'])}",
        f"timed by: {row['timing_source'] or 'not said'} · invocation: {row['invocation_id']}",
        f"tool_call_id: {row['tool_call_id']}",
        f"asked for by call: {row['requested_by_model_call_id'] or 'not in the capture'}",
    ]
    if row["error_type"]:
        lines.append(f"error: {row['error_type']}")
    return "<br>".join(lines)


def _subagent_span(
    row: dict[str, Any], tools: pl.DataFrame, placed: pl.DataFrame
) -> tuple[float, float, str] | None:
    """Where a sub-agent ran: its spawning tool call, else the span of its calls and tools."""
    spawner = tools.filter(_same(pl.col("tool_call_id"), row["spawned_by_tool_call_id"]))
    spawner = spawner if row["spawned_by_tool_call_id"] is not None else spawner.clear()
    spawner = spawner.filter(pl.col("_start_ms").is_not_null() & pl.col("_end_ms").is_not_null())
    if spawner.height:
        return spawner["_start_ms"][0], spawner["_end_ms"][0], "the tool call that spawned it"
    calls = placed.filter(pl.col("model_call_id").is_in(row["model_call_ids"] or []))
    own = tools.filter(pl.col("invocation_id") == row["invocation_id"])
    starts = [*calls["_start_ms"].to_list(), *own["_start_ms"].drop_nulls().to_list()]
    ends = [*(calls["_start_ms"] + calls["_duration_ms"]).to_list(),
            *own["_end_ms"].drop_nulls().to_list()]  # fmt: skip
    if not starts or not ends:
        return None
    return min(starts), max(ends), "its own calls and tools"


def _add_subagent(fig: go.Figure, row: dict[str, Any], span: tuple[float, float, str],
                  lane: int) -> None:  # fmt: skip
    start, end, basis = span
    text = "<br>".join([
        f"<b>sub-agent {row['invocation_id']}</b> · {row['status'] or 'unknown'}",
        f"parent: {row['parent_invocation_id']} · spawned by: {row['spawned_by_tool_call_id']}",
        f"model calls: {row['num_model_calls']} · tool executions: {row['num_tool_calls']}",
        f"span {fmt_ms(end - start)} (from {basis})",
        "duration reported: " + (fmt_ms(row["duration_ms"]) if row["duration_ms"] is not None
                                 else "not reported"),
    ])  # fmt: skip
    fig.add_trace(go.Bar(
        orientation="h", y=[lane], base=[start], x=[max(end - start, 0.0)], width=0.6,
        name="sub-agent", legendgroup="subagent",
        showlegend=not any(t.legendgroup == "subagent" for t in fig.data),
        marker={"color": SUBAGENT_COLOR, "opacity": 0.7, "line": {"width": 0}},
        hovertext=[text], hovertemplate="%{hovertext}<extra></extra>",
        meta={"kind": "subagent", "invocation_id": row["invocation_id"]},
    ))  # fmt: skip


def _add_links(fig: go.Figure, tools: pl.DataFrame, placed: pl.DataFrame,
               tool_lane: dict[str | None, int]) -> None:  # fmt: skip
    ends = {m: (s + d, lane) for m, s, d, lane in
            placed.select("model_call_id", "_start_ms", "_duration_ms", "lane").rows()}  # fmt: skip
    xs: list[float | None] = []
    ys: list[float | None] = []
    for row in tools.iter_rows(named=True):
        asked = ends.get(row["requested_by_model_call_id"])
        lane = tool_lane.get(row["invocation_id"])
        if asked is None or lane is None or row["_start_ms"] is None:
            continue
        xs += [asked[0], row["_start_ms"], None]
        ys += [asked[1], lane, None]
    if xs:
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", line={"dash": "dot", "width": 1, "color": "#555"},
            name="tool asked for by (tool_call_id)", legendgroup="links", hoverinfo="skip",
            meta={"kind": "tool_links"},
        ))  # fmt: skip


def _add_compactions(fig: go.Figure, compactions: pl.DataFrame, origin: Any) -> int:
    timed = compactions.filter(pl.col("observed_at").is_not_null())
    if not timed.height:
        return 0
    timed = timed.with_columns(_ms(pl.col("observed_at"), origin).alias("_at_ms"))
    texts = [
        f"<b>context compaction</b> · {r['outcome']} · {r['invocation_id']}<br>"
        f"trigger: {r['trigger'] or 'not said'} · tokens {r['tokens_before']} → {r['tokens_after']}"
        for r in timed.iter_rows(named=True)
    ]
    fig.add_trace(go.Scatter(
        x=timed["_at_ms"].to_list(), y=[-0.5] * timed.height, mode="markers",
        marker={"symbol": "triangle-down", "size": 12, "color": "#ff7f0e"},
        name="context compaction", legendgroup="compaction", hovertext=texts,
        hovertemplate="%{hovertext}<extra></extra>", meta={"kind": "compactions"},
    ))  # fmt: skip
    return timed.height
