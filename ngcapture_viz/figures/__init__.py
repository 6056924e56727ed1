"""Figures over a run: the dashboard, rollout timelines, the gap report and the live widget.

Builders take frames or a ``CaptureRun`` and return ``plotly.graph_objects.Figure`` objects
(or result objects holding them); nothing here calls ``.show()`` or ``display()``.
"""

from ngcapture_viz.figures.dashboard import Dashboard, dashboard, run_colors
from ngcapture_viz.figures.gap_report import GapReport, gap_report
from ngcapture_viz.figures.timeline import assign_lanes, outcome_color, timeline
from ngcapture_viz.figures.widget import CaptureDashboard

__all__ = [
    "CaptureDashboard",
    "Dashboard",
    "GapReport",
    "assign_lanes",
    "dashboard",
    "gap_report",
    "outcome_color",
    "run_colors",
    "timeline",
]
