"""Rich display: figure bundles, the plotly.js ledger, and the HTML of every result object."""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

import nbformat
import orjson
import polars as pl
import pytest
from nbclient import NotebookClient

import ngcapture_viz as ngv
from capture_core.testing import CaptureLineFactory
from ngcapture_viz.display.figure import PLOTLY_MIME, Figure, figure_bundle
from ngcapture_viz.display.plotlyjs import PlotlyJsLedger, Where
from ngcapture_viz.frames import FrameSchema
from tests.ngcapture_viz.conftest import write_capture

PLOTLYJS_MARK = "plotly.js v"  # the banner at the top of the embedded library


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> ngv.CaptureRun:
    root = tmp_path_factory.mktemp("display")
    opened = []
    for label, seed in (("a<script>alert(1)</script>", 1), ("b", 2)):
        store = root / f"s{seed}" / "model-calls"
        store.mkdir(parents=True)
        factory = CaptureLineFactory(seed=seed)
        for n in range(6):
            write_capture(store, f"{n}-0", [factory.line() for _ in range(3)])
        with (store / "5-0.capture.jsonl").open("ab") as torn:
            torn.write(b'{"torn": \n')
        opened.append(ngv.open_run(store, label=label, index=False))
    return ngv.stack_runs(opened)


def test_every_returned_figure_is_a_figure_with_both_mimetypes(runs: ngv.CaptureRun) -> None:
    a, b = (runs.runs[label] for label in runs.labels)
    figures = [
        *ngv.dashboard(runs).figures.values(),
        ngv.timeline(runs, "0-0", run_label="b"),
        ngv.gap_report(runs).figure(),
        ngv.diff(a, b, n_boot=50).figure(),
    ]
    for fig in figures:
        assert isinstance(fig, Figure)
        bundle = figure_bundle(fig, plotlyjs=False)
        assert set(bundle) == {PLOTLY_MIME, "text/html", "text/plain"}
        assert bundle[PLOTLY_MIME]["data"] == orjson.loads(fig.to_json())["data"]
        assert "responsive" not in bundle[PLOTLY_MIME]["config"]  # sized by layout.height
        assert 'class="ngc-figure"' in bundle["text/html"]
        assert PLOTLYJS_MARK not in bundle["text/html"]
        assert PLOTLYJS_MARK in figure_bundle(fig, plotlyjs=True)["text/html"]


def test_user_text_cannot_close_the_script(runs: ngv.CaptureRun) -> None:
    html = figure_bundle(ngv.dashboard(runs).figures["errors"], plotlyjs=False)["text/html"]
    assert "<script>alert" not in html
    assert "\\u003cscript\\u003ealert(1)" in html  # the label, escaped inside the JSON
    card = runs._repr_html_()
    assert "<script>alert" not in card and "&lt;script&gt;alert(1)" in card


def test_ledger_embeds_plotlyjs_once_and_again_when_its_carrier_is_gone() -> None:
    ledger = PlotlyJsLedger()
    cell = {name: Where(name, n) for n, name in enumerate("abcde", start=1)}
    assert ledger.needs_plotlyjs(html_only=False, where=cell["a"])  # first figure carries
    assert not ledger.needs_plotlyjs(html_only=False, where=cell["a"])  # same output run
    assert not ledger.needs_plotlyjs(html_only=False, where=cell["b"])
    # An HTML-only output cannot count on a figure's fallback having run: it carries once.
    assert ledger.needs_plotlyjs(html_only=True, where=cell["c"])
    assert not ledger.needs_plotlyjs(html_only=True, where=cell["d"])
    assert not ledger.needs_plotlyjs(html_only=False, where=cell["d"])
    # The carrier's cell runs again: its old output is replaced, so this one carries.
    assert ledger.needs_plotlyjs(html_only=True, where=Where("c", 9))
    # JupyterLab says the carrier's cell was deleted: the next output carries.
    assert ledger.needs_plotlyjs(html_only=True, where=Where("e", 10, frozenset({"c"})))
    assert not ledger.needs_plotlyjs(html_only=True, where=Where("e", 10))
    assert PlotlyJsLedger().needs_plotlyjs(html_only=True)  # outside a kernel: standalone


def test_run_card_names_counts_gaps_and_sources(runs: ngv.CaptureRun) -> None:
    bundle = runs._repr_mimebundle_()
    text, html = bundle["text/plain"], bundle["text/html"]
    for label in runs.labels:
        one = runs.runs[label]
        assert f"{one.rollouts.height:,} rollouts" in text
        assert f"{one.calls.height:,} calls" in text
        assert str(one.capture_dir) in text
    assert "capture_line_damaged 1" in text
    assert html.count("<h3>CaptureRun") == 2
    assert "capture_line_damaged" in html
    assert PLOTLYJS_MARK not in html  # no figure in the card: it never carries plotly.js


