"""What a collection did: :class:`CollectSummary` and its totals over the rollouts run."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from capture_core.collect.attempts import BadLine
from capture_core.collect.rollout import FAILURE_KEY
from capture_core.records import ATTACHMENT_KEY

__all__ = ["CollectSummary"]


@dataclass
class CollectSummary:
    """What a collection did, with totals over the rollouts it ran (not earlier runs')."""

    output: Path
    failures: Path
    tasks: int = 0
    bad_input_lines: list[BadLine] = field(default_factory=list)
    dispatched: int = 0
    already_finished: int = 0
    exhausted: int = 0
    ok: int = 0
    failed: int = 0
    mean_reward: float | None = None
    num_calls: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_total: int | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    gaps: dict[str, int] = field(default_factory=dict)
    cleared_files: int = 0
    cleared_still_pending: int = 0
    run_id: str | None = None
    archived: list[Path] = field(default_factory=list)
    elapsed_s: float = 0.0
    token_capture: dict[str, Any] | None = None
    """Token delivery: finalized, masked, retired, kept, masked_fraction, reasons."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (paths as strings)."""
        data = asdict(self)
        data["output"], data["failures"] = str(self.output), str(self.failures)
        data["archived"] = [str(path) for path in self.archived]
        data["bad_input_lines"] = [
            {"line_number": b.line_number, "reason": b.reason} for b in self.bad_input_lines
        ]
        return data

    def format(self) -> str:
        """A few human lines, as the CLI prints them."""

        def num(value: float | None, unit: str = "") -> str:
            if value is None:
                return "unknown"
            return f"{value:,}{unit}" if isinstance(value, int) else f"{value:,.1f}{unit}"

        reward = "n/a" if self.mean_reward is None else f"{self.mean_reward:.3f}"
        gaps = ", ".join(f"{code} {n}" for code, n in sorted(self.gaps.items())) or "none"
        return "\n".join([
            f"rollouts: {self.ok} ok, {self.failed} failed (dispatched {self.dispatched}; "
            f"{self.already_finished} already finished, {self.exhausted} out of attempts)",
            f"mean reward: {reward}",
            f"model calls: {self.num_calls}; tokens in {num(self.tokens_in)}, "
            f"out {num(self.tokens_out)}, total {num(self.tokens_total)}",
            f"latency per call: p50 {num(self.latency_p50_ms, ' ms')}, "
            f"p95 {num(self.latency_p95_ms, ' ms')}",
            f"gaps: {gaps}",
            f"bad input lines skipped: {len(self.bad_input_lines)}; earlier capture archived: "
            f"{self.cleared_files} file(s), {self.cleared_still_pending} write(s) still pending",
            *_token_line(self.token_capture),
            f"run id: {self.run_id or 'none (bare <task>-<rollout> ids)'}",
            f"output: {self.output}",
            f"failures: {self.failures}",
            *(f"earlier data moved to: {folder}" for folder in self.archived),
        ])  # fmt: skip


def _token_line(token_capture: Mapping[str, Any] | None) -> list[str]:
    if token_capture is None:
        return []
    reasons = ", ".join(f"{reason} {n}" for reason, n in token_capture["reasons"].items())
    return [
        f"token capture: {token_capture['finalized']} finalized, {token_capture['masked']} "
        f"masked ({reasons or 'none'}), {token_capture['retired']} retired, "
        f"{token_capture['kept']} kept"
    ]


def _totals(summary: CollectSummary, records: list[dict[str, Any]], failed: int) -> None:
    summary.failed, summary.ok = failed, len(records) - failed
    rewards = [
        float(r["reward"])
        for r in records
        if FAILURE_KEY not in r and isinstance(r.get("reward"), int | float)
    ]
    summary.mean_reward = round(sum(rewards) / len(rewards), 6) if rewards else None
    latencies: list[float] = []
    gaps: Counter[str] = Counter()
    for record in records:
        capture = record.get(ATTACHMENT_KEY)
        if not isinstance(capture, dict):
            continue
        metrics = capture["metrics"]
        summary.num_calls += metrics["num_calls"]
        for name in ("tokens_in", "tokens_out", "tokens_total"):
            if metrics[name] is not None:
                setattr(summary, name, (getattr(summary, name) or 0) + metrics[name])
        latencies += [c["latency_total_ms"] for c in capture["calls"]
                      if c.get("latency_total_ms") is not None]  # fmt: skip
        gaps.update(gap["code"] for gap in capture.get("gaps", ()))
    summary.gaps = dict(sorted(gaps.items()))
    summary.latency_p50_ms = _percentile(latencies, 0.50)
    summary.latency_p95_ms = _percentile(latencies, 0.95)


def _percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]
