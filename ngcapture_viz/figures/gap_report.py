"""The gap report: how much of a run the evidence covers, and what is missing or damaged.

``gap_report(run)`` gathers, per run of a stack:

* ``summary``  coverage of rollouts and calls by capture and of every metric by the calls
               (count, total, share; a null count means the source was not given: unknown)
* ``by_code``  gap counts by code with their meaning and the number of rollouts affected
* ``damaged``  damaged capture lines with file and line number
* ``missing``  rollouts missing from the store or from the rollout file
* ``pending``  capture writes that had not landed

Example::

    import ngcapture_viz as ngv

    run = ngv.open_run("results/demo/ckpt-100/model-calls", "results/demo/ckpt-100/rollouts.jsonl")
    report = ngv.gap_report(run)
    report.by_code
    report.figure()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from capture_core import GapCode
from ngcapture_viz.display.figure import Figure
from ngcapture_viz.display.full_text import full_text
from ngcapture_viz.figures.style import run_colors
from ngcapture_viz.frames.gaps import GAPS, AnalysisGap, gap_meaning
from ngcapture_viz.run import CaptureRun

__all__ = ["COVERAGE_METRICS", "GapReport", "gap_report"]

#: Call columns whose coverage the summary reports (how many calls reported them).
COVERAGE_METRICS: Final = (
    "tokens_in",
    "tokens_out",
    "tokens_reasoning",
    "cached_tokens",
    "latency_total_ms",
)

_SUMMARY_SCHEMA: Final = pl.Schema(
    {
        "run": pl.Categorical(),
        "group": pl.String(),
        "metric": pl.String(),
        "description": pl.String(),
        "count": pl.Int64(),
        "total": pl.Int64(),
        "share": pl.Float64(),
    }
)
_BY_CODE_SCHEMA: Final = pl.Schema(
    {
        "run": pl.Categorical(),
        "code": pl.String(),
        "count": pl.Int64(),
        "rollouts": pl.Int64(),
        "meaning": pl.String(),
    }
)
_DAMAGED_COLUMNS: Final = (
    "run",
    "rollout_id",
    "path",
    "line_number",
    "call_index",
    "byte_offset",
    "detail",
)
_MISSING_COLUMNS: Final = ("run", "rollout_id", "code", "detail", "path", "line_number")
_PENDING_COLUMNS: Final = ("run", "rollout_id", "model_call_id", "path", "detail")
_MISSING_CODES: Final = (AnalysisGap.NOT_IN_STORE.value, AnalysisGap.NOT_IN_ROLLOUTS.value)
#: How far below the plots the legend starts: past the tick labels and the axis title.
_LEGEND_DROP_PX: Final = 62


@dataclass(frozen=True)
class GapReport:
    """Coverage and gaps of a run (or of each run of a stack); see :func:`gap_report`.

    Attributes:
        summary: run, group (rollouts / calls / reported), metric, description, count, total,
            share. ``count`` is null when the source that would tell was not given.
        by_code: run, code, count, rollouts (distinct rollouts affected), meaning.
        damaged: damaged capture lines: run, rollout_id, path, line_number, call_index,
            byte_offset, detail.
        missing: rollouts missing from the store or the rollout file: run, rollout_id, code,
            detail, path, line_number.
        pending: pending capture writes: run, rollout_id, model_call_id, path, detail.
        gaps: every gap, one row each (the run's ``gaps`` frame).

    Printed (``print(report)``) or displayed, the report and its ``summary``, ``by_code``,
    ``damaged``, ``missing`` and ``pending`` frames show meanings and details in full.
    """

    summary: pl.DataFrame
    by_code: pl.DataFrame
    damaged: pl.DataFrame
    missing: pl.DataFrame
    pending: pl.DataFrame
    gaps: pl.DataFrame = field(default_factory=GAPS.empty)

    def __post_init__(self) -> None:
        # Meanings, details and descriptions are the point: printed or displayed, in full.
        # (``gaps`` stays the run's frame: ten columns, Polars shows it as it does any frame.)
        for name in ("summary", "by_code", "damaged", "missing", "pending"):
            object.__setattr__(self, name, full_text(getattr(self, name)))

    @property
    def subtitle(self) -> str:
        """One line: gaps, damaged lines, rollouts missing from a source, pending writes."""
        return _subtitle(self)

    def __repr__(self) -> str:
        return f"<GapReport: {self.subtitle}>"

    def __str__(self) -> str:
        """Counts by code with their meanings, then each gap's detail, in full."""
        from ngcapture_viz.display.cards import gap_report_text

        return gap_report_text(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from ngcapture_viz.display.cards import gap_report_html, gap_report_text, html_bundle

        return html_bundle(gap_report_text(self), lambda js: gap_report_html(self, plotlyjs=js))

    def _repr_html_(self) -> str:
        return self._repr_mimebundle_()["text/html"]

    def figure(self) -> go.Figure:
        """Gap counts by code (one bar series per run) beside the coverage shares.

        Example:
            >>> gap_report(run).figure()  # doctest: +SKIP
        """
        n_codes = max(self.by_code["code"].n_unique(), 1)
        n_metrics = max(self.summary["metric"].n_unique(), 1)
        # Stacked, not side by side: the coverage labels are long and need the full width.
        fig = make_subplots(
            figure=Figure(),
            rows=2,
            cols=1,
            subplot_titles=("Gaps by code", "Coverage (share of the total; count/total)"),
            row_heights=[n_codes + 1, n_metrics],
            vertical_spacing=0.12,
        )
        runs = self.summary["run"].cast(pl.String).unique(maintain_order=True).to_list()
        colors = run_colors(runs)
        for run in runs:
            color = colors[run]
            codes = self.by_code.filter(pl.col("run").cast(pl.String) == run)
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    y=codes["code"].to_list(),
                    x=codes["count"].to_list(),
                    name=run,
                    legendgroup=run,
                    showlegend=False,
                    marker_color=color,
                    hovertext=[
                        f"{c}: {n} gap(s) in {r} rollout(s)<br>{m}"
                        for c, n, r, m in codes.select(
                            "code", "count", "rollouts", "meaning"
                        ).rows()
                    ],
                    hovertemplate="%{hovertext}<extra>%{fullData.name}</extra>",
                    meta={"kind": "gaps", "run": run},
                ),
                row=1,
                col=1,
            )
            cover = self.summary.filter(pl.col("run").cast(pl.String) == run)
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    y=cover["description"].to_list(),
                    x=[None if s is None else 100 * s for s in cover["share"].to_list()],
                    text=[
                        "unknown" if c is None else f"{c}/{t}"
                        for c, t in cover.select("count", "total").rows()
                    ],
                    # Beside the bar at a readable size (inside, plotly shrank it to the
                    # bar's thickness), so that a 0/40 row says so too.
                    textposition="outside",
                    constraintext="none",
                    cliponaxis=False,
                    textfont={"size": 11},
                    name=run,
                    legendgroup=run,
                    marker_color=color,
                    # Every run has coverage bars, not every run has gaps: these name them.
                    showlegend=True,
                    hovertemplate="%{y}: %{text}<extra>%{fullData.name}</extra>",
                    meta={"kind": "coverage", "run": run},
                ),
                row=2,
                col=1,
            )
        if self.by_code.height == 0:
            fig.add_annotation(
                text="no gaps: every piece of evidence<br>is present and readable",
                xref="x domain",
                yref="y domain",
                x=0.5,
                y=0.5,
                showarrow=False,
                name="no-gaps",
            )
            fig.update_xaxes(visible=False, row=1, col=1)
            fig.update_yaxes(visible=False, row=1, col=1)
        per_row = 20 * max(1, len(runs))
        height = min(1600, 300 + per_row * (n_codes + 1 + n_metrics))
        fig.update_layout(
            title={"text": "Gap report", "subtitle": {"text": _subtitle(self)}},
            barmode="group",
            height=height,
            # Below the figure, not beside it: the coverage labels already take the left
            # third, and a legend at the right left the bars too narrow for their labels.
            legend={
                "title": {"text": "run"},
                "orientation": "h",
                "yanchor": "top",
                "x": 0,
                "y": -_LEGEND_DROP_PX / max(1, height - 100 - 80),
            },
            margin={"t": 100},
        )
        fig.update_yaxes(autorange="reversed", automargin=True)
        fig.update_xaxes(title_text="gaps", row=1, col=1)
        fig.update_xaxes(
            title_text="% of the total",
            range=[0, 118],  # room for the count/total beside a full bar
            tickvals=[0, 20, 40, 60, 80, 100],
            row=2,
            col=1,
        )
        return fig


