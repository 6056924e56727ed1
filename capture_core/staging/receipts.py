"""Receipt assembly: the framework's verdict on a rollout's manifest.

:func:`build_receipt` reads the manifest a model server returned for one rollout and decides
whether the rollout can train and from which terminal call. It never raises for a damaged or
foreign manifest: whatever it is given, it answers with a :class:`ReceiptOutcome` whose
``problems`` say what was wrong.

How a manifest is judged, first verdict wins:

1. A failure row poisons the rollout (its own reason becomes ``failure_reason``), except
   ``request_finished_without_staged_coordinates``, which only records a call that never
   committed.
2. Every row is validated on its own with :class:`CallRecord` (and :class:`ManifestFailure`).
   A row that does not validate, including one with a column this version does not know (a
   newer writer), masks the rollout with ``invalid_manifest_row``; so does a damaged envelope.
3. Rows that repeat a ``model_call_id`` fold when identical; differing ones mask the rollout
   with ``duplicate_call_id``.
4. The terminal call is chosen by the strongest witness that decides: the declared call id,
   then the served response id, then the heuristic walk of the call tree. A declared id with
   no row masks (``missing_declared_terminal_row``) and never falls back. Two witnesses that
   name different calls both abstain. A heuristic that cannot decide masks with its result
   (``no_records``, ``orphaned_row``, ``no_root``, ``ambiguous_terminal``).

The trail of witness outcomes is joined with ``","`` into ``terminal_attribution_reason``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import ValidationError

from capture_core.exceptions import quote_value
from capture_core.staging._base import TerminalSelection
from capture_core.staging.manifest import (
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    RolloutReceipt,
)
from capture_core.staging.reasons import (
    NON_POISONING_FAILURE_REASONS,
    AttributionReason,
    ReceiptFailureReason,
    TerminalSelectionResult,
)

__all__ = ["ReceiptOutcome", "build_receipt"]

_ROW_LISTS = ("records", "failures")


@dataclass(frozen=True, slots=True)
class ReceiptOutcome:
    """What :func:`build_receipt` decided about one manifest.

    Attributes:
        receipt: the receipt, or ``None`` when the manifest does not even name a valid
            ``rollout_id`` (the rollout is then masked).
        masked: the rollout must not train (``receipt.capture_poisoned``, or no receipt).
        reason: why it is masked (``None`` when it is not): a ledger failure reason, a
            :class:`ReceiptFailureReason` or a :class:`TerminalSelectionResult`.
        problems: every defect found, in words, in manifest order.
    """

    receipt: RolloutReceipt | None
    masked: bool
    reason: str | None
    problems: tuple[str, ...] = ()


@dataclass(slots=True)
class _Reading:
    """A manifest read row by row: the rows that validated and what went wrong."""

    rollout_id: str | None = None
    records: list[CallRecord] = field(default_factory=list)
    failures: list[ManifestFailure] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    invalid: bool = False

    def flag(self, where: str, problem: str) -> None:
        self.invalid = True
        self.problems.append(f"{where}: {problem}")


class _Selection(NamedTuple):
    terminal: str | None
    selection: TerminalSelection | None
    failure: str | None
    trail: list[str]


def build_receipt(
    manifest: RolloutManifest | Mapping[str, Any] | bytes,
    *,
    declared_terminal_call_id: str | None = None,
    terminal_response_id: str | None = None,
) -> ReceiptOutcome:
    """Judge a rollout's manifest and assemble its receipt; never raises.

    Args:
        manifest: the manifest route's body, as a model, a decoded JSON object or JSON bytes.
        declared_terminal_call_id: the ``model_call_id`` the agent declared as its final call.
            It must name a committed row: if it does not, the rollout is masked.
        terminal_response_id: the id of the response the agent returned; it selects the row
            whose ``response_id`` it is.

    Returns:
        A :class:`ReceiptOutcome`; ``masked`` is false only for a receipt that names a
        terminal call and how it was chosen.

    Example:
        >>> from capture_core.staging import build_staged_call_record
        >>> record = build_staged_call_record(
        ...     rollout_id="r1", model_call_id="c1", prompt_token_ids=[1, 2, 3],
        ...     generated_token_ids=[4, 5], generated_logprobs=[-0.5, -0.25], weight_version=7,
        ... )
        >>> row = record.model_dump(
        ...     include={"model_call_id", "prev_len", "delta_len", "cum_len", "weight_version",
        ...              "digest", "extras_digest", "mode", "chain_hash", "cumulative_hash"},
        ... )
        >>> manifest = {"rollout_id": "r1", "records": [
        ...     {**row, "staging_key": "r1/c1", "response_id": "resp-1"}]}
        >>> outcome = build_receipt(manifest, terminal_response_id="resp-1")
        >>> outcome.masked, outcome.receipt.terminal_model_call_id
        (False, 'c1')
        >>> outcome.receipt.terminal_selection
        <TerminalSelection.RESPONSE_ID: 'response_id'>
        >>> build_receipt({"rollout_id": "r1", "records": [{**row, "shard": 2}]}).reason
        'invalid_manifest_row'
    """
    reading = _read(manifest)
    records, conflicts = _fold_duplicates(reading.records)
    for call_id in conflicts:
        reading.problems.append(
            f"records: differing rows share model_call_id {quote_value(call_id)}"
        )
    poison = next(
        (f.reason for f in reading.failures if f.reason not in NON_POISONING_FAILURE_REASONS),
        None,
    )
    if reading.invalid:
        # The rows cannot be trusted, so no terminal is chosen; the selection keeps its default.
        selection = _Selection(None, TerminalSelection.HEURISTIC, None, [])
        reason: str | None = ReceiptFailureReason.INVALID_MANIFEST_ROW
    elif conflicts:
        selection = _Selection(None, None, TerminalSelectionResult.DUPLICATE_CALL_ID, [])
        reason = selection.failure
    else:
        selection = _select(records, declared_terminal_call_id, terminal_response_id)
        reason = selection.failure
    failure = poison or reason
    # A plain string: a poisoning reason comes from the ledger and need not be a known code.
    reason = None if failure is None else str(failure)
    problems = tuple(reading.problems)
    if reading.rollout_id is None:
        return ReceiptOutcome(None, True, ReceiptFailureReason.INVALID_MANIFEST_ROW, problems)
    receipt = RolloutReceipt(
        rollout_id=reading.rollout_id,
        terminal_model_call_id=selection.terminal,
        manifest=records,
        capture_poisoned=reason is not None,
        failure_reason=reason,
        terminal_selection=selection.selection,
        terminal_attribution_reason=",".join(selection.trail) or None,
    )
    return ReceiptOutcome(receipt, reason is not None, reason, problems)


# --- Reading ----------------------------------------------------------------------------------


def _read(manifest: object) -> _Reading:
    """Validate the envelope, then each record and failure on its own."""
    reading = _Reading()
    if isinstance(manifest, RolloutManifest):
        reading.rollout_id = manifest.rollout_id
        raw_records: list[object] = list(manifest.records)
        raw_failures: list[object] = list(manifest.failures)
    else:
        body = _decode(manifest, reading)
        if body is None:
            return reading
        raw_records = _row_list(body, "records", reading)
        raw_failures = _row_list(body, "failures", reading)
        _read_envelope(body, reading)
    for index, raw in enumerate(raw_records):
        try:
            reading.records.append(CallRecord.model_validate(raw))
        except ValidationError as error:
            reading.flag(f"records[{index}]", _describe(error))
    for index, raw in enumerate(raw_failures):
        try:
            reading.failures.append(ManifestFailure.model_validate(raw))
        except ValidationError as error:
            reading.flag(f"failures[{index}]", _describe(error))
    return reading


def _decode(manifest: object, reading: _Reading) -> dict[object, object] | None:
    if isinstance(manifest, bytes | bytearray | memoryview):
        try:
            manifest = json.loads(bytes(manifest))
        except (ValueError, RecursionError) as error:
            reading.flag("manifest", f"is not JSON ({type(error).__name__})")
            return None
    if not isinstance(manifest, Mapping):
        reading.flag("manifest", f"must be a JSON object, got {type(manifest).__name__}")
        return None
    return dict(manifest)


def _row_list(body: dict[object, object], key: str, reading: _Reading) -> list[object]:
    rows = body.get(key, [])
    if isinstance(rows, list):
        return rows
    reading.flag(key, f"must be a list, got {type(rows).__name__}")
    return []


def _read_envelope(body: dict[object, object], reading: _Reading) -> None:
    """The manifest's own fields, validated with its row lists left out."""
    envelope = {key: value for key, value in body.items() if key not in _ROW_LISTS}
    try:
        reading.rollout_id = RolloutManifest.model_validate(envelope).rollout_id
    except ValidationError as error:
        reading.flag("manifest", _describe(error))
        rollout_id = body.get("rollout_id")
        if isinstance(rollout_id, str) and rollout_id:
            reading.rollout_id = rollout_id


