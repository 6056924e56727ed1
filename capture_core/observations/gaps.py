"""Evidence gaps of agent observations and trajectories: ``{code, invocation_id, detail}``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from capture_core.observations._model import StrictModel

__all__ = ["ObservationGap", "dedupe_gaps", "gap_codes"]


class ObservationGap(StrictModel):
    """Evidence a producer or the collector could not observe or join exactly.

    ``invocation_id`` names the agent invocation concerned, when there is one.
    """

    code: str
    invocation_id: str | None = None
    detail: str | None = None

    def key(self) -> tuple[str, str | None, str | None]:
        """What two gaps must share to be the same gap."""
        return self.code, self.invocation_id, self.detail


def dedupe_gaps(gaps: Iterable[ObservationGap]) -> list[ObservationGap]:
    """Drop repeated gaps (same code, invocation and detail), keeping the first and the order.

    Example:
        >>> gap = ObservationGap(code="turns_unavailable")
        >>> len(dedupe_gaps([gap, gap.model_copy()]))
        1
    """
    seen: set[tuple[str, str | None, str | None]] = set()
    kept: list[ObservationGap] = []
    for gap in gaps:
        if gap.key() not in seen:
            seen.add(gap.key())
            kept.append(gap)
    return kept


def gap_codes(holder: object) -> set[str]:
    """The gap codes of a JSON object's ``gaps`` list, read tolerantly (anything else: none).

    Example:
        >>> gap_codes({"gaps": [{"code": "multimodal_history_redacted"}, "junk"]})
        {'multimodal_history_redacted'}
    """
    if not isinstance(holder, Mapping):
        return set()
    gaps: Any = holder.get("gaps")
    if not isinstance(gaps, list):
        return set()
    return {g["code"] for g in gaps if isinstance(g, Mapping) and isinstance(g.get("code"), str)}
