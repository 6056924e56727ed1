"""The HTML report: one self-contained file with the summary, dashboard, gaps and timelines.

``write_report(run)`` writes a single ``.html`` file that works offline: plotly.js is embedded
once, nothing is loaded from a CDN, and every table cell is escaped. Sections:

* **Summary**: per run, rollouts, calls, token totals with their coverage, time span, gaps.
* **Dashboard**: the figures and tables of :func:`ngcapture_viz.figures.dashboard.dashboard`.
* **Gap report**: :func:`ngcapture_viz.figures.gap_report.gap_report` tables and figure.
* **Token capture** (runs with token-id capture only): masked fraction per run with reasons
  and store states, and the masked rollouts.
* **Timelines**: the slowest rollouts (by ``wall_ms``), the failing ones (errors or gaps) and a
  seeded sample of ordinary ones, each drawn by :func:`ngcapture_viz.figures.timeline.timeline`.
* **Checkpoint diff**: the frame and forest plot of a ``diff=`` when one is given.

Only aggregated figures and a handful of timelines are embedded, so the file stays small for
large runs (a few MB of plotly.js plus the figures).
"""

from __future__ import annotations

import datetime as dt
import html
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go
import polars as pl

from ngcapture_viz._report_summary import summary_frame, summary_section
from ngcapture_viz.display._html import Section, figure_html, page, table_html
from ngcapture_viz.display.cards import TOKEN_CAPTURE_CAPTION
from ngcapture_viz.figures.dashboard import dashboard
from ngcapture_viz.figures.gap_report import gap_report
from ngcapture_viz.figures.timeline import CAUSALITY_NOTE, timeline
from ngcapture_viz.frames.tokens import token_capture_summary
from ngcapture_viz.run import CaptureRun, stack_runs

if TYPE_CHECKING:
    from ngcapture_viz.diff.compare import CheckpointDiff

__all__ = ["TimelinePicks", "pick_timelines", "render_report", "summary_frame", "write_report"]

PathLike = str | os.PathLike[str]
RunOrRuns = CaptureRun | Sequence[CaptureRun]

_FAILING = (
    (pl.col("num_errors").fill_null(0) > 0)
    | (pl.col("num_gaps").fill_null(0) > 0)
    | (pl.col("num_damaged").fill_null(0) > 0)
    | pl.col("incomplete").fill_null(False)
    | pl.col("failed").fill_null(False)
)


@dataclass(frozen=True)
class TimelinePicks:
    """How many rollout timelines the report draws, per kind.

    Attributes:
        slowest: rollouts with the longest ``wall_ms``.
        failing: rollouts with an error, a gap, a damaged line or an incomplete marker.
        sample: a seeded random sample of the remaining (ordinary) rollouts.

    Example:
        >>> write_report(run, timelines=TimelinePicks(slowest=5, sample=0))  # doctest: +SKIP
    """

    slowest: int = 3
    failing: int = 3
    sample: int = 3


