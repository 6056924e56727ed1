"""Join an agent's model-call references to the captured calls, exactly or not at all.

:func:`join_model_call_observations` never guesses. A reference resolves only when exactly one
captured call matches it, by ``model_call_id`` (narrowed by the model server and response id
when the reference gives them) or by the exact (model server, ``response_id``) pair. Each call
is owned by at most one invocation: the first reference to claim it. Everything else becomes a
gap on the bundle:

* ``model_call_reference_unmatched`` / ``_ambiguous``: no call, or several, match the reference;
* ``model_call_reference_conflict``: the call is already owned (by an earlier reference, or by
  another invocation than the compaction naming it);
* ``model_call_ownership_unavailable``: a compaction names a call its invocation does not own,
  or (detail ``capture:<id>:call_index=<n>``) a captured call no invocation owns.

Resolved references are replaced by the call's canonical reference, and the gaps an earlier join
left are dropped first, so joining the result again changes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Final

from capture_core.observations.bundle import (
    AgentInvocation,
    AgentObservationBundle,
    ContextCompaction,
    ObservationRecord,
)
from capture_core.observations.gaps import ObservationGap, dedupe_gaps
from capture_core.observations.refs import ModelCallRef, canonical_ref
from capture_core.records import GapCode, ModelCallRecord

__all__ = ["join_model_call_observations"]

_JOIN_GAPS: Final = frozenset({
    GapCode.MODEL_CALL_REFERENCE_AMBIGUOUS,
    GapCode.MODEL_CALL_REFERENCE_CONFLICT,
    GapCode.MODEL_CALL_REFERENCE_UNMATCHED,
})  # fmt: skip
_CAPTURE_PREFIX: Final = "capture:"
_MODEL_CALLS_PREFIX: Final = "model_calls:"
_Key = tuple[str, str, str]


def _stale(gap: ObservationGap) -> bool:
    """A gap an earlier join wrote, which this join writes again if it still holds.

    Besides upstream's (the reference gaps, and unowned captured calls: no invocation, detail
    ``capture:...``), a compaction's unowned call (detail ``model_calls:...``) is the join's
    too: kept, it would come back after the re-join's other gaps and change their order.
    """
    if gap.code in _JOIN_GAPS:
        return True
    if gap.code != GapCode.MODEL_CALL_OWNERSHIP_UNAVAILABLE:
        return False
    detail = gap.detail or ""
    return (gap.invocation_id is None and detail.startswith(_CAPTURE_PREFIX)) or detail.startswith(
        _MODEL_CALLS_PREFIX
    )


def _call_label(call: ModelCallRecord) -> str:
    return call.model_call_id or call.response_id or "unknown"


class _Join:
    """One join: the call indexes, who owns which call (by position), and the gaps found."""

    def __init__(self, calls: Sequence[ModelCallRecord]) -> None:
        self.calls = list(calls)
        self.by_id: dict[str, list[int]] = defaultdict(list)
        self.by_key: dict[_Key, list[int]] = defaultdict(list)
        for position, call in enumerate(self.calls):
            if call.model_call_id is not None:
                self.by_id[call.model_call_id].append(position)
            if call.model_ref is not None and call.response_id is not None:
                key = (call.model_ref.type, call.model_ref.name, call.response_id)
                self.by_key[key].append(position)
        self.owner: dict[int, str] = {}
        self.gaps: list[ObservationGap] = []

    def candidates(self, ref: ModelCallRef) -> list[int]:
        if ref.model_call_id:
            found = self.by_id.get(ref.model_call_id, [])
            if ref.model_ref is not None:
                wanted = (ref.model_ref.type, ref.model_ref.name)
                found = [p for p in found if self._server(p) == wanted]
            if ref.response_id is not None:
                found = [p for p in found if self.calls[p].response_id == ref.response_id]
            return found
        if ref.model_ref is None or ref.response_id is None:
            return []  # a valid reference never lands here
        return self.by_key.get((ref.model_ref.type, ref.model_ref.name, ref.response_id), [])

    def _server(self, position: int) -> tuple[str, str] | None:
        ref = self.calls[position].model_ref
        return None if ref is None else (ref.type, ref.name)

    def gap(self, code: GapCode, invocation_id: str | None, detail: str) -> None:
        self.gaps.append(ObservationGap(code=code, invocation_id=invocation_id, detail=detail))

    def unresolved(self, found: list[int], invocation_id: str, detail: str) -> None:
        code = GapCode.MODEL_CALL_REFERENCE_UNMATCHED
        if found:
            code = GapCode.MODEL_CALL_REFERENCE_AMBIGUOUS
        self.gap(code, invocation_id, detail)

    def invocation(self, invocation: AgentInvocation) -> AgentInvocation:
        refs: list[ModelCallRef] = []
        for ref in invocation.model_calls:
            found = self.candidates(ref)
            if len(found) != 1:
                self.unresolved(found, invocation.invocation_id, ref.label())
                refs.append(ref)
            elif found[0] in self.owner:
                call = self.calls[found[0]]
                self.gap(GapCode.MODEL_CALL_REFERENCE_CONFLICT, invocation.invocation_id,
                         _call_label(call))  # fmt: skip
                refs.append(ref)
            else:
                self.owner[found[0]] = invocation.invocation_id
                refs.append(canonical_ref(self.calls[found[0]]))
        return invocation.model_copy(update={"model_calls": refs})

    def compaction(self, compaction: ContextCompaction) -> ContextCompaction:
        owner_id = compaction.invocation_id
        refs: list[ModelCallRef] = []
        for ref in compaction.model_calls:
            found = self.candidates(ref)
            if len(found) != 1:
                self.unresolved(found, owner_id, f"{_MODEL_CALLS_PREFIX}{ref.label()}")
                refs.append(ref)
                continue
            owner, label = self.owner.get(found[0]), _call_label(self.calls[found[0]])
            if owner == owner_id:
                refs.append(canonical_ref(self.calls[found[0]]))
                continue
            code = GapCode.MODEL_CALL_OWNERSHIP_UNAVAILABLE
            if owner is not None:
                code = GapCode.MODEL_CALL_REFERENCE_CONFLICT
            self.gap(code, owner_id, f"{_MODEL_CALLS_PREFIX}{label}")
            refs.append(ref)
        update: dict[str, object] = {"model_calls": refs}
        for field in ("before_model_call", "after_model_call"):
            ref = getattr(compaction, field)
            if ref is not None:
                update[field] = self.boundary(ref, owner_id, field)
        return compaction.model_copy(update=update)

    def boundary(self, ref: ModelCallRef, owner_id: str, field: str) -> ModelCallRef:
        """A compaction's before/after call: unowned is fine, another invocation's is not."""
        found = self.candidates(ref)
        if len(found) != 1:
            self.unresolved(found, owner_id, f"{field}:{ref.label()}")
            return ref
        owner = self.owner.get(found[0])
        if owner is not None and owner != owner_id:
            label = _call_label(self.calls[found[0]])
            self.gap(GapCode.MODEL_CALL_REFERENCE_CONFLICT, owner_id, f"{field}:{label}")
            return ref
        return canonical_ref(self.calls[found[0]])

    def unowned(self) -> None:
        for position, call in enumerate(self.calls):
            if position not in self.owner:
                detail = f"{_CAPTURE_PREFIX}{_call_label(call)}:call_index={call.call_index}"
                self.gap(GapCode.MODEL_CALL_OWNERSHIP_UNAVAILABLE, None, detail)


def join_model_call_observations(
    bundle: AgentObservationBundle, calls: Sequence[ModelCallRecord]
) -> AgentObservationBundle:
    """The bundle with its model-call references resolved against ``calls``, and its gaps.

    ``bundle`` is not modified. Invocations claim calls first (in record order), then
    compactions are checked against that ownership.

    Example:
        >>> joined = join_model_call_observations(bundle, attachment.calls)  # doctest: +SKIP
        >>> [g.code for g in joined.gaps]  # doctest: +SKIP
        ['model_call_ownership_unavailable']
    """
    join = _Join(calls)
    records: list[ObservationRecord] = []
    for record in bundle.records:
        records.append(join.invocation(record) if isinstance(record, AgentInvocation) else record)
    for position, record in enumerate(records):
        if isinstance(record, ContextCompaction):
            records[position] = join.compaction(record)
    join.unowned()
    kept = [gap for gap in bundle.gaps if not _stale(gap)]
    return bundle.model_copy(update={"records": records, "gaps": dedupe_gaps([*kept, *join.gaps])})
