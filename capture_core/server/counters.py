"""Capture counters, exposed in Prometheus text format at ``GET /ngcapture/metrics``.

They are changed and read on the server's event loop only (writer threads report back to it),
so they take no lock: a lock shared with threads that wait for the GIL made the loop wait too.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CaptureCounters"]

_HELP = {
    "calls_captured": ("counter", "Model calls whose capture line was written."),
    "bytes_written": ("counter", "Bytes appended to capture files."),
    "capture_failures": ("counter", "Model calls whose capture could not be written."),
    "invalid_rollout_ids": ("counter", "Prefixed requests served uncaptured: invalid rollout id."),
    "uncaptured_requests": ("counter", "Requests forwarded without capture."),
    "requests_refused": (
        "counter",
        "Requests answered by the server itself (bad target, method, upgrade, body or header "
        "size, HTTP the parser rejects, headers too slow).",
    ),
    "marker_failures": ("counter", "Captured calls whose pending marker could not be made."),
    "writes_outstanding": ("gauge", "Capture writes started and not yet durable."),
}


@dataclass
class CaptureCounters:
    """Counters of one capture server process (event-loop thread only)."""

    calls_captured: int = 0
    bytes_written: int = 0
    capture_failures: int = 0
    invalid_rollout_ids: int = 0
    uncaptured_requests: int = 0
    requests_refused: int = 0
    marker_failures: int = 0
    writes_outstanding: int = 0

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` (may be negative for the gauge) to counter ``name``."""
        self.bump(**{name: amount})

    def bump(self, **amounts: int) -> None:
        """Add to several counters."""
        for name, amount in amounts.items():
            setattr(self, name, getattr(self, name) + amount)

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in _HELP}

    def prometheus(self) -> str:
        """The counters in Prometheus text exposition format 0.0.4."""
        lines: list[str] = []
        for name, value in self.snapshot().items():
            kind, help_text = _HELP[name]
            metric = f"ngcapture_{name}" + ("_total" if kind == "counter" else "")
            lines += [
                f"# HELP {metric} {help_text}",
                f"# TYPE {metric} {kind}",
                f"{metric} {value}",
            ]
        return "\n".join(lines) + "\n"
