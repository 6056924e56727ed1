"""Figures draw in a JupyterLab that has no plotly renderer (its environment is not ours).

A user's kernel has our packages while the JupyterLab it runs in comes from another
environment, without plotly's ``jupyterlab-plotly`` extension. Such a lab cannot draw
``application/vnd.plotly.v1+json`` and shows the next richest type of the bundle: our HTML
fallback, which must draw every figure by itself (plotly.js embedded once, no network).

The test starts a real JupyterLab on 127.0.0.1 with that extension disabled (it is installed
here), runs a notebook that displays every public figure bare and every result object
(``figure_probe``), and looks at the page in headless Debian Chromium: every figure drawn
(plotly's ``_fullLayout`` and an SVG), none by plotly's renderer, no "plotly.js is not loaded"
placeholder, no console error, no request beyond the lab. Without the HTML fallback the bare
figures show as a line of text and the test fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from ngcapture_viz.display.figure import PLOTLY_MIME
from tests.ngcapture_viz.figure_probe import ALL_SETTLED, OUTPUT_FACTS, mismatches, probe_notebook
from tests.ngcapture_viz.jupyterlab import (
    Browser,
    Lab,
    chromium,
    errors_in,
    open_notebook,
    require_browser,
    run_all,
    running_lab,
)

require_browser(("jupyterlab", "the notebook extra"))

PLOTLY_EXTENSION = "jupyterlab-plotly"  # the package plotly installs
#: What JupyterLab matches ``disabledExtensions`` against: the plugin ids' prefix
#: (``@jupyterlab/plotly-extension:factory``), not the package name.
PLOTLY_PLUGINS = "@jupyterlab/plotly-extension"

_EXTENSIONS = """() => {
  const config = JSON.parse(document.getElementById('jupyter-config-data').textContent);
  const panel = window.jupyterapp.shell.currentWidget;
  return {
    installed: (config.federated_extensions || []).map(e => e.name),
    disabled: config.disabledExtensions || [],
    mimeTypes: panel.content.rendermime.mimeTypes,
  };
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("lab-without-plotly")
    with running_lab(root, disabled_extensions=[PLOTLY_EXTENSION, PLOTLY_PLUGINS]) as running:
        yield running


@pytest.fixture(scope="module")
def browser(lab: Lab) -> Iterator[Browser]:
    with chromium(offline_except=lab.url) as opened:
        yield opened


def test_every_figure_draws_without_plotlys_renderer(lab: Lab, browser: Browser) -> None:
    (lab.root / "figures_probe.ipynb").write_text(json.dumps(probe_notebook()))
    page = browser.page(width=1200)
    open_notebook(page, lab, "figures_probe.ipynb")
    extensions = page.evaluate(_EXTENSIONS)
    # The condition under test: the extension is installed, and this lab does not load it.
    assert PLOTLY_EXTENSION in extensions["installed"]
    assert PLOTLY_PLUGINS in extensions["disabled"]
    assert PLOTLY_MIME not in extensions["mimeTypes"]

    executed = run_all(page)
    page.wait_for_function(ALL_SETTLED, timeout=60_000)  # plotly.js parsed, every figure drawn

    assert errors_in(executed) == []
    assert all(cell["count"] is not None for cell in executed)
    assert mismatches(executed, page.evaluate(OUTPUT_FACTS), plotly_renderer=False) == []
    assert browser.problems == []  # no console error, no page error, no outside request
