"""Capture writes in flight, visible to every process that shares the capture directory.

A server marks each captured call as pending when it starts and unmarks it once its line is
durable (or its failure recorded). Its marks live in one file of its own,
``<dir>/.pending/<writer>.slots``: fixed slots of :data:`SLOT_SIZE` bytes, each blank or
holding ``<rollout_id>@<model_call_id>`` (space-padded, newline-terminated, so ``cat`` shows
them). Marking is one ``pwrite`` into a file opened at start-up: no file is created per call,
and marking works when the process has no descriptor left. ``<writer>`` is the server's token
(see :mod:`capture_core.writers`).

A reader tells a live write from a lost one by the writer's lock: every server holds an
exclusive ``flock`` on ``<dir>/.writers/<writer>.lock`` for as long as it runs, so a lock that
can be taken (or a lock file that is gone) means the writer died and its marked calls will never
land (:attr:`PendingCall.lost`). A marker whose line did land (the writer died between the two)
is not evidence of a loss: :func:`sweep_markers` removes it, and readers that have the capture
file skip it. A collector about to rerun a rollout under the same id removes that rollout's
lost marks (:func:`forget_lost`): they belong to the attempt it archives, not to the rerun.

Markers of older versions, one empty file per call named ``<rollout_id>@<model_call_id>``
(optionally ``@<writer>``), are still read; without a writer they count as live.

The package: :mod:`~capture_core.pending.slots` (the on-disk format),
:mod:`~capture_core.pending.calls` (reading the marks, telling live from lost, waiting) and
:mod:`~capture_core.pending.sweep` (removing marks that will never clear).
"""

from capture_core.pending.calls import (
    PendingCall,
    all_pending_writes,
    mark_pending,
    pending_calls,
    pending_writes,
    unmark_pending,
    wait_for_pending,
    writer_alive,
)
from capture_core.pending.slots import (
    PENDING_DIR,
    SLOT_SIZE,
    SLOTS_SUFFIX,
    WRITERS_DIR,
    blank_slot,
    marker_name,
    pending_marker,
    slot_bytes,
)
from capture_core.pending.sweep import SweepReport, forget_lost, sweep_markers

__all__ = [
    "PENDING_DIR",
    "SLOTS_SUFFIX",
    "SLOT_SIZE",
    "WRITERS_DIR",
    "PendingCall",
    "SweepReport",
    "all_pending_writes",
    "blank_slot",
    "forget_lost",
    "mark_pending",
    "marker_name",
    "pending_calls",
    "pending_marker",
    "pending_writes",
    "slot_bytes",
    "sweep_markers",
    "unmark_pending",
    "wait_for_pending",
    "writer_alive",
]
