"""Per-rollout totals of captured calls, where ``None`` means unknown and never zero."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from capture_core.records import ModelCallMetrics, ModelCallRecord
from capture_core.store import CaptureStore

__all__ = [
    "aggregate_model_call_metrics",
    "aggregate_model_call_records",
    "read_model_call_records",
]

logger = logging.getLogger(__name__)

_INT_TOTALS = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens")


def aggregate_model_call_records(records: Iterable[ModelCallRecord]) -> ModelCallMetrics:
    """Sum what the calls reported.

    Each total sums the calls whose value is known; it is ``None`` only when no call reported
    it. ``0`` is a reported value. ``num_calls`` counts the records given. ``latency_total_ms``
    is the sum of per-call latencies, not the wall-clock span of the rollout.

    Example:
        >>> from capture_core.records import ModelCallRecord
        >>> calls = [ModelCallRecord(call_index=0, tokens_in=5),
        ...          ModelCallRecord(call_index=1, tokens_in=None)]
        >>> aggregate_model_call_records(calls).tokens_in
        5
    """
    sums: dict[str, int | None] = dict.fromkeys(_INT_TOTALS)
    latencies: list[float] = []
    num_calls = 0
    for record in records:
        num_calls += 1
        for name in _INT_TOTALS:
            value = getattr(record, name)
            if value is not None:
                sums[name] = (sums[name] or 0) + value
        if record.latency_total_ms is not None:
            latencies.append(record.latency_total_ms)
    # fsum, then drop float noise (latencies are written to 2 decimals).
    latency = round(math.fsum(latencies), 6) if latencies else None
    return ModelCallMetrics(**sums, latency_total_ms=latency, num_calls=num_calls)


def read_model_call_records(
    store: CaptureStore, rollout_id: str, *, strict: bool = False
) -> list[ModelCallRecord]:
    """The normalized records of one rollout, in ``call_index`` order.

    Tolerant by default: damaged lines are skipped but never silently, each read that skips
    any logs a warning naming the file and the count (``store.read_records`` returns them).
    With ``strict=True`` the first damaged line raises ``DamagedLineError``.

    Example:
        >>> store = CaptureStore("/abs/path/model-calls")  # doctest: +SKIP
        >>> [r.tokens_total for r in read_model_call_records(store, "0-0")]  # doctest: +SKIP
        [122]
    """
    result = store.read_records(rollout_id, strict=strict)
    if result.damaged:
        logger.warning(
            "skipped %d damaged line(s) in %s (first at line %d: %s)",
            len(result.damaged),
            result.damaged[0].path,
            result.damaged[0].line_number,
            result.damaged[0].reason,
        )
    return result.records


def aggregate_model_call_metrics(
    store: CaptureStore, rollout_id: str, *, strict: bool = False
) -> ModelCallMetrics:
    """Totals of one rollout's captured calls (``num_calls`` counts readable records).

    Example:
        >>> aggregate_model_call_metrics(store, "0-0").tokens_total  # doctest: +SKIP
        122
    """
    return aggregate_model_call_records(read_model_call_records(store, rollout_id, strict=strict))
