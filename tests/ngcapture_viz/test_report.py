"""The HTML report: one offline file, escaped tables, the right sections, figures and rollouts."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest
from plotly.offline import get_plotlyjs

from benchmarks.render import scale_run
from capture_core.testing import RunSpec, write_run
from ngcapture_viz import CaptureRun, open_run
from ngcapture_viz.diff import diff
from ngcapture_viz.display._html import _cell, table_html
from ngcapture_viz.figures.dashboard import dashboard
from ngcapture_viz.report import (
    TimelinePicks,
    pick_timelines,
    render_report,
    summary_frame,
    write_report,
)

BUNDLE = get_plotlyjs()
HOSTILE_MODEL = '<script>alert("model")</script>'
HOSTILE_DETAIL = "<img src=x onerror=alert(1)> & more"


def _open(directory: Path, spec: RunSpec, label: str) -> CaptureRun:
    synthetic = write_run(directory, spec)
    # One torn line: a damaged-line gap in a rollout (a "failing" rollout without an error).
    victim = sorted(synthetic.capture_dir.glob("*.capture.jsonl"))[-1]
    with victim.open("ab") as handle:
        handle.write(b'{"model_call_id": "torn", "dialect": "chat"\n')
    return open_run(synthetic.capture_dir, synthetic.rollouts, label=label, index=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[CaptureRun, CaptureRun]:
    root = tmp_path_factory.mktemp("report")
    spec = RunSpec(tasks=12, repeats=2, calls=(1, 5), concurrency=2, error_rate=0.1, seed=3)
    a = _open(root / "a", spec, "ckpt-a")
    b = _open(root / "b", RunSpec(**{**spec.__dict__, "seed": 4, "latency_scale": 1.1}), "ckpt-b")
    return a, b


@pytest.fixture(scope="module")
def report(runs: tuple[CaptureRun, CaptureRun], tmp_path_factory: pytest.TempPathFactory) -> str:
    path = write_report(list(runs), tmp_path_factory.mktemp("out") / "sub" / "report.html")
    return path.read_text(encoding="utf-8")


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _tags(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Tags()
    parser.feed(html.replace(BUNDLE, ""))
    return parser.tags


def _figure_count(html: str) -> int:
    return len(re.findall(r'<div id="[^"]+" class="plotly-graph-div"', html))


def test_the_report_is_one_file_that_loads_nothing(report: str) -> None:
    assert report.count(BUNDLE) == 1  # plotly.js inlined exactly once
    tags = _tags(report)
    assert [tag for tag, _ in tags if tag in {"link", "img", "iframe", "object", "embed"}] == []
    assert [attrs for _, attrs in tags if "src" in attrs] == []  # no <script src=...>
    hrefs = [attrs["href"] for _, attrs in tags if "href" in attrs]
    assert hrefs and all(href and href.startswith("#") for href in hrefs)  # in-page anchors
    scripts = [tag for tag, _ in tags if tag == "script"]
    assert len(scripts) == 1 + _figure_count(report)  # the bundle, then one per figure
    style = report.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "url(" not in style and "@import" not in style


def test_sections_and_one_figure_per_dashboard_gap_timeline(
    runs: tuple[CaptureRun, CaptureRun], report: str
) -> None:
    ids = re.findall(r'<section id="([^"]+)">', report)
    assert ids == ["summary", "dashboard", "gaps", "timelines"]  # no diff was given
    board = dashboard(list(runs))
    picks = pick_timelines(_stack(runs))
    assert picks.height == 9
    assert _figure_count(report) == len(board.figures) + 1 + picks.height
    # Each picked rollout has its own captioned timeline, in pick order.
    captions = re.findall(r"<h3>(ckpt-[ab]) · ([^ ]+) · ", report)
    assert captions == list(zip(picks["run"], picks["rollout_id"], strict=True))


def _stack(runs: tuple[CaptureRun, CaptureRun]) -> CaptureRun:
    from ngcapture_viz import stack_runs

    return stack_runs(list(runs))


def test_pick_timelines_slowest_failing_and_a_seeded_sample(
    runs: tuple[CaptureRun, CaptureRun],
) -> None:
    run = _stack(runs)
    picks = pick_timelines(run, TimelinePicks(slowest=4, failing=5, sample=3), seed=7)
    assert picks["kind"].value_counts(sort=True).rows() == [("failing", 5), ("slowest", 4),
                                                            ("sample", 3)]  # fmt: skip
    assert picks.select("run", "rollout_id").is_unique().all()
    rollouts = run.rollouts.with_columns(pl.col("run").cast(pl.String))
    expected_slowest = rollouts.sort("wall_ms", descending=True, nulls_last=True).head(4)
    slowest = picks.filter(pl.col("kind") == "slowest")
    assert slowest["rollout_id"].to_list() == expected_slowest["rollout_id"].to_list()
    assert slowest["wall_ms"].to_list() == expected_slowest["wall_ms"].to_list()

    flags = picks.join(rollouts, on=["run", "rollout_id"]).with_columns(
        (pl.col("num_errors") + pl.col("num_gaps") + pl.col("num_damaged")).alias("problems")
    )
    assert (flags.filter(pl.col("kind") == "failing")["problems"] > 0).all()
    assert (flags.filter(pl.col("kind") == "sample")["problems"] == 0).all()
    failing = picks.filter(pl.col("kind") == "failing").join(
        rollouts, on=["run", "rollout_id"], maintain_order="left"
    )
    problems = failing["num_errors"] + failing["num_gaps"]
    assert problems.to_list() == sorted(problems.to_list(), reverse=True)  # worst first

    every = pick_timelines(run, TimelinePicks(slowest=4, failing=1000, sample=0))
    with_problems = rollouts.filter(
        pl.col("num_calls") > 0,
        (pl.col("num_errors") + pl.col("num_gaps") + pl.col("num_damaged")) > 0,
    ).join(slowest, on=["run", "rollout_id"], how="anti")
    picked_failing = every.filter(pl.col("kind") == "failing")
    assert set(picked_failing.select("run", "rollout_id").rows()) == set(
        with_problems.select("run", "rollout_id").rows()
    )
    damaged = rollouts.filter(pl.col("num_damaged") > 0)
    assert damaged.height == 2  # one torn line per run, and both are among the failing
    assert every.join(damaged, on=["run", "rollout_id"]).height == 2

    again = pick_timelines(run, TimelinePicks(slowest=4, failing=5, sample=3), seed=7)
    assert again.equals(picks)  # same seed, same sample
    samples = {
        tuple(pick_timelines(run, TimelinePicks(0, 0, 3), seed=s)["rollout_id"]) for s in range(5)
    }
    assert len(samples) > 1  # the seed matters
    assert pick_timelines(run, TimelinePicks(0, 0, 0)).height == 0


def test_summary_totals_sum_what_was_reported_and_count_coverage(
    runs: tuple[CaptureRun, CaptureRun],
) -> None:
    run = runs[0]
    calls = run.calls.with_columns(
        pl.when(pl.col("call_index") == 0).then(None).otherwise("tokens_in").alias("tokens_in"),
        pl.lit(None, pl.Int64).alias("tokens_reasoning"),
    )
    partial = CaptureRun(
        "partial", calls=calls.with_columns(pl.lit("partial").cast(pl.Categorical).alias("run")),
        rollouts=run.rollouts.with_columns(pl.lit("partial").cast(pl.Categorical).alias("run")),
        gaps=run.gaps.with_columns(pl.lit("partial").cast(pl.Categorical).alias("run")),
        tool_calls=run.tool_calls,
    )  # fmt: skip
    row = summary_frame(partial).row(0, named=True)
    assert row["calls"] == calls.height
    assert row["tokens_in"] == calls["tokens_in"].sum()
    assert row["tokens_in_reported"] == calls["tokens_in"].count() < calls.height
    assert row["tokens_reasoning"] is None  # nobody reported it: unknown, not 0
    assert row["tokens_reasoning_reported"] == 0
    assert row["errors"] == calls["error_category"].is_not_null().sum() > 0
    assert row["gaps"] == run.gaps.height == 1
    assert row["rollouts"] == run.rollouts.height
    assert row["rollouts_in_store"] == run.rollouts["in_store"].sum()
    span = (calls["completed_at"].max() - calls["started_at"].min()).total_seconds()  # type: ignore[operator]
    assert row["span_s"] == pytest.approx(span, abs=1e-3)


def test_summary_latency_percentiles_are_polars_quantiles(
    runs: tuple[CaptureRun, CaptureRun], report: str
) -> None:
    summary = report.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    table = summary.split("Latency and time to first token per call", 1)[1]
    rows = re.findall(r"<tr><td>(ckpt-[ab])</td>((?:<td[^>]*>[^<]*</td>)+)</tr>", table)
    assert [label for label, _ in rows] == ["ckpt-a", "ckpt-b"]
    for (label, cells), run in zip(rows, runs, strict=True):
        values = re.findall(r"<td[^>]*>([^<]*)</td>", cells)
        latency = run.calls["latency_total_ms"]
        ttft = run.calls["latency_ttft_ms"]
        expected = [
            _cell(latency.quantile(0.5, "linear")),
            _cell(latency.quantile(0.95, "linear")),
            f"{latency.count()} of {run.calls.height}",
            _cell(ttft.quantile(0.5, "linear")),
            _cell(ttft.quantile(0.95, "linear")),
            f"{ttft.count()} of {run.calls.height}",
        ]
        assert values == expected, label
        assert ttft.count() < run.calls.height  # failed calls report no TTFT: coverage shows it


def test_user_strings_are_escaped_everywhere(runs: tuple[CaptureRun, CaptureRun]) -> None:
    run = runs[0]
    hostile = CaptureRun(
        "ckpt-a",
        calls=run.calls.with_columns(pl.lit(HOSTILE_MODEL).cast(pl.Categorical).alias("model")),
        rollouts=run.rollouts,
        gaps=run.gaps.with_columns(pl.lit(HOSTILE_DETAIL).alias("detail")),
        tool_calls=run.tool_calls,
    )
    html = render_report(hostile, title="<b>title</b>").replace(BUNDLE, "")
    assert "<img" not in html and "<b>title</b>" not in html
    assert HOSTILE_MODEL not in html
    assert "&lt;img src=x onerror=alert(1)&gt; &amp; more" in html  # the gap table cell
    assert "&lt;script&gt;alert(&quot;model&quot;)&lt;/script&gt;" in html  # a dashboard table
    assert "<title>&lt;b&gt;title&lt;/b&gt;</title>" in html


def test_table_html_shows_unknown_and_caps_rows() -> None:
    frame = pl.DataFrame({"a<b": [1, None, 3], "name": ["x", "<y>", None]})
    html = table_html(frame, max_rows=2)
    assert "<th>a&lt;b</th>" in html
    assert html.count('<td class="unknown" title="unknown">—</td>') == 1  # row 3 is cut
    assert "&lt;y&gt;" in html and "<y>" not in html
    assert "Showing the first 2 of 3 rows" in html
    assert "None." in table_html(frame.head(0))


def test_the_diff_section_has_the_frame_and_forest_plot(
    runs: tuple[CaptureRun, CaptureRun], tmp_path: Path
) -> None:
    change = diff(*runs)
    path = write_report(_stack(runs), tmp_path / "r.html", diff=change, timelines={"slowest": 1,
                        "failing": 0, "sample": 0})  # fmt: skip
    html = path.read_text(encoding="utf-8")
    assert re.findall(r'<section id="([^"]+)">', html)[-1] == "diff"
    diff_part = html.split('<section id="diff">', 1)[1]
    assert _figure_count(diff_part) == 1
    for metric in change.frame["metric"]:
        assert f"<td>{metric}</td>" in diff_part
    board = dashboard(_stack(runs))
    assert _figure_count(html) == len(board.figures) + 1 + 1 + 1  # dashboard, gaps, 1, diff


def test_the_report_stays_small_as_calls_grow(runs: tuple[CaptureRun, CaptureRun]) -> None:
    small = render_report(scale_run(runs[0], 1_000))
    large = render_report(scale_run(runs[0], 20_000))
    assert "20,000 calls" in large
    # Figures are aggregated: 20x the calls adds well under a megabyte.
    assert len(large.encode()) - len(small.encode()) < 1_000_000
    assert len(large.encode()) < 20_000_000


def test_a_source_not_given_is_unknown_in_the_summary_not_zero(tmp_path: Path) -> None:
    written = write_run(tmp_path / "run", RunSpec(tasks=3, repeats=1))
    store_only = summary_frame(open_run(written.capture_dir)).row(0, named=True)
    assert store_only["rollouts_in_file"] is None
    assert store_only["rollouts_in_store"] == store_only["rollouts"] > 0
    file_only = summary_frame(open_run(rollouts=written.rollouts)).row(0, named=True)
    assert file_only["rollouts_in_store"] is None
    assert file_only["rollouts_in_file"] == file_only["rollouts"] > 0
