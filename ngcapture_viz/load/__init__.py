"""Loading runs: list a capture directory, scan its lines, keep the sidecar index, read rollouts.

``CaptureIndex`` turns a capture store into call, tool-call and gap rows (cached as Parquet
beside the store); ``read_rollouts`` reads a rollout JSONL file. ``ngcapture_viz.open_run``
puts both together into a ``CaptureRun``.
"""

from ngcapture_viz.load.index import INDEX_DIR_NAME, CaptureIndex, IndexStats, default_cache_dir
from ngcapture_viz.load.rollouts import RolloutRecord, RolloutSource, read_rollouts

__all__ = [
    "INDEX_DIR_NAME",
    "CaptureIndex",
    "IndexStats",
    "RolloutRecord",
    "RolloutSource",
    "default_cache_dir",
    "read_rollouts",
]
