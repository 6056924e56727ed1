"""Exports without payloads: the column allowlist, payload-free tables, Parquet and W&B.

:mod:`ngcapture_viz.export.columns` decides what may leave the machine,
:mod:`ngcapture_viz.export.tables` builds the tables and writes Parquet, and
:mod:`ngcapture_viz.export.wandb` logs them to Weights & Biases (``wandb`` is imported only
when called), and :mod:`ngcapture_viz.export.watch` logs a growing run's new rows as it trains.
"""

from ngcapture_viz.export.columns import ALLOWED_COLUMNS, DIGEST_COLUMNS, PAYLOAD_COLUMNS
from ngcapture_viz.export.tables import (
    RunOrRuns,
    as_run,
    cap_rows,
    payload_free_tables,
    summary_metrics,
    to_parquet,
)
from ngcapture_viz.export.wandb import (
    WANDB_MAX_ROWS,
    ExportResult,
    export_to_wandb,
    wandb_table_data,
)
from ngcapture_viz.export.watch import LiveExport, PollResult, watch

__all__ = [
    "ALLOWED_COLUMNS",
    "DIGEST_COLUMNS",
    "PAYLOAD_COLUMNS",
    "WANDB_MAX_ROWS",
    "ExportResult",
    "LiveExport",
    "PollResult",
    "RunOrRuns",
    "as_run",
    "cap_rows",
    "export_to_wandb",
    "payload_free_tables",
    "summary_metrics",
    "to_parquet",
    "wandb_table_data",
    "watch",
]
