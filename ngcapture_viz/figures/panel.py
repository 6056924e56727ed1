"""A light figure panel for notebooks: one anywidget that draws many figures with plotly.js.

plotly's ``FigureWidget`` ships plotly.js (~4.8 MB) with every instance; six of them made a
dashboard send ~30 MB before it drew. :class:`FigurePanel` holds only the figures' JSON in its
synced state and asks the kernel for plotly.js once per page (a custom message answered with
one binary buffer), unless the page already has ``window.Plotly``. Figures are redrawn with
``Plotly.react`` in a grid that fills the output's width.

Example:
    >>> panel = FigurePanel()  # doctest: +SKIP
    >>> panel.show({"latency": fig})  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import anywidget
import orjson
import plotly.graph_objects as go
import traitlets
from plotly.offline import get_plotlyjs

__all__ = ["WIDE_FIGURES", "FigurePanel", "figure_json"]

#: Figures that take the whole width of the grid (their subplots need it).
WIDE_FIGURES: Final = frozenset({"reward", "over_time"})

_ESM: Final = r"""
function loadPlotly(model) {
  if (globalThis.Plotly) return Promise.resolve(globalThis.Plotly);
  if (!globalThis.__ngcapturePlotly) {
    globalThis.__ngcapturePlotly = new Promise((resolve) => {
      const onMessage = (msg, buffers) => {
        if (!msg || msg.type !== "plotlyjs") return;
        model.off("msg:custom", onMessage);
        const script = document.createElement("script");
        script.textContent = new TextDecoder().decode(buffers[0]);
        document.head.appendChild(script);
        resolve(globalThis.Plotly);
      };
      model.on("msg:custom", onMessage);
      model.send({ type: "plotlyjs" });
    });
  }
  return globalThis.__ngcapturePlotly;
}

async function render({ model, el }) {
  el.classList.add("ngc-panel");
  const grid = document.createElement("div");
  grid.className = "ngc-panel-grid";
  el.appendChild(grid);
  const cells = new Map();
  const Plotly = await loadPlotly(model);
  const draw = () => {
    const figures = JSON.parse(model.get("figures") || "[]");
    for (const figure of figures) {
      let cell = cells.get(figure.name);
      if (!cell) {
        cell = document.createElement("div");
        cell.className = figure.wide ? "ngc-panel-cell ngc-panel-wide" : "ngc-panel-cell";
        cell.dataset.name = figure.name;
        grid.appendChild(cell);
        cells.set(figure.name, cell);
      }
      cell.style.height = (figure.spec.layout.height || 450) + "px";
      Plotly.react(cell, figure.spec.data, figure.spec.layout, {
        displaylogo: false, responsive: true,
      });
    }
    el.dataset.draws = String(Number(el.dataset.draws || 0) + 1);
  };
  draw();
  model.on("change:figures", draw);
  return () => {
    model.off("change:figures", draw);
    for (const cell of cells.values()) Plotly.purge(cell);
  };
}

export default { render };
"""

_CSS: Final = """
.ngc-panel { width: 100%; }
.ngc-panel-grid { display: grid; gap: 8px; width: 100%;
  grid-template-columns: repeat(auto-fill, minmax(min(100%, 560px), 1fr)); }
.ngc-panel-cell { min-width: 0; }
.ngc-panel-wide { grid-column: 1 / -1; }
"""


class FigurePanel(anywidget.AnyWidget):
    """Draws figures in a grid; ``show`` replaces them (only their JSON crosses the wire).

    Attributes:
        figures: the figures as JSON text (``[{name, wide, spec}]``), synced to the page.
        plotlyjs_sent: how many times this panel sent plotly.js (once per page that lacked it).
    """

    _esm = _ESM
    _css = _CSS
    figures = traitlets.Unicode("[]").tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plotlyjs_sent = 0
        self.on_msg(self._on_message)

    def show(self, figures: Mapping[str, go.Figure]) -> None:
        """Replace the drawn figures (in order; names keep their place in the grid)."""
        parts = []
        for name, fig in figures.items():
            spec = figure_json(fig)
            wide = "true" if name in WIDE_FIGURES else "false"
            parts.append(f'{{"name":{_quoted(name)},"wide":{wide},"spec":{spec}}}')
        self.figures = "[" + ",".join(parts) + "]"

    def _on_message(self, _widget: object, content: object, _buffers: object) -> None:
        if isinstance(content, dict) and content.get("type") == "plotlyjs":
            self.send({"type": "plotlyjs"}, buffers=[get_plotlyjs().encode()])
            self.plotlyjs_sent += 1


def figure_json(fig: go.Figure) -> str:
    """``{data, layout}`` of ``fig`` as JSON text: plain lists, numpy arrays turned into lists."""
    return orjson.dumps(
        fig.to_plotly_json(), option=orjson.OPT_SERIALIZE_NUMPY, default=_plain
    ).decode()


def _plain(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)  # numpy arrays orjson cannot take (strings)
    if tolist is not None:
        return tolist()
    raise TypeError(f"cannot encode {type(value).__name__} in a figure")


def _quoted(text: str) -> str:
    return orjson.dumps(text).decode()