def write_report(
    run_or_runs: RunOrRuns,
    out: PathLike = "report.html",
    *,
    diff: CheckpointDiff | None = None,
    title: str | None = None,
    timelines: TimelinePicks | Mapping[str, int] = TimelinePicks(),
    seed: int = 0,
) -> Path:
    """Write the self-contained HTML report of one run or several, and return its path.

    Args:
        run_or_runs: a run from ``open_run``, a stack from ``open_runs``, or a list of runs.
        out: the file to write (parent folders are created).
        diff: a checkpoint diff (``ngcapture_viz.diff.diff(a, b)``) to add as a section.
        title: the page title (default: "ngcapture report: <run labels>").
        timelines: how many slowest, failing and sampled rollouts get a timeline.
        seed: the seed of the ordinary-rollout sample (same seed, same rollouts).

    Example:
        >>> run = open_run("results/demo/ckpt-100/model-calls",  # doctest: +SKIP
        ...                "results/demo/ckpt-100/rollouts.jsonl")
        >>> write_report(run, "results/demo/ckpt-100/report.html")  # doctest: +SKIP
        PosixPath('results/demo/ckpt-100/report.html')
    """
    text = render_report(run_or_runs, diff=diff, title=title, timelines=timelines, seed=seed)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def render_report(
    run_or_runs: RunOrRuns,
    *,
    diff: CheckpointDiff | None = None,
    title: str | None = None,
    timelines: TimelinePicks | Mapping[str, int] = TimelinePicks(),
    seed: int = 0,
) -> str:
    """The report as an HTML string (what :func:`write_report` writes).

    Example:
        >>> picks = {"slowest": 1, "failing": 1, "sample": 0}
        >>> html = render_report(run, timelines=picks)  # doctest: +SKIP
    """
    run = _as_run(run_or_runs)
    picks = timelines if isinstance(timelines, TimelinePicks) else TimelinePicks(**timelines)
    labels = ", ".join(run.labels)
    sections = [
        summary_section(run),
        _dashboard_section(run),
        _gaps_section(run),
        _timelines_section(run, pick_timelines(run, picks, seed=seed)),
    ]
    if run.tokens.height:
        sections.insert(3, _tokens_section(run))
    if diff is not None:
        sections.append(_diff_section(diff))
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = (
        f"{run.rollouts.height:,} rollouts and {run.calls.height:,} calls in {len(run.labels)} "
        f"run(s); generated {generated} by ngcapture_viz. A dash (—) means unknown, never zero."
    )
    return page(title or f"ngcapture report: {labels}", subtitle, sections)


def _as_run(run_or_runs: RunOrRuns) -> CaptureRun:
    if isinstance(run_or_runs, CaptureRun):
        return run_or_runs
    runs = list(run_or_runs)
    if not runs:
        raise ValueError("write_report needs at least one run")
    return runs[0] if len(runs) == 1 else stack_runs(runs)


# -- dashboard, gaps, diff -----------------------------------------------------------------

# Dashboard tables that only hold the points of a figure drawn above (bins, time buckets), or
# that have a section of their own (token capture).
_FIGURE_DATA_TABLES = frozenset({"token_histogram", "over_time", "token_capture"})


def _dashboard_section(run: CaptureRun) -> Section:
    board = dashboard(run)
    parts = [figure_html(fig, caption=_title(name)) for name, fig in board.figures.items()]
    parts += [
        table_html(frame, caption=_title(name))
        for name, frame in board.tables.items()
        if name not in _FIGURE_DATA_TABLES
    ]
    return Section("dashboard", "Dashboard", "\n".join(parts))


def _gaps_section(run: CaptureRun) -> Section:
    report = gap_report(run)
    parts = [
        table_html(report.summary, caption="Coverage"),
        table_html(report.by_code, caption="Gaps by code"),
        figure_html(report.figure(), caption="Gaps by code and run"),
        table_html(report.damaged, caption="Damaged lines"),
        table_html(report.missing, caption="Rollouts missing from the store or the rollout file"),
        table_html(report.pending, caption="Pending writes"),
    ]
    return Section("gaps", "Gap report", "\n".join(parts))


def _tokens_section(run: CaptureRun) -> Section:
    summary = token_capture_summary(run.tokens, run.labels)
    masked = run.tokens.filter(pl.col("masked").fill_null(False)).select(
        pl.col("run").cast(pl.String), "rollout_id", "mask_reasons", "state", "calls",
        "lost_calls", "incomplete",
    )  # fmt: skip
    body = (
        table_html(summary, caption=TOKEN_CAPTURE_CAPTION)
        + '<p class="note">A masked rollout is delivered with <code>mask_sample</code>: its '
        "token ids cannot be trusted for training (a lost call, calls that do not form one "
        "chain, nothing recorded). Its token capture stays in the store (frozen) as evidence; "
        "delivered ones are retired. See docs/token-store.md.</p>"
        + table_html(masked, caption="Masked rollouts")
    )
    return Section("tokens", "Token capture", body)


