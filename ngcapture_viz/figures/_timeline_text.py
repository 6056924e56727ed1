"""The words of a rollout timeline: call hover text, notes under the chart and the subtitle.

Pure functions from rows and frames to strings (plotly's ``<br>`` line breaks);
:mod:`ngcapture_viz.figures.timeline` draws the chart and places them. Unknown values read
``not reported``, never 0.

Example:
    >>> fmt_ms(1500.0)
    '1.50 s'
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any, Final

import polars as pl

__all__ = ["fmt_ms", "gaps_note", "hover_text", "subtitle", "unplaced_note"]

_MAX_GAP_LINES: Final = 8
_MAX_UNPLACED_LINES: Final = 5
_NOT_REPORTED: Final = "not reported"
#: Characters per line of a note under the chart: it wraps (never cut) to fit a narrow figure.
_NOTE_CHARS: Final = 68


def hover_text(row: Mapping[str, Any]) -> str:
    """Hover text of one call bar (a row of the placed calls, with ``_outcome``)."""

    def known(value: Any) -> str:
        return _NOT_REPORTED if value is None else f"{value:,}"

    tools = row["tool_names"] or []
    ttft = row["latency_ttft_ms"]
    if ttft is None:
        ttft_text = _NOT_REPORTED if row["stream"] else "n/a (not streamed)"
    else:
        ttft_text = fmt_ms(ttft)
    latency = row["latency_total_ms"]
    lines = [
        f"<b>call #{row['call_index']}</b> · {row['_outcome']}",
        f"model: {row['model'] or _NOT_REPORTED} · dialect: {row['dialect']}"
        f" · stream: {row['stream']}",
        f"tokens in: {known(row['tokens_in'])} · out: {known(row['tokens_out'])}"
        f" · reasoning: {known(row['tokens_reasoning'])} · cached: {known(row['cached_tokens'])}",
        f"finish reason: {row['finish_reason'] or _NOT_REPORTED}",
        f"tool calls: {', '.join(tools) if tools else 'none'}",
        f"latency: {_NOT_REPORTED if latency is None else fmt_ms(latency)} · TTFT: {ttft_text}",
        f"start +{fmt_ms(row['_start_ms'])} · "
        f"end +{fmt_ms(row['_start_ms'] + row['_duration_ms'])}",
        f"call_index: {row['call_index']} · model_call_id: {row['model_call_id']}",
    ]
    if row["error_category"] is not None:
        lines.append(f"error: {row['error_category']} {row['error_code'] or ''}".rstrip())
    if row["source"] == "attachment":
        lines.append("source: rollout attachment (no payload)")
    return "<br>".join(lines)


def unplaced_note(unplaced: pl.DataFrame) -> str:
    """The note naming calls that could not be placed on the time axis."""
    listed = [
        f"#{i} ({m})"
        for i, m in unplaced.select("call_index", "model_call_id").head(_MAX_UNPLACED_LINES).rows()
    ]
    more = unplaced.height - len(listed)
    tail = f" and {more} more" if more > 0 else ""
    return _wrapped(
        f"{unplaced.height} call(s) not drawn (no start/end time, or ended before starting): "
        + ", ".join(listed)
        + tail
    )


def gaps_note(gaps: pl.DataFrame) -> str:
    """The note listing the rollout's gaps (the first few, then a count)."""
    lines = [f"<b>{gaps.height} gap(s) in this rollout's evidence:</b>"]
    for row in gaps.head(_MAX_GAP_LINES).iter_rows(named=True):
        where = f" (line {row['line_number']})" if row["line_number"] is not None else ""
        lines.append(_wrapped(f"{row['code']}{where}: {row['detail'] or ''}"))
    if gaps.height > _MAX_GAP_LINES:
        lines.append(f"… and {gaps.height - _MAX_GAP_LINES} more (see gap_report)")
    return "<br>".join(lines)


def _wrapped(line: str) -> str:
    """``line`` broken at spaces into lines of at most ``_NOTE_CHARS`` (continuations indented);
    a word longer than that stays whole."""
    parts = textwrap.wrap(line, _NOTE_CHARS, subsequent_indent="  ", break_long_words=False)
    return "<br>".join(parts) or line


def fmt_ms(ms: float) -> str:
    """A duration in ms, s or min and s, whichever reads best."""
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    minutes, seconds = divmod(ms / 1000, 60)
    return f"{minutes:.0f} min {seconds:.0f} s"


def subtitle(
    placed: pl.DataFrame, num_lanes: int, idle: list[tuple[float, float]], num_gaps: int
) -> str:
    """Calls, lanes, wall time, idle time (and its share) and gaps of the drawn rollout."""
    ends = (placed["_start_ms"] + placed["_duration_ms"]).max()
    wall = float(ends) if isinstance(ends, float) else 0.0
    idle_ms = sum(end - start for start, end in idle)
    share = f" ({100 * idle_ms / wall:.0f}%)" if wall else ""
    return (
        f"{placed.height} call(s) · {num_lanes} lane(s) · wall {fmt_ms(wall)} · "
        f"idle {fmt_ms(idle_ms)}{share} · {num_gaps} gap(s)"
    )
