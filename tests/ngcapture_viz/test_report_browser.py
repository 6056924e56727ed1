"""The HTML report of the demo in a real browser: headless Debian Chromium, no network.

``make test`` installs ``chromium`` when ``/usr/bin/chromium`` is missing; the ``playwright``
Python package drives it (its own browser downloads are never used). The page must load with
every request refused except ``file://``, log no JavaScript error, and draw every figure. A
full-page screenshot is written to ``results/test-artifacts/report.png``.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ngcapture_viz import open_runs

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "results" / "demo"
ARTIFACTS = REPO / "results" / "test-artifacts"
CHROMIUM = Path(os.environ.get("NGCAPTURE_CHROMIUM", "/usr/bin/chromium"))
CHECKPOINTS = ("ckpt-100", "ckpt-200")

# Every figure container holds a drawn plot: plotly's SVG with a size, and its traces.
_RENDERED = """() => {
  const divs = [...document.querySelectorAll('.plotly-graph-div')];
  return divs.length > 0 && divs.every(d => {
    const svg = d.querySelector('svg.main-svg');
    return svg && d._fullLayout && svg.getBoundingClientRect().width > 0;
  });
}"""
_STATE = """() => [...document.querySelectorAll('.plotly-graph-div')].map(d => ({
  id: d.id,
  svg: d.querySelectorAll('svg.main-svg').length,
  width: d.getBoundingClientRect().width,
  height: d.getBoundingClientRect().height,
  traces: (d.data || []).length,
  drawn: (d._fullData || []).length,
}))"""


def demo_dir() -> Path:
    """The demo output (``make demo``), generated when missing. Under the lock the notebooks'
    ``_setup.py`` takes, so a notebook test in another process never reads it half-made."""
    DEMO.parent.mkdir(parents=True, exist_ok=True)
    with DEMO.with_name(DEMO.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((DEMO / name / "rollouts.jsonl").is_file() for name in CHECKPOINTS):
            done = subprocess.run(
                [sys.executable, "-m", "capture_core.demo", "--out", str(DEMO)],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=False,
                timeout=300,
            )
            assert done.returncode == 0, f"make demo failed:\n{done.stdout}\n{done.stderr}"
    return DEMO


def browser_api() -> ModuleType:
    """playwright's sync API, or a skip naming what is missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is missing: run `make chromium` (apt-get install chromium)")
    return sync_api


@pytest.fixture(scope="module")
def demo_report() -> Path:
    browser_api()  # skip before building the report when there is no browser
    from ngcapture_viz.diff import diff
    from ngcapture_viz.report import write_report

    root = demo_dir()
    runs = open_runs(
        {
            name: (root / name / "model-calls", root / name / "rollouts.jsonl")
            for name in CHECKPOINTS
        }
    )
    checkpoint_diff = diff(runs.runs["ckpt-100"], runs.runs["ckpt-200"])
    return write_report(runs, ARTIFACTS / "report.html", diff=checkpoint_diff)


@dataclass
class PageVisit:
    requests: list[str]  # every request the page made (only file:// ones were allowed)
    problems: list[str]  # console errors, page errors, failed requests
    plots: list[dict[str, Any]]  # per figure container: SVGs, size, traces declared and drawn
    rendered: bool  # every container holds a drawn plot
    seconds: float


def visit(path: Path, screenshot: Path | None = None, *, timeout_ms: int = 60_000) -> PageVisit:
    """Open ``path`` in headless Chromium with all non-file requests refused."""
    sync_api = browser_api()
    requests: list[str] = []
    problems: list[str] = []
    started = time.perf_counter()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})

            def route(handle: sync_api.Route) -> None:
                requests.append(handle.request.url)
                if handle.request.url.startswith("file://"):
                    handle.continue_()
                else:
                    handle.abort()

            context.route("**/*", route)
            page = context.new_page()
            page.on("console", lambda m: m.type == "error" and problems.append(m.text))
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.goto(path.as_uri(), wait_until="load")
            try:
                page.wait_for_function(_RENDERED, timeout=timeout_ms)
                rendered = True
            except sync_api.TimeoutError:
                rendered = False
            plots = page.evaluate(_STATE)
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return PageVisit(requests, problems, plots, rendered, time.perf_counter() - started)


def test_demo_report_renders_offline_in_chromium(demo_report: Path) -> None:
    source = demo_report.read_text(encoding="utf-8")
    containers = len(re.findall(r'class="plotly-graph-div"', source))
    assert containers >= 12  # dashboard, gap figure, 9 timelines, forest plot

    screenshot = ARTIFACTS / "report.png"
    screenshot.unlink(missing_ok=True)
    page = visit(demo_report, screenshot)

    assert page.problems == []
    assert page.requests == [demo_report.as_uri()]  # the page itself, nothing else
    assert page.rendered
    assert len(page.plots) == containers
    for plot in page.plots:
        assert plot["svg"] >= 1, plot
        assert plot["width"] > 100 and plot["height"] > 100, plot
        assert plot["drawn"] == plot["traces"] > 0, plot
    assert screenshot.stat().st_size > 50_000
    assert page.seconds < 60, f"the browser took {page.seconds:.1f} s"


def test_the_browser_check_catches_network_loads_and_script_errors(tmp_path: Path) -> None:
    page_path = tmp_path / "broken.html"
    page_path.write_text(
        '<!DOCTYPE html><html><head><script src="https://cdn.example.invalid/plotly.js"></script>'
        '</head><body><div class="plotly-graph-div"></div>'
        "<script>throw new Error('boom')</script></body></html>",
        encoding="utf-8",
    )
    page = visit(page_path, timeout_ms=500)
    assert "https://cdn.example.invalid/plotly.js" in page.requests
    assert any("boom" in problem for problem in page.problems)
    assert any("request failed" in problem for problem in page.problems)
    assert not page.rendered
    assert page.plots[0]["svg"] == 0