def _diff_section(diff: CheckpointDiff) -> Section:
    body = (
        f'<p class="note">{html.escape(str(diff).splitlines()[0] if str(diff) else "")}</p>'
        + figure_html(
            diff.figure(), caption=f"Differences with {diff.confidence:.0%} bootstrap intervals"
        )
        + table_html(diff.frame, caption="Metrics")
    )
    return Section("diff", "Checkpoint diff", body)


def _title(name: str) -> str:
    return name.replace("_", " ").capitalize()


# -- timelines -----------------------------------------------------------------------------


def pick_timelines(
    run: CaptureRun, picks: TimelinePicks = TimelinePicks(), *, seed: int = 0
) -> pl.DataFrame:
    """Which rollouts get a timeline: columns ``kind``, ``run``, ``rollout_id``, ``wall_ms``.

    Only rollouts with at least one call are eligible. ``slowest`` are the largest
    ``wall_ms``; ``failing`` the rollouts with errors, gaps, damaged lines or an incomplete
    marker (most problems first); ``sample`` a seeded sample of the others. A rollout appears
    once, under the first kind that picked it.

    Example:
        >>> pick_timelines(run, TimelinePicks(slowest=1, failing=1, sample=0))  # doctest: +SKIP
    """
    with_calls = run.calls.group_by("run", "rollout_id").agg(pl.len().alias("calls"))
    eligible = (
        run.rollouts.join(with_calls, on=["run", "rollout_id"], how="inner")
        .with_columns(
            pl.col("run").cast(pl.String),
            _FAILING.alias("failing"),
            (pl.col("num_errors").fill_null(0) + pl.col("num_gaps").fill_null(0)).alias("bad"),
        )
        .sort("run", "rollout_id")
    )
    slowest = eligible.sort("wall_ms", descending=True, nulls_last=True).head(picks.slowest)
    rest = eligible.join(slowest, on=["run", "rollout_id"], how="anti")
    failing = (
        rest.filter("failing")
        .sort(["bad", "wall_ms"], descending=True, nulls_last=True)
        .head(picks.failing)
    )
    ordinary = rest.filter(~pl.col("failing")).sort("run", "rollout_id")
    sample = ordinary.sample(min(picks.sample, ordinary.height), seed=seed, shuffle=True)
    columns = ["kind", "run", "rollout_id", "wall_ms", "calls", "num_errors", "num_gaps"]
    return pl.concat(
        [
            part.with_columns(pl.lit(kind).alias("kind")).select(columns)
            for kind, part in (("slowest", slowest), ("failing", failing), ("sample", sample))
        ]
    )


_KIND_TITLES = {
    "slowest": "Slowest rollouts",
    "failing": "Failing rollouts (failed in collection, errors, gaps or damaged lines)",
    "sample": "A sample of ordinary rollouts",
}


def _timelines_section(run: CaptureRun, picked: pl.DataFrame) -> Section:
    parts = [f'<p class="note">{html.escape(CAUSALITY_NOTE)}</p>']
    for kind, title in _KIND_TITLES.items():
        rows = picked.filter(pl.col("kind") == kind).iter_rows(named=True)
        figures = list(_timeline_figures(run, rows, timeline))
        parts.append(f"<h3>{html.escape(title)}</h3>")
        parts += figures or ['<p class="note">None.</p>']
    return Section("timelines", "Rollout timelines", "\n".join(parts))


def _timeline_figures(
    run: CaptureRun,
    rows: Iterable[dict[str, object]],
    draw: Callable[[CaptureRun, str], go.Figure],
) -> Iterable[str]:
    for row in rows:
        label, rollout_id = str(row["run"]), str(row["rollout_id"])
        wall = row["wall_ms"]
        span = f"{wall:,.0f} ms" if isinstance(wall, float) else "unknown span"
        caption = (
            f"{label} · {rollout_id} · {span}, {row['calls']} call(s), "
            f"{row['num_errors'] or 0} error(s), {row['num_gaps'] or 0} gap(s)"
        )
        yield figure_html(draw(run.runs[label], rollout_id), caption=caption)