def gap_report(run: CaptureRun) -> GapReport:
    """Coverage of a run by its evidence, and every gap grouped for reading.

    Works on a stack of runs: every frame has a ``run`` column and the figure one series per run.

    Example:
        >>> report = gap_report(run)  # doctest: +SKIP
        >>> report.summary.filter(pl.col("metric") == "tokens_in")  # doctest: +SKIP
    """
    gaps = run.gaps.with_columns(pl.col("code").cast(pl.String))
    labels = run.labels or sorted(set(run.calls["run"].cast(pl.String).to_list()))
    rows: list[dict[str, Any]] = []
    for label in labels:
        mine = pl.col("run").cast(pl.String) == label
        rows += _coverage_rows(label, run.rollouts.filter(mine), run.calls.filter(mine))
    summary = pl.DataFrame(rows, schema=_SUMMARY_SCHEMA, orient="row") if rows else None
    return GapReport(
        summary=summary if summary is not None else pl.DataFrame(schema=_SUMMARY_SCHEMA),
        by_code=_by_code(gaps),
        damaged=_select(gaps, [AnalysisGap.DAMAGED_LINE.value], _DAMAGED_COLUMNS),
        missing=_select(gaps, list(_MISSING_CODES), _MISSING_COLUMNS),
        pending=_select(gaps, [GapCode.MODEL_CALL_CAPTURE_PENDING.value], _PENDING_COLUMNS),
        gaps=run.gaps,
    )


