"""A tool-using agent's rollout, collected through the capture server, drawn as a timeline and
looked at in headless Chromium (no network): its tool executions and its sub-agent sit on their
own lanes between the model calls.

The screenshot goes to ``results/test-artifacts/timeline-agent.png``; with
``NGCAPTURE_DOCS_IMG=1`` also to ``docs/img/timeline-agent.png`` (the image the docs show).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import plotly.io as pio
import pytest

import ngcapture_viz as ngv
from capture_core.collect import CollectConfig, SimpleAgent, collect
from capture_core.testing.processes import run_capture_server, run_worker

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "results" / "test-artifacts"
CHROMIUM = Path(os.environ.get("NGCAPTURE_CHROMIUM", "/usr/bin/chromium"))
_DRAWN = """() => {
  const div = document.querySelector('.plotly-graph-div');
  return !!(div && div._fullLayout && div.querySelector('svg.main-svg'));
}"""
_LOOK = """() => {
  const div = document.querySelector('.plotly-graph-div');
  const box = div.getBoundingClientRect();
  return {
    ticks: [...div.querySelectorAll('.ytick text')].map(t => t.textContent),
    bars: [...div.querySelectorAll('.barlayer .point path')].filter(p => {
      const r = p.getBoundingClientRect(); return r.width > 0 && r.height > 0;
    }).length,
    legend: [...div.querySelectorAll('.legendtext')].map(t => t.textContent),
    width: box.width, height: box.height,
  };
}"""


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> ngv.CaptureRun:
    root = tmp_path_factory.mktemp("agent-timeline")
    capture_dir, output = root / "model-calls", root / "rollouts.jsonl"
    with (
        run_worker(seed=11, ttft_ms=25, ms_per_token=0.6) as worker,
        run_capture_server(worker.url, capture_dir) as server,
    ):
        agent = SimpleAgent(server.url, tools=True, subagent=True)
        summary = collect(CollectConfig(None, output, server.url, [capture_dir], limit=2,
                                        concurrency=1, tools=True), agent=agent)  # fmt: skip
        assert summary.ok == 2
    return ngv.open_run(capture_dir, output, label="tool-agent")


def test_the_agents_timeline_in_chromium(collected: ngv.CaptureRun, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is missing: run `make chromium`")
    run = collected
    assert run.perf["unavailable_reason"].null_count() == run.perf.height == 2
    rollout_id = str(run.rollouts.sort("rollout_id")["rollout_id"][1])  # the second: no start-up
    fig = ngv.timeline(run, rollout_id)
    lanes = list(fig.layout.yaxis.ticktext)
    assert lanes[-3:] == ["tools · main", "tools · main/1", "sub-agent · main/1"]
    html = tmp_path / "timeline.html"
    pio.write_html(fig, html, include_plotlyjs=True, full_html=True,
                   config={"displayModeBar": False}, default_width="1060px",
                   default_height="560px")  # fmt: skip
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:")
                       else r.abort())  # fmt: skip
            page.on("console", lambda m: m.type == "error" and problems.append(m.text))
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.goto(html.as_uri(), wait_until="load")
            page.wait_for_function(_DRAWN, timeout=60_000)
            seen: dict[str, Any] = page.evaluate(_LOOK)
            shot = ARTIFACTS / "timeline-agent.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.locator(".plotly-graph-div").screenshot(path=str(shot))
            if os.environ.get("NGCAPTURE_DOCS_IMG") == "1":
                page.locator(".plotly-graph-div").screenshot(
                    path=str(REPO / "docs/img/timeline-agent.png")
                )
        finally:
            browser.close()
    assert problems == []
    assert seen["width"] > 500 and seen["height"] > 300
    assert {"tools · main", "tools · main/1", "sub-agent · main/1"} <= set(seen["ticks"])
    calls = run.calls.filter(run.calls["rollout_id"] == rollout_id).height
    assert calls == 4
    assert seen["bars"] >= calls + 2 + 1  # calls, the two tool executions, the sub-agent
    assert {"tool · completed", "sub-agent", "tool asked for by (tool_call_id)"} <= set(
        seen["legend"]
    )
    assert shot.stat().st_size > 10_000