def _describe(error: ValidationError) -> str:
    """The first error of a validation failure, without echoing the (possibly huge) input."""
    errors = error.errors(include_url=False, include_input=False)
    first = errors[0]
    where = "".join(f"{part}: " for part in first["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}{first['msg']}{more}"


def _fold_duplicates(rows: list[CallRecord]) -> tuple[list[CallRecord], list[str]]:
    """Keep the first row of each ``model_call_id``; name the ids repeated with other values."""
    kept: dict[str, CallRecord] = {}
    conflicts: list[str] = []
    for row in rows:
        first = kept.setdefault(row.model_call_id, row)
        if first != row and row.model_call_id not in conflicts:
            conflicts.append(row.model_call_id)
    return list(kept.values()), conflicts


# --- Terminal selection ------------------------------------------------------------------------


def _select(rows: list[CallRecord], declared: object, response_id: object) -> _Selection:
    """Witnesses first (declared, then response id), then the heuristic walk."""
    trail: list[str] = []
    witnesses: list[tuple[TerminalSelection, str]] = []
    if declared is not None:
        if not any(row.model_call_id == declared for row in rows):
            trail.append(AttributionReason.DECLARED_TERMINAL_NOT_CAPTURED)
            return _Selection(None, None, ReceiptFailureReason.MISSING_DECLARED_TERMINAL_ROW, trail)
        witnesses.append((TerminalSelection.DECLARED, str(declared)))
    if response_id is not None:
        found = _by_response_id(rows, response_id, trail)
        if found is not None:
            witnesses.append((TerminalSelection.RESPONSE_ID, found))
    named = {call_id for _, call_id in witnesses}
    if len(named) == 1:
        if len(witnesses) > 1:
            trail.append("corroborated_by=" + "+".join(method for method, _ in witnesses))
        return _Selection(named.pop(), witnesses[0][0], None, trail)
    if witnesses:
        claims = ";".join(f"{method}={call_id}" for method, call_id in witnesses)
        trail.append(f"witness_disagreement[{claims}]")
    result, terminal = _walk(rows)
    if terminal is None:
        return _Selection(None, None, result, trail)
    return _Selection(terminal, TerminalSelection.HEURISTIC, None, trail)


def _by_response_id(rows: list[CallRecord], response_id: object, trail: list[str]) -> str | None:
    if not isinstance(response_id, str) or not response_id:
        trail.append(AttributionReason.RESPONSE_HAS_NO_ID)
        return None
    matches = [row for row in rows if row.response_id == response_id]
    if not matches:
        trail.append(AttributionReason.RESPONSE_ID_NO_MATCH)
        return None
    chosen = _collapse(matches)
    if chosen is None:
        trail.append(AttributionReason.RESPONSE_ID_AMBIGUOUS)
        return None
    return chosen.model_call_id


def _walk(rows: Sequence[CallRecord]) -> tuple[TerminalSelectionResult, str | None]:
    """The heuristic: from the best root, follow the only live branch down to a leaf.

    The root is the one with children if any has them, then the earliest ``admitted_at``
    (unknown times last), then the first in the manifest. At a fork, childless children
    lose to children that have their own; what remains must be interchangeable rows.
    """
    if not rows:
        return TerminalSelectionResult.NO_RECORDS, None
    known = {row.model_call_id for row in rows}
    if any(row.parent_call_id is not None and row.parent_call_id not in known for row in rows):
        return TerminalSelectionResult.ORPHANED_ROW, None
    children: defaultdict[str | None, list[CallRecord]] = defaultdict(list)
    for row in rows:
        children[row.parent_call_id].append(row)
    roots = children[None]
    if not roots:
        return TerminalSelectionResult.NO_ROOT, None
    position = {row.model_call_id: index for index, row in enumerate(rows)}
    node = min(
        roots,
        key=lambda row: (
            not children[row.model_call_id],
            row.admitted_at is None,
            row.admitted_at or 0.0,
            position[row.model_call_id],
        ),
    )
    while branches := children[node.model_call_id]:
        live = [row for row in branches if children[row.model_call_id]] or branches
        chosen = _collapse(live)
        if chosen is None:
            return TerminalSelectionResult.AMBIGUOUS_TERMINAL, None
        node = chosen
    return TerminalSelectionResult.SELECTED, node.model_call_id


def _collapse(rows: Sequence[CallRecord]) -> CallRecord | None:
    """The smallest-id row when all rows end on the same tokens, else ``None``.

    Rows with the same ``(cumulative_hash, chain_hash, cum_len)`` are interchangeable: they
    train on the same sequence (a retried call, say).
    """
    if len({(row.cumulative_hash, row.chain_hash, row.cum_len) for row in rows}) != 1:
        return None
    return min(rows, key=lambda row: row.model_call_id)
