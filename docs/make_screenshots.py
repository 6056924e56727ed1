"""Regenerate the PNG screenshots in ``docs/img/`` from the real figures of the demo output.

Each figure is written as a standalone HTML page (plotly.js inlined) and photographed by
headless Debian Chromium through playwright (no network, no playwright browser download);
the report screenshot is the top of the real HTML report of both demo checkpoints.

Run: ``.venv/bin/python docs/make_screenshots.py`` (needs ``/usr/bin/chromium``: ``make
chromium``; generates the demo output with ``capture_core.demo`` when it is missing).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
import polars as pl

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "results" / "demo"
IMG = REPO / "docs" / "img"
CHROMIUM = "/usr/bin/chromium"
CHECKPOINTS = ("ckpt-100", "ckpt-200")


def _demo() -> Path:
    if not all((DEMO / name / "rollouts.jsonl").is_file() for name in CHECKPOINTS):
        subprocess.run([sys.executable, "-m", "capture_core.demo", "--out", str(DEMO)], check=True)
    return DEMO


def figures() -> tuple[dict[str, go.Figure], Path]:
    """The figures to photograph, by image name, and the demo report of both checkpoints."""
    from ngcapture_viz import open_runs
    from ngcapture_viz.diff import diff
    from ngcapture_viz.figures.dashboard import dashboard
    from ngcapture_viz.figures.gap_report import gap_report
    from ngcapture_viz.figures.timeline import timeline
    from ngcapture_viz.report import write_report

    demo = _demo()
    runs = open_runs(
        {n: (demo / n / "model-calls", demo / n / "rollouts.jsonl") for n in CHECKPOINTS}
    )
    new = runs.runs["ckpt-200"]
    board = dashboard(runs)
    slowest = new.rollouts.sort("wall_ms", descending=True, nulls_last=True)
    busiest = slowest.sort("num_calls", descending=True, maintain_order=True)["rollout_id"][0]
    change = diff(runs.runs["ckpt-100"], new)
    shots = {
        "dashboard-latency": board.figures["latency"],
        "dashboard-tokens": board.figures["tokens"],
        "dashboard-over-time": board.figures["over_time"],
        "dashboard-errors": board.figures["errors"],
        "timeline": timeline(new, str(busiest)),
        "gap-report": gap_report(runs).figure(),
        "diff-forest": change.figure(),
    }
    failing = new.rollouts.filter(pl.col("num_errors") > 0)["rollout_id"]
    if failing.len():
        shots["timeline-failing"] = timeline(new, str(failing[0]))
    report = write_report(runs, Path(tempfile.mkdtemp()) / "report.html", diff=change)
    return shots, report


def main() -> int:
    from playwright.sync_api import sync_playwright

    IMG.mkdir(parents=True, exist_ok=True)
    shots, report = figures()
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            page.route(
                "**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort()
            )
            for name, fig in shots.items():
                html = Path(tmp) / f"{name}.html"
                pio.write_html(
                    fig, html, include_plotlyjs=True, full_html=True,
                    config={"displayModeBar": False},
                    default_width="1060px", default_height="520px",
                )  # fmt: skip
                page.goto(html.as_uri())
                page.wait_for_selector(".plotly-graph-div svg.main-svg")
                page.locator(".plotly-graph-div").screenshot(path=str(IMG / f"{name}.png"))
                print(IMG / f"{name}.png")
            page.set_viewport_size({"width": 1400, "height": 1000})
            page.goto(report.as_uri())
            page.wait_for_selector(".plotly-graph-div svg.main-svg")
            page.screenshot(path=str(IMG / "report.png"))
            print(IMG / "report.png")
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
