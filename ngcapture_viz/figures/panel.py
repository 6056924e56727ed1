"""A light figure panel for notebooks: one anywidget that draws many figures with plotly.js.

plotly's ``FigureWidget`` ships plotly.js (~4.8 MB) with every instance; six of them made a
dashboard send ~30 MB before it drew. :class:`FigurePanel` holds only the figures' JSON in its
synced state and asks the kernel for plotly.js once per page (a custom message answered with
one binary buffer), unless the page already has ``window.Plotly``. It asks for the lightest
bundle that draws its figures (:mod:`ngcapture_viz.display.bundles`: the basic one, 1.2 MB,
evaluates in a fifth of the full one's time) and keeps it to itself, so the page's
``window.Plotly`` is never a partial bundle. Figures are redrawn with ``Plotly.react`` in a
grid that fills the output's width.

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

from ngcapture_viz.display.bundles import bundle_for, bundle_source

__all__ = ["WIDE_FIGURES", "FigurePanel", "figure_json"]

#: Figures that take the whole width of the grid (their subplots need it).
WIDE_FIGURES: Final = frozenset({"reward", "over_time"})

_ESM: Final = r"""
// Runs a plotly.js bundle and returns its Plotly object without leaving it, or the bundle's
// stray globals, on the page: window.Plotly stays whatever the page's other outputs made it.
function evaluate(source) {
  const saved = ["Plotly", "moduleName"].map(
    (key) => [key, Object.getOwnPropertyDescriptor(globalThis, key)]);
  const shim = { exports: {} };
  globalThis.__ngcapturePlotlyModule = shim;
  const script = document.createElement("script");
  script.textContent = "(function (module) {\n" + source
    + "\n})(globalThis.__ngcapturePlotlyModule);";
  try {
    document.head.appendChild(script);
  } finally {
    script.remove();
    delete globalThis.__ngcapturePlotlyModule;
    for (const [key, descriptor] of saved) {
      if (descriptor) Object.defineProperty(globalThis, key, descriptor);
      else delete globalThis[key];
    }
  }
  return shim.exports;
}

// plotly.js once per page: the page's own window.Plotly (the full bundle an HTML output
// embedded), else the bundle this panel's figures need, asked of the kernel once; the full
// bundle serves every later request.
function loadPlotly(model) {
  if (globalThis.Plotly) return Promise.resolve(globalThis.Plotly);
  const loaded = (globalThis.__ngcapturePlotlyBundles ||= {});
  const want = model.get("plotly_bundle") === "basic" ? "basic" : "full";
  if (loaded.full) return loaded.full;
  if (!loaded[want]) {
    loaded[want] = new Promise((resolve, reject) => {
      const onMessage = (msg, buffers) => {
        if (!msg || msg.type !== "plotlyjs") return;
        model.off("msg:custom", onMessage);
        try {
          const Plotly = evaluate(new TextDecoder().decode(buffers[0]));
          if (msg.bundle === "full") loaded.full = loaded[want];
          resolve(Plotly);
        } catch (error) {
          delete loaded[want];
          reject(error);
        }
      };
      model.on("msg:custom", onMessage);
      model.send({ type: "plotlyjs", bundle: want });
    });
  }
  return loaded[want];
}

async function render({ model, el }) {
  el.classList.add("ngc-panel");
  const grid = document.createElement("div");
  grid.className = "ngc-panel-grid";
  el.appendChild(grid);
  const cells = new Map();
  let Plotly = null;
  // How long this view waited for plotly.js and took to draw, for benchmarks (ms).
  const started = performance.now();
  const draw = async () => {
    Plotly = await loadPlotly(model);
    const ready = performance.now();
    if (!el.dataset.plotlyMs) el.dataset.plotlyMs = String(Math.round(ready - started));
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
    el.dataset.drawMs = String(Math.round(performance.now() - ready));
  };
  // Draws run one after another, each with the figures of its moment.
  let drawing = draw();
  const redraw = () => { drawing = drawing.then(draw, draw); };
  model.on("change:figures", redraw);
  await drawing;
  return () => {
    model.off("change:figures", redraw);
    if (Plotly) for (const cell of cells.values()) Plotly.purge(cell);
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
        plotly_bundle: ``basic`` or ``full``: the plotly.js bundle the figures need, synced.
        plotlyjs_sent: the bundles this panel sent, in order (once per page that lacked one).
    """

    _esm = _ESM
    _css = _CSS
    figures = traitlets.Unicode("[]").tag(sync=True)
    plotly_bundle = traitlets.Unicode("full").tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plotlyjs_sent: list[str] = []
        self.on_msg(self._on_message)

    def show(self, figures: Mapping[str, go.Figure]) -> None:
        """Replace the drawn figures (in order; names keep their place in the grid)."""
        parts = []
        for name, fig in figures.items():
            spec = figure_json(fig)
            wide = "true" if name in WIDE_FIGURES else "false"
            parts.append(f'{{"name":{_quoted(name)},"wide":{wide},"spec":{spec}}}')
        bundle = bundle_for(trace.type for fig in figures.values() for trace in fig.data)
        with self.hold_sync():
            self.plotly_bundle = bundle
            self.figures = "[" + ",".join(parts) + "]"

    def _on_message(self, _widget: object, content: object, _buffers: object) -> None:
        if isinstance(content, dict) and content.get("type") == "plotlyjs":
            bundle, source = bundle_source(str(content.get("bundle", "full")))
            self.send({"type": "plotlyjs", "bundle": bundle}, buffers=[source.encode()])
            self.plotlyjs_sent.append(bundle)


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
