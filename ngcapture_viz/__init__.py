"""ngcapture_viz: load capture stores and rollout JSONL into Polars frames, and chart them.

The analysis API lands with the frames issue; the package exists so the distribution's layout
is fixed from the start.
"""

__all__: list[str] = []
