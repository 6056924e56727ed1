"""No text of a figure overlaps other text or runs off the figure, at the widths it is seen at.

Each public figure is drawn in headless Debian Chromium (plotly.js loaded once, no network) at
560 px (a half-width dashboard cell, a notebook output beside JupyterLab's side bar), 800 px and
1400 px. Every visible SVG text of the figure is measured: no two may overlap by more than
2 px each way, and none may leave the figure's box. This is what ``docs/make_screenshots.py``
asks a reader to look for, made a check: it found the subtitles and titles that ran off
narrow figures, the reward panels' coverage titles that ran into each other, the gap report's
note under its legend, and a time label on the y axis' zero.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core.testing.runs import RunSpec, write_run
from ngcapture_viz.display.figure import PLOTLY_MIME, figure_bundle, plotlyjs_html
from ngcapture_viz.figures.time_split import TIME_SPLIT_SCHEMA, time_split_figure
from tests.ngcapture_viz.conftest import write_capture
from tests.ngcapture_viz.jupyterlab import Browser, chromium, require_browser

require_browser()

WIDTHS = (560, 800, 1400)

_DRAW_AND_MEASURE = """async ([spec, width]) => {
  const gd = document.getElementById('gd');
  gd.style.width = width + 'px';
  gd.style.height = (spec.layout.height || 450) + 'px';
  Plotly.purge(gd);
  await Plotly.newPlot(gd, spec.data, spec.layout, {displayModeBar: false});
  const box = gd.getBoundingClientRect();
  // Each text's box as drawn on screen: four corners, turned with the text (tick labels that
  // plotly turns to make room must not count as overlapping because their frames do).
  const quad = t => { const b = t.getBBox(), m = t.getScreenCTM();
    return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height],
            [b.x, b.y + b.height]].map(([x, y]) => {
      const p = new DOMPoint(x, y).matrixTransform(m); return [p.x, p.y]; }); };
  const texts = [...gd.querySelectorAll('svg text')].filter(t => {
    const style = getComputedStyle(t), r = t.getBoundingClientRect();
    return t.textContent.trim() && style.display !== 'none' && style.visibility !== 'hidden'
      && parseFloat(style.opacity) > 0 && r.width > 0 && r.height > 0;
  }).map(t => ({text: t.textContent, corners: quad(t)}));
  const outside = texts.filter(t => t.corners.some(([x, y]) => x < box.left - 1
    || x > box.right + 1 || y < box.top - 1 || y > box.bottom + 1)).map(t => t.text);
  // Separating axes: two boxes overlap when they overlap by more than 2 px along every axis.
  const overlap = (a, b) => [a, b].every(poly => poly.every(([x1, y1], i) => {
    const [x2, y2] = poly[(i + 1) % 4], len = Math.hypot(y2 - y1, x1 - x2);
    if (!len) { return true; }
    const [nx, ny] = [(y2 - y1) / len, (x1 - x2) / len];
    const pa = a.map(([x, y]) => x * nx + y * ny), pb = b.map(([x, y]) => x * nx + y * ny);
    return Math.min(Math.max(...pa), Math.max(...pb))
      - Math.max(Math.min(...pa), Math.min(...pb)) > 2;
  }));
  const overlaps = [];
  texts.forEach((a, i) => texts.slice(i + 1).forEach(b => {
    if (overlap(a.corners, b.corners)) { overlaps.push([a.text, b.text]); }
  }));
  return {texts: texts.length, outside, overlaps};
}"""


def _time_split() -> Any:
    """The time split with model, tool and overhead shares, a long run label and a run
    without ``ng_perf`` (the synthetic runs carry no agent evidence)."""
    rows = [
        ("ckpt-100", 40, 38, 10000.0, 4500.0, 700.0, 4800.0, 100.0, 250.0, "no_perf"),
        ("ckpt-200-a-long-experiment-name", 40, 40, 10000.0, 9000.0, 300.0, 700.0, 0.0, 250.0,
         None),
        ("ckpt-300", 40, 0, None, None, None, None, None, None, "collector_without_agent"),
    ]  # fmt: skip
    table = pl.DataFrame(rows, schema=TIME_SPLIT_SCHEMA, orient="row")
    return time_split_figure(table, table["run"].to_list())


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every public figure, of two runs (errors, truncations, a damaged line) where it draws
    several."""
    root = tmp_path_factory.mktemp("figure-text")
    opened = []
    for label, seed in (("ckpt-100", 1), ("ckpt-200", 2)):
        written = write_run(root / label, RunSpec(tasks=20, repeats=2, calls=(1, 4), seed=seed))
        opened.append(ngv.open_run(written.capture_dir, written.rollouts, label=label, index=False))
    write_capture(opened[1].capture_dir or Path(), "0-0", [b'{"torn": \n'])
    opened[1] = ngv.open_run(
        opened[1].capture_dir, opened[1].rollouts_path, label="ckpt-200", index=False
    )
    runs = ngv.stack_runs(opened)
    old, new = opened
    busiest = new.rollouts.sort("num_calls", descending=True)["rollout_id"][0]
    board = ngv.dashboard(runs)
    return {
        **{f"dashboard {name}": fig for name, fig in board.figures.items()},
        "dashboard of one run: reward": ngv.dashboard(new).figures["reward"],
        "time split with data": _time_split(),
        "timeline": ngv.timeline(new, str(busiest)),
        "gap report": ngv.gap_report(runs).figure(),
        "gap report without gaps": ngv.gap_report(old).figure(),
        "diff": ngv.diff(old, new, n_boot=50).figure(),
    }


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    blank = tmp_path_factory.mktemp("figure-page") / "page.html"
    blank.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f'</head><body style="margin:0">{plotlyjs_html()}<div id="gd"></div></body></html>',
        encoding="utf-8",
    )
    with chromium() as browser:
        opened = browser.page()
        opened.goto(blank.as_uri())
        opened.wait_for_function("() => window.Plotly !== undefined")
        yield opened, browser


def test_no_figure_text_overlaps_or_runs_off(
    figures: dict[str, Any], page: tuple[Any, Browser]
) -> None:
    tab, browser = page
    assert len(figures) >= 13
    problems = []
    for name, fig in figures.items():
        spec = figure_bundle(fig, plotlyjs=False)[PLOTLY_MIME]
        for width in WIDTHS:
            tab.set_viewport_size({"width": width, "height": 900})
            seen = tab.evaluate(_DRAW_AND_MEASURE, [spec, width])
            assert seen["texts"] >= 3, (name, width)  # the measure found the figure's text
            if seen["outside"] or seen["overlaps"]:
                problems.append(f"{name} at {width} px: {seen['outside']} {seen['overlaps']}")
    assert problems == [], "\n".join(problems)
    assert browser.problems == []
