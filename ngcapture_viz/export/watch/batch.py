"""What a batch logs: its payload-free tables, its own numbers, and the step it is logged at."""

from __future__ import annotations

import re
from typing import Any, Final

import polars as pl

from ngcapture_viz.exceptions import ExportError
from ngcapture_viz.export.tables import payload_free_tables, summary_metrics
from ngcapture_viz.export.wandb import _import_wandb, wandb_table_data
from ngcapture_viz.export.watch.state import _State
from ngcapture_viz.run import CaptureRun

#: Gaps that come and go while a run trains: never logged as rows.
_TRANSIENT: Final = frozenset({"model_call_capture_pending", "rollout_not_in_rollouts"})


def _tables(
    run: CaptureRun,
    calls: pl.DataFrame,
    rollouts: pl.DataFrame,
    *,
    extra_columns: list[str],
    payload_digests: bool,
) -> dict[str, pl.DataFrame]:
    """The payload-free tables reduced to this batch's rows."""
    tables = payload_free_tables(run, extra_columns=extra_columns, payload_digests=payload_digests)
    new_ids = rollouts.select("rollout_id")
    store_keys = calls.select("rollout_id", "call_index")
    # Calls only an attachment knows of travel with their rollout.
    attachment = tables["calls"].filter(pl.col("source") == "attachment")
    return {
        "calls": pl.concat(
            [
                tables["calls"]
                .filter(pl.col("source") == "store")
                .join(store_keys, on=["rollout_id", "call_index"], how="semi"),
                attachment.join(new_ids, on="rollout_id", how="semi"),
            ]
        ),
        "rollouts": tables["rollouts"].join(new_ids, on="rollout_id", how="semi"),
        "gaps": tables["gaps"]
        .join(new_ids, on="rollout_id", how="semi")
        .filter(~pl.col("code").cast(pl.String).is_in(list(_TRANSIENT))),
        "tool_calls": pl.concat(
            [
                tables["tool_calls"]
                .filter(pl.col("source") == "store")
                .join(store_keys, on=["rollout_id", "call_index"], how="semi"),
                tables["tool_calls"]
                .filter(pl.col("source") == "attachment")
                .join(new_ids, on="rollout_id", how="semi"),
            ]
        ),
    }


def _payload(
    run: CaptureRun,
    state: _State,
    *,
    prefix: str,
    tables: dict[str, pl.DataFrame],
    calls: pl.DataFrame,
    rollouts: pl.DataFrame,
    batch: int,
    step: int,
) -> dict[str, Any]:
    wandb = _import_wandb()
    p = prefix
    data: dict[str, Any] = {
        f"{p}/step": step,
        f"{p}/batch": batch,
        f"{p}/calls_logged": state.calls_logged + tables["calls"].height,
        f"{p}/rollouts_logged": state.rollouts_logged + tables["rollouts"].height,
        f"{p}/gaps_now": run.gaps.height,
    }
    for table, frame in tables.items():
        data[f"{p}/new_{table}"] = frame.height
        if frame.height:
            columns, rows = wandb_table_data(frame.with_columns(pl.lit(step).alias("step")))
            data[f"{p}/{table}"] = wandb.Table(columns=columns, data=rows)
    # The batch's own numbers (latency percentiles, tokens, error rate of the new calls).
    keys = calls.select("rollout_id", "call_index")
    batch_run = CaptureRun(
        run.label,
        calls=run.calls.join(keys, on=["rollout_id", "call_index"], how="semi"),
        rollouts=run.rollouts.join(rollouts.select("rollout_id"), on="rollout_id", how="semi"),
        gaps=run.gaps.clear(),
        tool_calls=run.tool_calls.clear(),
    )
    for key, value in summary_metrics(batch_run).items():
        if key not in ("gaps",) and not key.endswith("_coverage"):
            data[f"{p}/batch/{key}"] = value
    rewards = batch_run.rollouts["reward"].drop_nulls()
    data[f"{p}/batch/reward_mean"] = rewards.mean() if rewards.len() else None
    return data


def _step(
    run: CaptureRun,
    rollouts: pl.DataFrame,
    step: int | None,
    *,
    state: _State,
    step_field: str | None,
    checkpoint_step: int | None,
) -> int:
    """The step of this batch (see the package docstring)."""
    if step is not None:
        return step
    if step_field is not None and step_field in run.rollouts.columns:
        values = run.rollouts.join(rollouts.select("rollout_id"), on="rollout_id", how="semi")
        numbers = values[step_field].cast(pl.Int64, strict=False).drop_nulls()
        if numbers.len():
            return int(numbers.max())  # type: ignore[arg-type]
    if checkpoint_step is not None:
        return checkpoint_step
    if step_field is not None and state.step is not None:
        return state.step  # calls without new rollouts: the last step seen
    return state.batches + 1


def _checkpoint_step(label: str) -> int:
    match = re.search(r"(\d+)\D*$", label)
    if match is None:
        raise ExportError(f"checkpoint label {label!r} has no number to take the step from")
    return int(match.group(1))
