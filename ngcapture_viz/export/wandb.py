"""Log a run's payload-free tables and summary metrics to Weights & Biases.

Only what :func:`ngcapture_viz.export.payload_free_tables` lets through is logged: the allowlisted
columns of the calls, rollouts, gaps and tool-calls frames. Payloads never leave the machine.
``wandb`` is an optional extra (``pip install 'ngcapture[wandb]'``) imported only when called.

Example:
    >>> import ngcapture_viz as ngv  # doctest: +SKIP
    >>> from ngcapture_viz.export.wandb import export_to_wandb  # doctest: +SKIP
    >>> run = ngv.open_run("results/demo/ckpt-100/model-calls",  # doctest: +SKIP
    ...                    "results/demo/ckpt-100/rollouts.jsonl")
    >>> result = export_to_wandb(run, project="my-evals")  # doctest: +SKIP
    >>> result.rows, result.notes  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import polars as pl

from ngcapture_viz.exceptions import MissingExtraError
from ngcapture_viz.export.tables import RunOrRuns, cap_rows, payload_free_tables, summary_metrics

if TYPE_CHECKING:
    from wandb import Run

__all__ = ["WANDB_MAX_ROWS", "ExportResult", "export_to_wandb", "wandb_table_data"]

#: The documented ``wandb.Table`` row limit (``wandb.Table.MAX_ARTIFACT_ROWS``).
WANDB_MAX_ROWS: Final = 200_000

_INSTALL_HINT: Final = "pip install 'ngcapture[wandb]'"


@dataclass(frozen=True)
class ExportResult:
    """What an export logged.

    Attributes:
        rows: rows logged per table (after any cap).
        total_rows: rows each table had before the cap.
        notes: one line per capped table (empty when nothing was capped).
        summary: the summary metrics written to ``run.summary`` (keys prefixed).
        run_id: the W&B run's id.
        run_dir: the run's local directory (offline runs keep everything there).
        started_run: the export started (and finished) the run itself.
    """

    rows: dict[str, int]
    total_rows: dict[str, int]
    notes: list[str] = field(default_factory=list)
    summary: dict[str, float | int | None] = field(default_factory=dict)
    run_id: str = ""
    run_dir: Path | None = None
    started_run: bool = False


def _import_wandb() -> ModuleType:
    try:
        import wandb
    except ImportError as exc:
        raise MissingExtraError(
            f"exporting to Weights & Biases needs the wandb package: {_INSTALL_HINT}"
        ) from exc
    return wandb


def wandb_table_data(frame: pl.DataFrame) -> tuple[list[str], list[list[Any]]]:
    """Column names and rows of ``frame`` in types ``wandb.Table`` accepts.

    Datetimes become ISO 8601 strings in UTC, categoricals strings, string lists comma-joined
    strings; nulls stay ``None``.

    Example:
        >>> wandb_table_data(pl.DataFrame({"tool_names": [["a", "b"], None]}))
        (['tool_names'], [['a,b'], [None]])
    """
    exprs: list[pl.Expr] = []
    for name, dtype in frame.schema.items():
        column = pl.col(name)
        if isinstance(dtype, pl.Datetime):
            column = column.dt.convert_time_zone("UTC").dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        elif isinstance(dtype, pl.Categorical | pl.Enum):
            column = column.cast(pl.String)
        elif isinstance(dtype, pl.List):
            column = column.cast(pl.List(pl.String)).list.join(",")
        exprs.append(column.alias(name))
    converted = frame.select(exprs)
    return converted.columns, [list(row) for row in converted.iter_rows()]


def export_to_wandb(
    run_or_runs: RunOrRuns,
    *,
    wandb_run: Run | None = None,
    project: str | None = None,
    entity: str | None = None,
    name: str | None = None,
    extra_columns: Sequence[str] | None = None,
    payload_digests: bool = False,
    absolute_paths: bool = False,
    max_rows: int = WANDB_MAX_ROWS,
    prefix: str = "ngcapture",
) -> ExportResult:
    """Log the payload-free tables as ``wandb.Table``s and the summary metrics to a W&B run.

    Tables are logged under ``<prefix>/calls``, ``<prefix>/rollouts``, ``<prefix>/gaps`` and
    ``<prefix>/tool_calls``; summary metrics (see :func:`~ngcapture_viz.export.summary_metrics`)
    under ``<prefix>/<metric>``, with ``<prefix>/<table>_rows`` and, for a capped table,
    ``<prefix>/<table>_rows_dropped``.

    Args:
        run_or_runs: a run, a stack of runs, or a sequence of runs to stack.
        wandb_run: the W&B run to log to; default the active run (``wandb.run``), else a new one
            started with ``wandb.init(project=, entity=, name=)`` and finished before returning.
        extra_columns, payload_digests, absolute_paths: see
            :func:`~ngcapture_viz.export.payload_free_tables` (paths are relative by default).
        max_rows: rows kept per table at most; a capped table gets a note in the result and
            the log (W&B's documented limit is 200,000 rows per table).
        prefix: the key prefix of everything logged.

    Raises:
        MissingExtraError: ``wandb`` is not installed.
        ExportError: an extra column is refused or unknown, or ``max_rows`` < 1.

    Example:
        >>> result = export_to_wandb(run, project="evals", payload_digests=True)  # doctest: +SKIP
        >>> result.rows["calls"]  # doctest: +SKIP
        40
    """
    wandb = _import_wandb()
    tables = payload_free_tables(
        run_or_runs,
        extra_columns=extra_columns,
        payload_digests=payload_digests,
        absolute_paths=absolute_paths,
    )
    capped, notes = cap_rows(tables, max_rows)
    summary: dict[str, float | int | None] = {
        f"{prefix}/{key}": value for key, value in summary_metrics(run_or_runs).items()
    }
    for table, frame in capped.items():
        summary[f"{prefix}/{table}_rows"] = frame.height
        if frame.height < tables[table].height:
            summary[f"{prefix}/{table}_rows_dropped"] = tables[table].height - frame.height
    target = wandb_run if wandb_run is not None else wandb.run
    started = target is None
    if target is None:
        target = wandb.init(project=project, entity=entity, name=name, job_type="ngcapture")
    try:
        logged = {}
        for table, frame in capped.items():
            columns, rows = wandb_table_data(frame)
            logged[f"{prefix}/{table}"] = wandb.Table(columns=columns, data=rows)
        target.log(logged)
        target.summary.update(summary)
        result = ExportResult(
            rows={table: frame.height for table, frame in capped.items()},
            total_rows={table: frame.height for table, frame in tables.items()},
            notes=notes,
            summary=summary,
            run_id=target.id,
            run_dir=Path(target.dir).parent,
            started_run=started,
        )
    except BaseException:
        if started:
            target.finish(exit_code=1)
        raise
    if started:
        target.finish()
    return result
