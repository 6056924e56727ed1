"""Live export: follow a growing run and log only its new calls and rollouts to W&B.

While a run trains, its capture store and rollout file grow. :class:`LiveExport` opens the run at
each poll through the sidecar index's incremental path (only appended bytes are parsed), keeps
the rows it has not logged yet, and logs them, payload-free, as ``wandb.Table``s plus a few
per-batch numbers. What was logged is remembered in a small JSON state file, so a restarted
watch resumes where it stopped and logs nothing twice.

What "new" means:

* a **call** of the store is new when its file has not been logged up to its ``call_index``
  (capture files are append-only; a file replaced by another one, told by its first call's id,
  starts over);
* a **rollout** is new when its record (a line of the rollout file, or of the collector's
  failures file) lies after the last line logged from that file. Its gaps and the calls its
  attachment lists that the store lacks are logged with it, as they stand when it appears.

The step of a batch is ``poll(step=)`` when given (a training loop knows its step), else the
largest ``step_field`` of the new rollouts, else the trailing number of ``checkpoint``
(``"ckpt-1200"`` → 1200), else the last step seen (calls without new rollouts), else the batch
number. It is logged as ``<prefix>/step`` and declared the x-axis of every
``<prefix>/*`` key, so W&B's own step is never forced.

Example:
    >>> from ngcapture_viz.export import LiveExport  # doctest: +SKIP
    >>> with LiveExport("results/model-calls", "results/rollouts.jsonl",  # doctest: +SKIP
    ...                 project="rl-run", step_field="step") as live:
    ...     for batch in trainer:  # your training loop
    ...         trainer.train(batch)
    ...         live.poll()
"""

from ngcapture_viz.export.watch.live import LiveExport, PollResult
from ngcapture_viz.export.watch.loop import watch
from ngcapture_viz.export.watch.state import STATE_DIR_NAME

__all__ = ["STATE_DIR_NAME", "LiveExport", "PollResult", "watch"]
