"""Rebuilding a rollout's training row from its receipt and its staged snapshots.

:func:`verify_and_linearize` trusts nothing it is handed. It checks, in this order:

1. the receipt: supported versions, not poisoned, not empty, unique call ids and staging keys;
2. the call graph, from the terminal up to the root: every parent is in the manifest
   (``missing_parent``), no call is its own ancestor (``lineage_cycle``), and each child starts
   where its parent ends (``parent_length_mismatch``);
3. the snapshot set: one snapshot per manifest row (a sequence in manifest order, or a
   mapping keyed by staging key), each one parsed and re-validated so that its digest and
   extras digest are recomputed (``invalid_snapshot``, ``corrupt_digest``,
   ``unsupported_*``), belonging to its row (``snapshot_identity_mismatch``,
   ``snapshot_order_mismatch``, ``duplicate_snapshot``, ``wrong_rollout``) and agreeing with
   it field by field (``wrong_<field>``);
4. the linearization, root first: each chain hash recomputed from the verified parent's
   (``chain_hash_mismatch``), each mask a run of prompt carry then generation
   (``invalid_mask_order``, ``empty_generation``), and each call's cumulative hash equal to the
   hash of every token so far (``cumulative_hash_mismatch``).

The first failed check raises one :class:`VerificationError`; there is no partial result.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from pydantic import ValidationError

from capture_core.exceptions import quote_value
from capture_core.staging.digests import (
    DIGEST_VERSION,
    EXTRAS_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    compute_chain_hash,
    compute_cumulative_hash,
)
from capture_core.staging.errors import (
    DIGEST_MISMATCH_ERROR_TYPE,
    EXTRAS_DIGEST_MISMATCH_ERROR_TYPE,
    UNSUPPORTED_VERSION_ERROR_TYPE,
    VerificationError,
)
from capture_core.staging.manifest import CallRecord, RolloutReceipt
from capture_core.staging.reasons import VerificationCode, wrong_field_code
from capture_core.staging.records import StagedCallRecord, StagedCallSnapshot

__all__ = ["LinearizedRollout", "SnapshotInput", "VerificationError", "verify_and_linearize"]

SnapshotInput: TypeAlias = StagedCallSnapshot | StagedCallRecord | bytes
"""One staged row as a source returned it: a validated model, or its JSON bytes."""

_VERSION_CODES: Final = {
    "schema_version": (STAGING_SCHEMA_VERSION, VerificationCode.UNSUPPORTED_SCHEMA),
    "digest_version": (DIGEST_VERSION, VerificationCode.UNSUPPORTED_DIGEST),
    "extras_digest_version": (EXTRAS_DIGEST_VERSION, VerificationCode.UNSUPPORTED_EXTRAS_DIGEST),
}
_DIGEST_ERRORS: Final = frozenset({DIGEST_MISMATCH_ERROR_TYPE, EXTRAS_DIGEST_MISMATCH_ERROR_TYPE})
# Fields a manifest row shares with its snapshot, compared after the identity check.
_COMPARED_FIELDS: Final = (
    "parent_call_id",
    "mode",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
    "extras_digest",
    "chain_hash",
    "cumulative_hash",
)


@dataclass(frozen=True, slots=True)
class LinearizedRollout:
    """One rollout's training row, root call first.

    Attributes:
        rollout_id: the receipt's rollout.
        token_ids: every token of the terminal call's sequence.
        token_mask: 1.0 for each generated token, 0.0 for prompt carry.
        logprobs: the sampled log-probs as staged (float32 values), 0.0 under prompt carry.
        model_call_ids: the calls from the root to the terminal.
        weight_versions: each call's weight version, aligned with ``model_call_ids``.
        weight_version_spans: ``(weight_version, start, end)`` runs over token positions,
            ``end`` exclusive; consecutive calls with one version share a run.
        prompt_len: the root call's prompt length (its carried tokens).
    """

    rollout_id: str
    token_ids: tuple[int, ...]
    token_mask: tuple[float, ...]
    logprobs: tuple[float, ...]
    model_call_ids: tuple[str, ...]
    weight_versions: tuple[int, ...]
    weight_version_spans: tuple[tuple[int, int, int], ...]
    prompt_len: int


def verify_and_linearize(
    receipt: RolloutReceipt,
    snapshots: Mapping[str, SnapshotInput] | Sequence[SnapshotInput],
) -> LinearizedRollout:
    """Verify a receipt against its staged snapshots and rebuild its training row.

    Args:
        receipt: an unpoisoned receipt (see :func:`~capture_core.staging.build_receipt`).
        snapshots: one staged row per manifest row, either in manifest order (what
            ``StagingSource.fetch`` returns for the manifest's staging keys) or keyed by
            staging key. Each is a :class:`StagedCallSnapshot` (re-validated here) or its
            JSON bytes.

    Returns:
        The :class:`LinearizedRollout` of the terminal call's lineage.

    Raises:
        VerificationError: the first failed check, with its ``code`` and ``model_call_id``.

    Example:
        >>> from capture_core.staging import build_receipt, build_staged_call_record
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
        >>> receipt = build_receipt(manifest, declared_terminal_call_id="c1").receipt
        >>> row = verify_and_linearize(receipt, [record.model_dump_json().encode()])
        >>> row.token_ids, row.token_mask, row.prompt_len
        ((1, 2, 3, 4, 5), (0.0, 0.0, 0.0, 1.0, 1.0), 3)
        >>> row.weight_version_spans
        ((7, 0, 5),)
    """
    _check_receipt(receipt)
    lineage = _lineage(receipt)
    verified = _verified_snapshots(receipt, snapshots, lineage)
    return _linearize(receipt.rollout_id, lineage, verified)


def _fail(
    receipt: RolloutReceipt, code: str, detail: str, model_call_id: str | None = None
) -> VerificationError:
    return VerificationError(
        code, detail, rollout_id=receipt.rollout_id, model_call_id=model_call_id
    )


# --- The receipt and its call graph -------------------------------------------------------------


def _check_receipt(receipt: RolloutReceipt) -> None:
    for model, call_id in (
        (receipt, None),
        *((row, row.model_call_id) for row in receipt.manifest),
    ):
        for name, (current, code) in _VERSION_CODES.items():
            if getattr(model, name) != current:
                raise _fail(receipt, code, f"{name} {getattr(model, name)!r}", call_id)
    if receipt.capture_poisoned:
        raise _fail(
            receipt, VerificationCode.CAPTURE_POISONED, f"failure_reason {receipt.failure_reason}"
        )
    if not receipt.manifest:
        raise _fail(receipt, VerificationCode.EMPTY_MANIFEST, "the manifest has no rows")
    for code, attribute in (
        (VerificationCode.DUPLICATE_MANIFEST_ROW, "model_call_id"),
        (VerificationCode.DUPLICATE_STAGING_KEY, "staging_key"),
    ):
        seen: set[str] = set()
        for row in receipt.manifest:
            value = getattr(row, attribute)
            if value in seen:
                raise _fail(receipt, code, f"{attribute} {quote_value(value)}", row.model_call_id)
            seen.add(value)


def _lineage(receipt: RolloutReceipt) -> list[CallRecord]:
    """The rows from the root to the terminal: every link present, then every length aligned."""
    by_id = {row.model_call_id: row for row in receipt.manifest}
    terminal = receipt.terminal_model_call_id
    if terminal is None or terminal not in by_id:
        raise _fail(receipt, VerificationCode.MISSING_TERMINAL, "no terminal row in the manifest")
    lineage = [by_id[terminal]]
    visited = {terminal}
    while (parent_id := lineage[-1].parent_call_id) is not None:
        child = lineage[-1].model_call_id
        if parent_id not in by_id:
            detail = f"parent {quote_value(parent_id)} is not in the manifest"
            raise _fail(receipt, VerificationCode.MISSING_PARENT, detail, child)
        if parent_id in visited:
            detail = f"{quote_value(parent_id)} is its own ancestor"
            raise _fail(receipt, VerificationCode.LINEAGE_CYCLE, detail, child)
        lineage.append(by_id[parent_id])
        visited.add(parent_id)
    lineage.reverse()
    for parent, child_row in itertools.pairwise(lineage):
        if child_row.prev_len != parent.cum_len:
            detail = f"prev_len {child_row.prev_len} != parent cum_len {parent.cum_len}"
            code = VerificationCode.PARENT_LENGTH_MISMATCH
            raise _fail(receipt, code, detail, child_row.model_call_id)
    return lineage


# --- The snapshot set ---------------------------------------------------------------------------


def _verified_snapshots(
    receipt: RolloutReceipt,
    snapshots: Mapping[str, SnapshotInput] | Sequence[SnapshotInput],
    lineage: list[CallRecord],
) -> dict[str, StagedCallSnapshot]:
    """Each manifest row's snapshot, parsed, re-validated and compared with its row."""
    rows = receipt.manifest
    if isinstance(snapshots, Mapping):
        raw = _by_staging_key(receipt, snapshots, lineage)
    else:
        if len(snapshots) != len(rows):
            detail = f"{len(snapshots)} snapshots for {len(rows)} manifest rows"
            raise _fail(receipt, VerificationCode.ROW_COUNT_MISMATCH, detail)
        raw = list(snapshots)
    parsed = [_parse(receipt, item, row) for item, row in zip(raw, rows, strict=True)]
    seen: set[str] = set()
    for snapshot in parsed:
        if snapshot.model_call_id in seen:
            detail = "two snapshots of one call"
            raise _fail(
                receipt, VerificationCode.DUPLICATE_SNAPSHOT, detail, snapshot.model_call_id
            )
        seen.add(snapshot.model_call_id)
    known = {row.model_call_id for row in rows}
    in_order = not isinstance(snapshots, Mapping)
    for row, snapshot in zip(rows, parsed, strict=True):
        if snapshot.model_call_id != row.model_call_id:
            misplaced = in_order and snapshot.model_call_id in known
            code = (
                VerificationCode.SNAPSHOT_ORDER_MISMATCH
                if misplaced
                else VerificationCode.SNAPSHOT_IDENTITY_MISMATCH
            )
            detail = f"found the snapshot of {quote_value(snapshot.model_call_id)}"
            raise _fail(receipt, code, detail, row.model_call_id)
        _compare(receipt, row, snapshot)
    return {snapshot.model_call_id: snapshot for snapshot in parsed}


def _by_staging_key(
    receipt: RolloutReceipt, snapshots: Mapping[str, SnapshotInput], lineage: list[CallRecord]
) -> list[SnapshotInput]:
    """The snapshots in manifest order; a missing one is named by its row's role."""
    terminal = lineage[-1].model_call_id
    ancestors = {row.model_call_id for row in lineage[:-1]}
    ordered: list[SnapshotInput] = []
    for row in receipt.manifest:
        if row.staging_key in snapshots:
            ordered.append(snapshots[row.staging_key])
            continue
        if row.model_call_id == terminal:
            code = VerificationCode.MISSING_TERMINAL
        elif row.model_call_id in ancestors:
            code = VerificationCode.MISSING_PARENT
        else:
            code = VerificationCode.ROW_COUNT_MISMATCH
        detail = f"no snapshot under staging key {quote_value(row.staging_key)}"
        raise _fail(receipt, code, detail, row.model_call_id)
    if len(snapshots) != len(ordered):
        detail = f"{len(snapshots)} snapshots for {len(ordered)} manifest rows"
        raise _fail(receipt, VerificationCode.ROW_COUNT_MISMATCH, detail)
    return ordered


def _parse(receipt: RolloutReceipt, item: object, row: CallRecord) -> StagedCallSnapshot:
    """Validate a snapshot from scratch, so its digests are recomputed from its content."""
    try:
        if isinstance(item, bytes | bytearray | memoryview):
            return StagedCallSnapshot.model_validate_json(bytes(item))
        if isinstance(item, StagedCallRecord):
            return StagedCallSnapshot.model_validate(item.model_dump())
    except ValidationError as error:
        code, detail = _classify(error)
        raise _fail(receipt, code, detail, row.model_call_id) from None
    detail = f"expected a StagedCallSnapshot or JSON bytes, got {type(item).__name__}"
    raise _fail(receipt, VerificationCode.INVALID_SNAPSHOT, detail, row.model_call_id)


def _classify(error: ValidationError) -> tuple[str, str]:
    """A newer or older version, content that disagrees with its digest, or any other defect."""
    errors = error.errors(include_url=False, include_input=False)
    for entry in errors:
        name = entry["loc"][0] if entry["loc"] else ""
        if entry["type"] == UNSUPPORTED_VERSION_ERROR_TYPE and name in _VERSION_CODES:
            return _VERSION_CODES[str(name)][1], entry["msg"]
    if {entry["type"] for entry in errors} <= _DIGEST_ERRORS:
        return VerificationCode.CORRUPT_DIGEST, errors[0]["msg"]
    where = ".".join(str(part) for part in errors[0]["loc"]) or "snapshot"
    return VerificationCode.INVALID_SNAPSHOT, f"{where}: {errors[0]['msg']}"


def _compare(receipt: RolloutReceipt, row: CallRecord, snapshot: StagedCallSnapshot) -> None:
    expected_rollout = row.capture_key or receipt.rollout_id
    if snapshot.rollout_id != expected_rollout:
        detail = f"staged under {quote_value(snapshot.rollout_id)}, expected {expected_rollout!a}"
        raise _fail(receipt, VerificationCode.WRONG_ROLLOUT, detail, row.model_call_id)
    for name in _COMPARED_FIELDS:
        expected, found = getattr(row, name), getattr(snapshot, name)
        if expected != found:
            detail = f"manifest has {expected!r}, snapshot has {found!r}"
            raise _fail(receipt, wrong_field_code(name), detail, row.model_call_id)


# --- Linearization ------------------------------------------------------------------------------


def _linearize(
    rollout_id: str, lineage: list[CallRecord], snapshots: dict[str, StagedCallSnapshot]
) -> LinearizedRollout:
    token_ids: list[int] = []
    token_mask: list[float] = []
    logprobs: list[float] = []
    spans: list[tuple[int, int, int]] = []
    parent_chain_hash: str | None = None
    prompt_len = 0
    for row in lineage:
        call = snapshots[row.model_call_id]
        token_ids += call.token_ids_delta
        fault = _call_fault(call, parent_chain_hash, token_ids)
        if fault is not None:
            raise VerificationError(*fault, rollout_id=rollout_id, model_call_id=row.model_call_id)
        if not token_mask:
            prompt_len = call.token_mask_delta.index(1.0)
        token_mask += call.token_mask_delta
        logprobs += call.generation_log_probs_delta
        if spans and spans[-1][0] == call.weight_version:
            spans[-1] = (call.weight_version, spans[-1][1], call.cum_len)
        else:
            spans.append((call.weight_version, call.prev_len, call.cum_len))
        parent_chain_hash = call.chain_hash
    return LinearizedRollout(
        rollout_id=rollout_id,
        token_ids=tuple(token_ids),
        token_mask=tuple(token_mask),
        logprobs=_float32(logprobs),
        model_call_ids=tuple(row.model_call_id for row in lineage),
        weight_versions=tuple(row.weight_version for row in lineage),
        weight_version_spans=tuple(spans),
        prompt_len=prompt_len,
    )


def _call_fault(
    call: StagedCallSnapshot, parent_chain_hash: str | None, token_ids: list[int]
) -> tuple[VerificationCode, str] | None:
    """Why a call cannot extend the verified row (``token_ids`` already ends with its delta)."""
    if compute_chain_hash(parent_chain_hash, call.token_ids_delta) != call.chain_hash:
        return VerificationCode.CHAIN_HASH_MISMATCH, "the delta does not extend the parent's chain"
    mask = call.token_mask_delta
    if 1.0 not in mask:
        return VerificationCode.EMPTY_GENERATION, "the call generated no token"
    if 0.0 in mask[mask.index(1.0) :]:
        return VerificationCode.INVALID_MASK_ORDER, "prompt carry after generated tokens"
    if compute_cumulative_hash(token_ids) != call.cumulative_hash:
        return VerificationCode.CUMULATIVE_HASH_MISMATCH, "the tokens so far hash otherwise"
    return None


def _float32(values: list[float]) -> tuple[float, ...]:
    """Each value rounded to float32, as the digest hashed it."""
    count = len(values)
    return struct.unpack(f">{count}f", struct.pack(f">{count}f", *values))
