"""Figures that display everywhere: plotly's JSON and an HTML fallback in one mime bundle.

Every figure the package returns is a :class:`Figure` (a ``plotly.graph_objects.Figure``).
In a notebook it shows as a bundle with ``application/vnd.plotly.v1+json`` (drawn by plotly's
renderer in JupyterLab, Notebook 7 and VS Code) and ``text/html`` (drawn where that renderer is
missing: an nbconvert HTML export, a JupyterLab from another environment). The fallback loads
nothing from the network: plotly.js is embedded once per notebook (:mod:`.plotlyjs`).

Example:
    >>> fig = Figure()
    >>> sorted(figure_bundle(fig, plotlyjs=False))
    ['application/vnd.plotly.v1+json', 'text/html', 'text/plain']
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import orjson
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from ngcapture_viz.display.plotlyjs import LEDGER

__all__ = ["PLOTLY_MIME", "Figure", "figure_bundle", "figure_div", "plotlyjs_html"]

PLOTLY_MIME: Final = "application/vnd.plotly.v1+json"
#: Plotly config of every drawn figure: no logo, resize with the output.
CONFIG: Final = {"displaylogo": False, "responsive": True}
_DEFAULT_HEIGHT: Final = 450
#: How long a fallback waits for plotly.js to appear (another output may still be loading it).
_WAIT_TRIES: Final = 100
_WAIT_MS: Final = 50


class Figure(go.Figure):  # type: ignore[misc]  # plotly is untyped
    """A ``plotly.graph_objects.Figure`` that shows itself in any notebook front end.

    Nothing else differs: every plotly method works and returns this figure.
    """

    # plotly's own hook would show the figure through ``pio.renderers`` (whatever the user's
    # default renderer is) instead of returning this bundle: IPython skips a None hook.
    _ipython_display_ = None

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        return figure_bundle(self, plotlyjs=LEDGER.needs_plotlyjs(html_only=False))

    def _repr_html_(self) -> str:
        return figure_div(self, plotlyjs=LEDGER.needs_plotlyjs(html_only=True))


def figure_bundle(fig: go.Figure, *, plotlyjs: bool) -> dict[str, Any]:
    """The mime bundle of ``fig``: plotly's JSON, the HTML fallback and a line of text."""
    spec = _spec(fig)
    # plotly's renderer sizes its output from layout.height; "responsive" would make it
    # follow a container with no height of its own and collapse the figure.
    json_spec = {**spec, "config": {"displaylogo": False}}
    return {
        PLOTLY_MIME: json_spec,
        "text/html": figure_div(fig, plotlyjs=plotlyjs, spec=spec),
        "text/plain": figure_text(fig),
    }


def figure_text(fig: go.Figure) -> str:
    """One line naming the figure (what a text-only front end shows)."""
    title = fig.layout.title.text or "untitled"
    return f"<Figure: {title.split('<br>')[0]} ({len(fig.data)} traces)>"


def figure_div(
    fig: go.Figure, *, plotlyjs: bool, spec: dict[str, Any] | None = None, height: int | None = None
) -> str:
    """A ``<div>`` and the script that draws ``fig`` into it with ``window.Plotly``.

    With ``plotlyjs=True`` plotly.js is embedded first. Without, the script waits (bounded)
    for another output to load it, and says so in the div when none does. JSON is escaped so
    that user text cannot close the ``<script>``.
    """
    spec = spec if spec is not None else _spec(fig)
    div_id = f"ngc-{uuid.uuid4().hex}"
    tall = height or fig.layout.height or _DEFAULT_HEIGHT
    payload = _script_json(spec)
    script = (
        "(function(){"
        f'var id="{div_id}",spec={payload},tries=0;'
        "function draw(){var gd=document.getElementById(id);if(!gd){return;}"
        "if(window.Plotly){window.Plotly.newPlot(gd,spec.data,spec.layout,spec.config);return;}"
        f"if(++tries>{_WAIT_TRIES}){{gd.className+=' ngc-no-plotly';gd.textContent="
        "'plotly.js is not loaded on this page: run the notebook again from the top "
        "(the output that carried it was cleared)';return;}"
        f"setTimeout(draw,{_WAIT_MS});}}draw();}})();"
    )
    return (
        (plotlyjs_html() if plotlyjs else "")
        + f'<div id="{div_id}" class="ngc-figure" style="width:100%;height:{tall}px"></div>'
        + f'<script type="text/javascript">{script}</script>'
    )


def plotlyjs_html() -> str:
    """plotly.js as an inline ``<script>`` (no network), with plotly's page config."""
    return (
        "<script type=\"text/javascript\">window.PlotlyConfig={MathJaxConfig:'local'};</script>"
        f'<script type="text/javascript">{get_plotlyjs()}</script>'
    )


def _spec(fig: go.Figure) -> dict[str, Any]:
    """``{data, layout, config}`` as plain JSON values (plotly's encoder: numpy, dates)."""
    spec: dict[str, Any] = orjson.loads(fig.to_json(validate=False, engine="orjson"))
    spec.pop("frames", None)
    spec["config"] = dict(CONFIG)
    return spec


def _script_json(value: Any) -> str:
    """JSON safe inside ``<script>``: ``<``, ``>`` and ``&`` as escapes (still valid JSON)."""
    text = orjson.dumps(value).decode()
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
