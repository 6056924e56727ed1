"""Regenerate the PNG screenshots in ``docs/img/`` from the demo output, at 1400 and 800 px.

* every figure of the dashboard, a timeline, the gap report and the diff, drawn by the same
  HTML the notebooks show (``ngcapture_viz.display``), at 1400 px (``<name>.png``) and 800 px
  (``<name>-800.png``) wide;
* the dashboard grid (``dashboard.png``: two columns at 1400 px, one at 800 px);
* the top of the HTML report (``report.png``, ``report-800.png``);
* each notebook, run in a real JupyterLab (``notebook-01.png``...; ``-800`` at 800 px).

Everything runs in headless Debian Chromium through playwright, with every request outside
127.0.0.1 and ``file://`` refused (no playwright browser download). Look at the images after
regenerating them: no text may overlap or be cut at either width.

Run: ``.venv/bin/python docs/make_screenshots.py`` (needs ``/usr/bin/chromium``: ``make
chromium``; generates the demo output with ``capture_core.demo`` when it is missing).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.ngcapture_viz.jupyterlab import (  # noqa: E402
    chromium,
    open_notebook,
    run_all,
    running_lab,
)

DEMO = REPO / "results" / "demo"
IMG = REPO / "docs" / "img"
CHECKPOINTS = ("ckpt-100", "ckpt-200")
WIDTHS = (1400, 800)
NOTEBOOKS = {
    "notebook-01": "01_explore_run.ipynb",
    "notebook-02": "02_compare_checkpoints.ipynb",
    "notebook-03": "03_export_to_wandb.ipynb",
}


def _demo() -> Path:
    if not all((DEMO / name / "rollouts.jsonl").is_file() for name in CHECKPOINTS):
        subprocess.run([sys.executable, "-m", "capture_core.demo", "--out", str(DEMO)], check=True)
    return DEMO


def pages() -> tuple[dict[str, go.Figure], str, Path]:
    """The figures by image name, the dashboard grid's HTML and the demo report."""
    import ngcapture_viz as ngv
    from ngcapture_viz.display.cards import dashboard_html

    demo = _demo()
    runs = ngv.open_runs(
        {n: (demo / n / "model-calls", demo / n / "rollouts.jsonl") for n in CHECKPOINTS}
    )
    new = runs.runs["ckpt-200"]
    board = ngv.dashboard(runs)
    slowest = new.rollouts.sort("wall_ms", descending=True, nulls_last=True)
    busiest = slowest.sort("num_calls", descending=True, maintain_order=True)["rollout_id"][0]
    change = ngv.diff(runs.runs["ckpt-100"], new)
    shots = {f"dashboard-{name.replace('_', '-')}": fig for name, fig in board.figures.items()}
    shots |= {
        "timeline": ngv.timeline(new, str(busiest)),
        "gap-report": ngv.gap_report(runs).figure(),
        "diff-forest": change.figure(),
    }
    failing = new.rollouts.filter(pl.col("num_errors") > 0)["rollout_id"]
    if failing.len():
        shots["timeline-failing"] = ngv.timeline(new, str(failing[0]))
    report = ngv.write_report(runs, Path(tempfile.mkdtemp()) / "report.html", diff=change)
    return shots, dashboard_html(board, plotlyjs=True), report


def _name(base: str, width: int) -> Path:
    return IMG / (f"{base}.png" if width == WIDTHS[0] else f"{base}-{width}.png")


def _figure_page(fig: go.Figure, folder: Path, name: str) -> Path:
    from ngcapture_viz.display.figure import figure_div

    page = folder / f"{name}.html"
    page.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"></head>'
        '<body style="margin:0;font-family:sans-serif">'
        + figure_div(fig, plotlyjs=True)
        + "</body></html>",
        encoding="utf-8",
    )
    return page


def _drawn(page: Any, selector: str, count: int) -> None:
    page.wait_for_function(
        f"() => [...document.querySelectorAll('{selector}')].filter(d => d._fullLayout)"
        f".length >= {count}",
        timeout=60_000,
    )


def photograph_figures(browser: Any, folder: Path) -> None:
    shots, grid, report = pages()
    page = browser.page()
    for name, fig in shots.items():
        uri = _figure_page(fig, folder, name).as_uri()
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 700})
            page.goto(uri)
            _drawn(page, ".ngc-figure", 1)
            page.locator(".ngc-figure").screenshot(path=str(_name(name, width)))
            print(_name(name, width))
    dashboard = folder / "dashboard.html"
    dashboard.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"></head>'
        f'<body style="margin:0">{grid}</body></html>',
        encoding="utf-8",
    )
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(dashboard.as_uri())
        _drawn(page, ".ngc-figure", 6)
        page.screenshot(path=str(_name("dashboard", width)), full_page=True)
        print(_name("dashboard", width))
        page.goto(report.as_uri())
        page.wait_for_selector(".plotly-graph-div svg.main-svg")
        page.screenshot(path=str(_name("report", width)))
        print(_name("report", width))
    page.close()


def photograph_notebooks(browser: Any, lab: Any) -> None:
    for base, notebook in NOTEBOOKS.items():
        page = browser.page()
        open_notebook(page, lab, notebook)
        page.evaluate(
            "async () => { const app = window.jupyterapp;"
            " await app.commands.execute('application:set-mode', {mode: 'single-document'});"
            " if (!app.shell.leftCollapsed) { app.shell.collapseLeft(); }"
            " if (!app.shell.rightCollapsed) { app.shell.collapseRight(); } }"
        )
        run_all(page)
        page.wait_for_timeout(2000)
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 1000})
            page.wait_for_timeout(1500)  # figures follow the new width
            height = page.evaluate(
                "() => document.querySelector('.jp-WindowedPanel-inner').scrollHeight"
            )
            page.set_viewport_size({"width": width, "height": min(int(height) + 160, 16_000)})
            page.wait_for_timeout(1500)
            page.evaluate(
                "() => { for (const el of document.querySelectorAll('.jp-WindowedPanel-outer'))"
                " { el.scrollTop = 0; } }"
            )
            page.wait_for_timeout(500)
            page.screenshot(path=str(_name(base, width)))
            print(_name(base, width))
        page.close()


def main() -> int:
    IMG.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_lab(Path(tmp) / "lab") as lab,
        chromium(offline_except=lab.url) as browser,
    ):
        photograph_figures(browser, Path(tmp))
        photograph_notebooks(browser, lab)
        if browser.problems:  # plotly may complain while a resized page lays out again
            print("browser messages:", *browser.problems, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