def test_dashboard_gap_report_and_diff_render_as_html_with_their_figures(
    runs: ngv.CaptureRun,
) -> None:
    a, b = (runs.runs[label] for label in runs.labels)
    board = ngv.dashboard(runs)
    html = board._repr_html_()
    assert html.count('class="ngc-figure"') == len(board.figures) == 7
    report = ngv.gap_report(runs)
    html = report._repr_html_()
    meaning = ngv.gap_meaning("capture_line_damaged")
    assert len(meaning) > 30 and meaning in html  # meanings in full, never cut
    assert html.count('class="ngc-figure"') == 1
    assert "Rollouts with the most gaps" in html
    assert "capture_line_damaged" in report._repr_mimebundle_()["text/plain"]
    comparison = ngv.diff(a, b, n_boot=200)
    html = comparison._repr_html_()
    assert html.count('class="ngc-figure"') == 1
    for metric in comparison.frame["metric"]:
        assert f"<td>{metric}</td>" in html
    assert "Holm" in html
    assert comparison._repr_mimebundle_()["text/plain"] == str(comparison)


def test_frame_schemas_show_meanings_in_full() -> None:
    html = ngv.CALLS._repr_html_()
    for column in ngv.CALLS.columns:
        assert f'<td class="wrap">{escape(column.doc)}</td>' in html


SCHEMAS = [value for value in vars(ngv).values() if isinstance(value, FrameSchema)]


def _full_in_text(frame: pl.DataFrame, value: str) -> bool:
    """``value`` is in the printed ``frame`` uncut (checked wide, so that no cell wraps)."""
    with pl.Config(tbl_width_chars=10_000):
        wide = repr(frame)
    return "…" not in repr(frame) and "…" not in wide and value in wide


@pytest.mark.parametrize("user_limit", [None, 32], ids=["polars-default", "fmt_str_lengths-32"])
def test_describe_prints_and_displays_every_meaning_in_full(user_limit: int | None) -> None:
    """Polars cuts strings at ~30 characters; a column's meaning is shown whole everywhere."""
    assert len(SCHEMAS) >= 9
    with pl.Config(fmt_str_lengths=user_limit):
        for schema in SCHEMAS:
            described = schema.describe()
            assert str(described) == repr(described)
            html = described._repr_html_()
            for column in schema.columns:
                assert _full_in_text(described, column.doc), (schema.name, column.name)
                assert escape(column.doc) in html, (schema.name, column.name)
                assert column.name in str(schema)  # print(ngv.CALLS): every column
            assert "…" not in str(schema) and "…" not in html  # every row, every meaning
        assert any(len(c.doc) > 32 for c in ngv.CALLS.columns)  # so the test can fail
        # The user's own setting is back once shown.
        assert pl.Config.state(if_set=True).get("POLARS_FMT_STR_LEN") == (
            None if user_limit is None else str(user_limit)
        )


def test_gap_report_prints_and_displays_meanings_and_details_in_full(
    runs: ngv.CaptureRun,
) -> None:
    report = ngv.gap_report(runs)
    meaning = ngv.gap_meaning("capture_line_damaged")
    detail = report.damaged["detail"][0]
    assert len(meaning) > 32 and len(detail) > 32
    printed = str(report)
    assert meaning in printed and detail in printed
    assert report._repr_mimebundle_()["text/plain"] == printed
    for frame, text in (
        (report.by_code, meaning),
        (report.damaged, detail),
        (report.summary, "calls the client abandoned (client_disconnected)"),
    ):
        assert _full_in_text(frame, text), text
        assert escape(text) in frame._repr_html_(), text
    html = report._repr_html_()
    assert escape(meaning) in html and escape(detail) in html


def test_in_a_real_kernel_plotlyjs_is_embedded_once(tmp_path: Path, runs: ngv.CaptureRun) -> None:
    """A kernel runs four displays: only the first figure and the first HTML grid carry it."""
    store = runs.runs["b"].capture_dir
    cells = [
        f"import ngcapture_viz as ngv\nrun = ngv.open_run({str(store)!r}, label='b', index=False)\nrun",
        "board = ngv.dashboard(run)\nboard.figures['latency']",
        "board.figures['errors']",
        "board",
        "ngv.gap_report(run)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute(cwd=str(tmp_path))
    carried = []
    for cell in nb.cells:
        (output,) = [o for o in cell.outputs if o.output_type == "execute_result"]
        assert "text/html" in output.data, cell.source
        carried.append(PLOTLYJS_MARK in output.data["text/html"])
        if PLOTLY_MIME in output.data:
            assert output.data[PLOTLY_MIME]["layout"]
    assert carried == [False, True, False, True, False]
    assert re.search(r"CaptureRun b", nb.cells[0].outputs[0].data["text/html"])