def _coverage_rows(label: str, rollouts: pl.DataFrame, calls: pl.DataFrame) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(group: str, metric: str, description: str, count: int | None, total: int) -> None:
        share = None if count is None or total == 0 else count / total
        rows.append(
            {
                "run": label,
                "group": group,
                "metric": metric,
                "description": description,
                "count": count,
                "total": total,
                "share": share,
            }
        )

    num_rollouts, num_calls = rollouts.height, calls.height
    add("rollouts", "rollouts", "rollouts", num_rollouts, num_rollouts)
    add(
        "rollouts",
        "rollouts_with_capture_file",
        "rollouts with a capture file",
        _known_count(rollouts["in_store"], rollouts["path"].is_not_null()),
        num_rollouts,
    )
    add(
        "rollouts",
        "rollouts_in_rollout_file",
        "rollouts in the rollout file",
        _known_count(rollouts["in_rollouts"], rollouts["in_rollouts"].fill_null(False)),
        num_rollouts,
    )
    add(
        "rollouts",
        "rollouts_with_calls",
        "rollouts with ≥1 captured call",
        int((rollouts["num_calls"] > 0).sum()),
        num_rollouts,
    )
    add("calls", "calls", "calls", num_calls, num_calls)
    source = calls["source"].cast(pl.String)
    add(
        "calls",
        "calls_from_store",
        "calls from the store",
        int((source == "store").sum()),
        num_calls,
    )
    add(
        "calls",
        "calls_from_attachment_only",
        "calls from a rollout attachment only",
        int((source == "attachment").sum()),
        num_calls,
    )
    category = calls["error_category"].cast(pl.String)
    add(
        "calls",
        "calls_abandoned",
        "calls the client abandoned (client_disconnected)",
        int((category == "client_disconnected").sum()),
        num_calls,
    )
    for metric in COVERAGE_METRICS:
        reported = int(calls[metric].is_not_null().sum())
        add("reported", metric, f"calls reporting {metric}", reported, num_calls)
    streamed = calls.filter(pl.col("stream").fill_null(False))
    add(
        "reported",
        "latency_ttft_ms",
        "streamed calls reporting latency_ttft_ms",
        int(streamed["latency_ttft_ms"].is_not_null().sum()),
        streamed.height,
    )
    return rows


def _known_count(flag: pl.Series, hits: pl.Series) -> int | None:
    """How many rows are hits, or None when ``flag`` is null everywhere (source not given)."""
    if flag.len() and flag.null_count() == flag.len():
        return None
    return int(hits.sum())


def _by_code(gaps: pl.DataFrame) -> pl.DataFrame:
    counted = (
        gaps.group_by("run", "code")
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("rollout_id").drop_nulls().n_unique().cast(pl.Int64).alias("rollouts"),
        )
        .sort(["run", "count", "code"], descending=[False, True, False])
    )
    meanings = pl.Series(
        "meaning", [gap_meaning(code) for code in counted["code"].to_list()], dtype=pl.String
    )
    return counted.with_columns(meanings).select(
        pl.col(name).cast(dtype) for name, dtype in _BY_CODE_SCHEMA.items()
    )


def _select(gaps: pl.DataFrame, codes: list[str], columns: tuple[str, ...]) -> pl.DataFrame:
    keys = [
        name for name in ("run", "rollout_id", "line_number", "model_call_id") if name in columns
    ]
    return gaps.filter(pl.col("code").is_in(codes)).select(columns).sort(keys, nulls_last=True)


def _subtitle(report: GapReport) -> str:
    gaps = int(report.by_code["count"].sum()) if report.by_code.height else 0
    return (
        f"{gaps} gap(s) · {report.damaged.height} damaged line(s) · "
        f"{report.missing.height} rollout(s) missing from a source · "
        f"{report.pending.height} pending write(s)"
    )
