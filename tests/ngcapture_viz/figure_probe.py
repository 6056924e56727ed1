"""A notebook that shows every public figure bare and every result object, and what a browser
page made of each output (for the front-end tests: a lab without plotly's renderer, Notebook 7).

Three cells: set-up (the two demo checkpoints, their dashboard and diff), then one cell that
displays each figure as its own output, then one that displays each result object. Few cells
make a fast run; one output per object keeps the facts per object.
"""

from __future__ import annotations

from typing import Any, Final

#: Every public figure, displayed bare (its own mime bundle): source -> figures it draws.
BARE_FIGURES: Final = {
    **{f'board.figures["{name}"]': 1 for name in
       ("tokens", "latency", "throughput", "over_time", "errors", "reward", "time")},
    "ngv.timeline(new, slowest)": 1,
    "ngv.gap_report(runs).figure()": 1,
    "change.figure()": 1,
}  # fmt: skip
#: Every result object (HTML that draws its own figures): source -> figures it draws.
RESULT_OBJECTS: Final = {
    "runs": 0,
    "board": 7,
    "ngv.gap_report(runs)": 1,
    "change": 1,
    "ngv.CALLS": 0,
}
#: The dashboard's figure names, as the set-up cell lists them.
DASHBOARD_FIGURES: Final = sorted(
    name.split('"')[1] for name in BARE_FIGURES if name.startswith("board")
)

SETUP: Final = """\
import ngcapture_viz as ngv
from _setup import checkpoint

runs = ngv.open_runs({name: checkpoint(name) for name in ("ckpt-100", "ckpt-200")})
old, new = runs.runs["ckpt-100"], runs.runs["ckpt-200"]
board = ngv.dashboard(runs)
change = ngv.diff(old, new, n_boot=200)
slowest = new.rollouts.sort("wall_ms", descending=True, nulls_last=True)["rollout_id"][0]
sorted(board.figures)"""

#: Per code cell, per output: its figures (ours and plotly renderer's), how many are drawn
#: (plotly's ``_fullLayout`` and an SVG), and "plotly.js is not loaded" placeholders.
OUTPUT_FACTS: Final = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const notebook = panel.content;
  return notebook.widgets.filter(c => c.model.type === 'code').map(cell =>
    [...cell.node.querySelectorAll('.jp-OutputArea-child')].map(out => {
      // Ours (the HTML fallback or a result's grid) and plotly renderer's (itself the plot).
      const figures = [...out.querySelectorAll('.ngc-figure, .jp-RenderedPlotly.js-plotly-plot')];
      return {
        figures: figures.length,
        drawn: figures.filter(d => d._fullLayout && d.querySelector('svg.main-svg')).length,
        byPlotlyRenderer: out.querySelectorAll('.jp-RenderedPlotly').length,
        missingPlotly: out.querySelectorAll('.ngc-no-plotly').length,
      };
    }));
}"""

#: True once every figure on the page is drawn or has given up waiting for plotly.js.
ALL_SETTLED: Final = """() => [...document.querySelectorAll('.ngc-figure')]
  .every(d => d._fullLayout || d.classList.contains('ngc-no-plotly'))"""


def probe_notebook() -> dict[str, Any]:
    """The notebook's JSON (nbformat 4, the ``python3`` kernel)."""
    sources = [
        SETUP,
        *(f"display({', '.join(objects)})" for objects in (BARE_FIGURES, RESULT_OBJECTS)),
    ]
    cells = [
        {"cell_type": "code", "source": source, "metadata": {}, "outputs": [],
         "execution_count": None}
        for source in sources
    ]  # fmt: skip
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return {"cells": cells, "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5}


def mismatches(
    executed: list[dict[str, Any]], facts: list[list[dict[str, int]]], *, plotly_renderer: bool
) -> list[str]:
    """What differs from "every figure drawn, each bare one by plotly's renderer when the front
    end has it, else by our HTML fallback" (``executed``: the code cells' JSON, ``facts``:
    :data:`OUTPUT_FACTS`); empty when all is well."""
    wrong = []
    listed = [o for o in executed[0]["outputs"] if o["output_type"] == "execute_result"]
    if [o["data"]["text/plain"] for o in listed] != [repr(DASHBOARD_FIGURES)]:
        wrong.append(f"the dashboard's figures are not {DASHBOARD_FIGURES}: {listed}")
    for objects, outputs, cell in zip(
        (BARE_FIGURES, RESULT_OBJECTS), facts[1:], executed[1:], strict=True
    ):
        if not len(outputs) == len(cell["outputs"]) == len(objects):
            wrong.append(f"{len(objects)} objects, {len(outputs)} outputs: {cell['outputs']}")
            continue
        for (source, count), seen, output in zip(
            objects.items(), outputs, cell["outputs"], strict=True
        ):
            bare = objects is BARE_FIGURES
            want = {
                "figures": count,
                "drawn": count,
                "byPlotlyRenderer": count if bare and plotly_renderer else 0,
                "missingPlotly": 0,
            }
            if seen != want:
                wrong.append(f"{source}: {seen}, expected {want}")
            # A bare figure carries plotly's JSON and the HTML fallback, whoever draws it.
            if bare and not {"application/vnd.plotly.v1+json", "text/html"} <= set(
                output.get("data", {})
            ):
                wrong.append(f"{source}: output types {sorted(output.get('data', {}))}")
    return wrong
