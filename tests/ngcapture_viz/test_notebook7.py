"""Figures draw in Notebook 7, the classic Notebook today (built on JupyterLab's components).

The test starts a real Notebook 7 server on 127.0.0.1 (``running_lab(app="notebook")``), runs
the notebook that displays every public figure bare and every result object
(``figure_probe``) on its ``/notebooks/<name>`` page in headless Debian Chromium, and checks
the page: each bare figure drawn by plotly's renderer (Notebook 7 loads the same
``jupyterlab-plotly`` extension), each result object's figures drawn by its own HTML, no
"plotly.js is not loaded" placeholder, no request beyond the server, and no console error but
those an empty Notebook 7 page raises by itself (Notebook 7.6.5 here reports "Cannot read
properties of undefined (reading 'schema')" from its shortcuts plugin on every page load, with
no notebook open).
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

require_browser(("notebook", "Notebook 7, the notebook extra"))

_APP = """() => ({
  name: window.jupyterapp.name,
  mimeTypes: window.jupyterapp.shell.currentWidget.content.rendermime.mimeTypes,
})"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with running_lab(tmp_path_factory.mktemp("notebook7"), app="notebook") as running:
        yield running


@pytest.fixture(scope="module")
def browser(server: Lab) -> Iterator[Browser]:
    with chromium(offline_except=server.url) as opened:
        yield opened


def test_every_figure_draws_in_notebook_7(server: Lab, browser: Browser) -> None:
    page = browser.page(width=1200)
    page.goto(f"{server.url}/tree?token={server.token}", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-DirListing-item", timeout=120_000)  # the file browser is up
    page.wait_for_timeout(1000)
    own = set(browser.problems)  # what Notebook 7 reports with no notebook open
    assert all("refused request" not in problem for problem in own)

    (server.root / "figures_probe.ipynb").write_text(json.dumps(probe_notebook()))
    open_notebook(page, server, "figures_probe.ipynb")
    app = page.evaluate(_APP)
    assert app["name"] == "Jupyter Notebook"  # Notebook 7's page, not JupyterLab's
    assert PLOTLY_MIME in app["mimeTypes"]  # it renders plotly's JSON itself

    executed = run_all(page)
    page.wait_for_function(ALL_SETTLED, timeout=60_000)
    page.wait_for_function(  # plotly's renderer draws when its output is attached
        "() => [...document.querySelectorAll('.jp-RenderedPlotly')].every(d => d._fullLayout)",
        timeout=60_000,
    )

    assert errors_in(executed) == []
    assert all(cell["count"] is not None for cell in executed)
    assert mismatches(executed, page.evaluate(OUTPUT_FACTS), plotly_renderer=True) == []
    # No console or page error of ours, no outside request.
    assert [problem for problem in browser.problems if problem not in own] == []
