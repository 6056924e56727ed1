"""A light figure panel for notebooks: one anywidget that draws many figures with plotly.js.

plotly's ``FigureWidget`` ships plotly.js (~4.8 MB) with every instance; six of them made a
dashboard send ~30 MB before it drew. :class:`FigurePanel` holds only the figures' JSON in its
synced state. plotly.js reaches a page once: the first panel of a kernel session carries it in
its opening state (the page evaluates it, and warms plotly's drawing code up, while the kernel
is still computing the figures, then drops the bytes from the state); a page that lacks it
later (reloaded, or opened after) asks the kernel (a custom message answered with one binary
buffer), unless the page already has ``window.Plotly``. It asks for the lightest
bundle that draws its figures (:mod:`ngcapture_viz.display.bundles`: the basic one, 1.2 MB,
evaluates in a fifth of the full one's time) and keeps it to itself, so the page's
``window.Plotly`` is never a partial bundle. Figures are redrawn with ``Plotly.react`` in a
grid that fills the output's width.

Example:
    >>> panel = FigurePanel()  # doctest: +SKIP
    >>> panel.show({"latency": fig})  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

import anywidget
import orjson
import plotly.graph_objects as go
import traitlets

from ngcapture_viz.display.bundles import Bundle, bundle_for, bundle_source
from ngcapture_viz.display.plotlyjs import current_cell

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

// Draws a tiny figure off-screen, so that the first real draw finds plotly's drawing code
// already compiled (the first draw in a fresh page costs several times a later one). The
// figure is removed a while after it drew: plotly may still redraw it for its margins.
async function warmUp(Plotly) {
  const div = document.createElement("div");
  div.style.cssText = "position:absolute;left:-10000px;top:0;width:480px;height:320px;";
  document.body.appendChild(div);
  try {
    await Plotly.newPlot(div, [
      { type: "scatter", mode: "lines+markers", x: [1, 2], y: [1, 2], name: "a" },
      { type: "bar", x: ["a", "b"], y: [1, 2], xaxis: "x2", yaxis: "y2", name: "b" },
    ], {
      grid: { rows: 1, columns: 2, pattern: "independent" },
      title: { text: "warm-up" },
      annotations: [{ text: "a", x: 1, y: 1, showarrow: false }],
    });
  } finally {
    setTimeout(() => {
      try { Plotly.purge(div); } finally { div.remove(); }
    }, 5000);
  }
}

// The first panel of a kernel session carries plotly.js in its opening state, so the page
// takes it in while the kernel is still computing the figures. The bytes are dropped from
// the page's copy of the state at once (a notebook saved with widget state stays small); the
// kernel drops its own when the cell ends, or when told the page took them.
function initialize({ model }) {
  const pushed = model.get("plotlyjs_push");
  if (!pushed || pushed.byteLength === 0) return;
  model.set("plotlyjs_push", null);
  model.send({ type: "plotlyjs-taken" });
  const loaded = (globalThis.__ngcapturePlotlyBundles ||= {});
  const bundle = model.get("plotlyjs_push_bundle") === "basic" ? "basic" : "full";
  if (globalThis.Plotly || loaded.full || loaded[bundle]) return;
  const source = new TextDecoder().decode(pushed);
  loaded[bundle] = new Promise((resolve, reject) => {
    setTimeout(async () => {
      let Plotly;
      try {
        Plotly = evaluate(source);
      } catch (error) {
        delete loaded[bundle];
        reject(error);
        return;
      }
      try {
        await warmUp(Plotly);
      } catch (error) {
        console.warn("ngcapture: plotly.js warm-up failed", error);
      }
      if (bundle === "full") loaded.full = loaded[bundle];
      resolve(Plotly);
    }, 0);
  });
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

export default { initialize, render };
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

    Args:
        prefetch: the bundle the figures will probably need (``basic`` or ``full``). The first
            panel made with one in a kernel session carries that bundle in its opening state,
            so the page evaluates it while the kernel computes the figures; later panels, and
            panels outside a kernel, carry none (a page that lacks plotly.js asks for it).

    Attributes:
        figures: the figures as JSON text (``[{name, wide, spec}]``), synced to the page.
        plotly_bundle: ``basic`` or ``full``: the plotly.js bundle the figures need, synced.
        plotlyjs_push: the bundle carried in the opening state (empty once the page took it).
        plotlyjs_sent: the bundles this panel sent, pushed or asked for, in order.
    """

    _esm = _ESM
    _css = _CSS
    figures = traitlets.Unicode("[]").tag(sync=True)
    plotly_bundle = traitlets.Unicode("full").tag(sync=True)
    plotlyjs_push = traitlets.Bytes(b"").tag(sync=True)
    plotlyjs_push_bundle = traitlets.Unicode("").tag(sync=True)

    def __init__(self, *, prefetch: Bundle | None = None, **kwargs: Any) -> None:
        sent: list[str] = []
        if prefetch is not None and _PUSHES.first_in_kernel():
            bundle, source = bundle_source(prefetch)
            kwargs |= {"plotlyjs_push": source.encode(), "plotlyjs_push_bundle": bundle}
            sent.append(bundle)
        super().__init__(**kwargs)
        self.plotlyjs_sent: list[str] = sent
        self.on_msg(self._on_message)
        if sent:  # the page got the bytes with the opening state: no later state keeps them
            _after_this_cell(lambda: setattr(self, "plotlyjs_push", b""))

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
        if isinstance(content, dict) and content.get("type") == "plotlyjs-taken":
            self.plotlyjs_push = b""
        if isinstance(content, dict) and content.get("type") == "plotlyjs":
            bundle, source = bundle_source(str(content.get("bundle", "full")))
            self.send({"type": "plotlyjs", "bundle": bundle}, buffers=[source.encode()])
            self.plotlyjs_sent.append(bundle)


class _KernelPushes:
    """Whether a panel of this kernel session has carried plotly.js in its opening state."""

    def __init__(self) -> None:
        self.done = False

    def first_in_kernel(self) -> bool:
        """True once per kernel session (and never outside a kernel)."""
        if self.done or current_cell() is None:
            return False
        self.done = True
        return True


_PUSHES: Final = _KernelPushes()


def _after_this_cell(action: Callable[[], None]) -> None:
    """Run ``action`` once when the executing cell has finished (IPython's post_execute)."""
    ipython_module = sys.modules.get("IPython")
    shell = ipython_module.get_ipython() if ipython_module is not None else None
    if shell is None:
        action()
        return

    def once(*_: object) -> None:
        shell.events.unregister("post_execute", once)
        action()

    shell.events.register("post_execute", once)


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
