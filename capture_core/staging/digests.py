"""The staging digests, byte-exact and versioned.

Four SHA-256 hashes, each over an ASCII domain tag followed by a canonical encoding, all
returned as 64 lowercase hex characters:

* :func:`compute_extras_digest` (extras digest v1) — a typed, tagged encoding of the call's
  JSON extras: ``None``/bool/int/float/str/list/dict each carry a one-letter tag, ints are
  signed 64-bit, floats binary64, dict keys sorted by their UTF-8 bytes. ``1`` and ``1.0``
  differ.
* :func:`compute_cumulative_hash` — the whole token sequence a call ends with.
* :func:`compute_chain_hash` — the call's own token delta, chained to its parent's chain hash.
* :func:`compute_staged_call_digest` (staged-call digest v2) — the versions, identity, lengths,
  weight version and the three token columns (masks and log-probs as big-endian float32 bit
  patterns, so ``-0.0`` and ``0.0`` differ), then the extras digest, chain hash and cumulative
  hash as raw 32-byte values.

Integers in lengths and token ids are unsigned 64-bit big-endian; strings and columns carry a
64-bit length prefix. Every function checks its input first and raises
:class:`~capture_core.staging.errors.InvalidStagedCallError` (a ``ValueError``) naming the field
rather than hash something the other side would refuse.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

from capture_core.staging import _encoding as enc
from capture_core.staging import _rules as rules
from capture_core.staging.errors import InvalidStagedCallError

__all__ = [
    "DIGEST_VERSION",
    "EMPTY_EXTRAS_DIGEST",
    "EXTRAS_DIGEST_VERSION",
    "STAGING_SCHEMA_VERSION",
    "compute_chain_hash",
    "compute_cumulative_hash",
    "compute_extras_digest",
    "compute_staged_call_digest",
]

STAGING_SCHEMA_VERSION: Final = 3
"""Version of the staging wire models; also byte 0 of the staged-call digest."""
DIGEST_VERSION: Final = 2
"""Layout version of the staged-call digest."""
EXTRAS_DIGEST_VERSION: Final = 1
"""Layout version of the extras digest."""
EMPTY_EXTRAS_DIGEST: Final = "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6"
"""The extras digest of a call without extras (``extras=None``)."""

_EXTRAS_DOMAIN: Final = b"nemo-gym-staging-extras-v1"
_CUMULATIVE_DOMAIN: Final = b"nemo-gym-staging-prefix-v2"
_CHAIN_DOMAIN: Final = b"nemo-gym-staging-chain-v1"
_CALL_DOMAIN: Final = b"nemo-gym-staging-call-v2"
_PRESENT: Final = b"\x01"
_LENGTH_FIELDS: Final = ("prev_len", "delta_len", "cum_len", "weight_version")


def compute_extras_digest(extras: dict[str, object] | None) -> str:
    """Digest a call's extras (a JSON object, or ``None`` for none).

    Args:
        extras: ``None`` or a ``dict`` with str keys whose values are exactly ``None``, bool,
            int (signed 64-bit), finite float, str, list or dict. Tuples, bytes, numpy scalars,
            NaN and infinity are refused.

    Returns:
        The extras digest, 64 lowercase hex characters.

    Raises:
        InvalidStagedCallError: a value that has no canonical encoding.

    Example:
        >>> compute_extras_digest(None) == EMPTY_EXTRAS_DIGEST
        True
    """
    if extras is not None and type(extras) is not dict:
        raise InvalidStagedCallError(
            "extras", f"must be a dict or None, got {type(extras).__name__}"
        )
    encoded = enc.extras_value(extras, "extras")
    return hashlib.sha256(_EXTRAS_DOMAIN + bytes([EXTRAS_DIGEST_VERSION]) + encoded).hexdigest()


def compute_cumulative_hash(token_ids: Sequence[int]) -> str:
    """Hash a whole token sequence: the prompt plus the generation a call ends with.

    For a continuation this equals the hash of the parent's tokens followed by the call's delta.

    Example:
        >>> compute_cumulative_hash([1, 2, 3, 4, 5])[:8]
        '9901d8eb'
    """
    return hashlib.sha256(_CUMULATIVE_DOMAIN + enc.token_list(token_ids, "token_ids")).hexdigest()


def compute_chain_hash(parent_chain_hash: str | None, token_ids_delta: Sequence[int]) -> str:
    """Chain a call's own token delta onto its parent's chain hash (``None`` for a root).

    Example:
        >>> root = compute_chain_hash(None, [1, 2, 3, 4, 5])
        >>> root[:8], compute_chain_hash(root, [6, 7, 8])[:8]
        ('cd7963a2', 'fba381ed')
    """
    if parent_chain_hash is None:
        parent = b"\x00"
    else:
        parent = _PRESENT + enc.raw_digest(parent_chain_hash, "parent_chain_hash")
    delta = enc.token_list(token_ids_delta, "token_ids_delta")
    return hashlib.sha256(_CHAIN_DOMAIN + parent + delta).hexdigest()


def compute_staged_call_digest(
    *,
    rollout_id: str,
    model_call_id: str,
    parent_call_id: str | None,
    mode: str,
    prev_len: int,
    delta_len: int,
    cum_len: int,
    weight_version: int,
    token_ids_delta: Sequence[int],
    token_mask_delta: Sequence[float],
    generation_log_probs_delta: Sequence[float],
    extras_digest: str,
    chain_hash: str,
    cumulative_hash: str,
    schema_version: int = STAGING_SCHEMA_VERSION,
    digest_version: int = DIGEST_VERSION,
    extras_digest_version: int = EXTRAS_DIGEST_VERSION,
) -> str:
    """The staged-call digest (v2) of one call's staged row.

    Enforces every rule a staged row must meet before hashing: supported versions, non-empty
    ids, root ⇔ ``text`` ⇔ ``prev_len == 0``, ``0 < delta_len == len(token_ids_delta)``, equal
    column lengths, masks of 0.0/1.0 with a 0.0 logprob under every 0.0 mask, and
    ``cum_len == prev_len + delta_len``.

    Raises:
        InvalidStagedCallError: the first broken rule, naming its field.

    Example:
        >>> digest = compute_staged_call_digest(
        ...     rollout_id="r1", model_call_id="c1", parent_call_id=None, mode="text",
        ...     prev_len=0, delta_len=2, cum_len=2, weight_version=0,
        ...     token_ids_delta=[1, 2], token_mask_delta=[0.0, 1.0],
        ...     generation_log_probs_delta=[0.0, -0.5], extras_digest=EMPTY_EXTRAS_DIGEST,
        ...     chain_hash=compute_chain_hash(None, [1, 2]),
        ...     cumulative_hash=compute_cumulative_hash([1, 2]),
        ... )
        >>> len(digest)
        64
    """
    rules.check_version("schema_version", schema_version, STAGING_SCHEMA_VERSION)
    rules.check_version("digest_version", digest_version, DIGEST_VERSION)
    rules.check_version("extras_digest_version", extras_digest_version, EXTRAS_DIGEST_VERSION)
    rules.check_identifier("rollout_id", rollout_id)
    rules.check_identifier("model_call_id", model_call_id)
    rules.check_identifier("parent_call_id", parent_call_id, optional=True)
    for field, value in (
        ("prev_len", prev_len),
        ("delta_len", delta_len),
        ("cum_len", cum_len),
        ("weight_version", weight_version),
    ):
        enc.u64(value, field)
    plain_mode = rules.check_mode(parent_call_id, mode)
    rules.check_parent(parent_call_id, prev_len)
    rules.check_staged_delta_len(delta_len)
    rules.check_columns(delta_len, token_ids_delta, token_mask_delta, generation_log_probs_delta)
    rules.check_lengths(prev_len, delta_len, cum_len)
    payload = _encode_staged_call(
        versions=(schema_version, digest_version, extras_digest_version),
        rollout_id=rollout_id,
        model_call_id=model_call_id,
        parent_call_id=parent_call_id,
        mode=plain_mode,
        lengths=(prev_len, delta_len, cum_len, weight_version),
        columns=(token_ids_delta, token_mask_delta, generation_log_probs_delta),
        hashes=(extras_digest, chain_hash, cumulative_hash),
    )
    return hashlib.sha256(_CALL_DOMAIN + payload).hexdigest()


def _encode_staged_call(
    *,
    versions: tuple[int, int, int],
    rollout_id: str,
    model_call_id: str,
    parent_call_id: str | None,
    mode: str,
    lengths: tuple[int, int, int, int],
    columns: tuple[Sequence[int], Sequence[float], Sequence[float]],
    hashes: tuple[str, str, str],
) -> bytes:
    """The v2 payload after the domain tag; checks encodability only, not the row's rules."""
    token_ids, token_mask, logprobs = columns
    extras_digest, chain_hash, cumulative_hash = hashes
    parts = [
        bytes(versions),
        enc.text(rollout_id, "rollout_id"),
        enc.text(model_call_id, "model_call_id"),
        enc.optional_text(parent_call_id, "parent_call_id"),
        enc.text(mode, "mode"),
        *(enc.u64(n, name) for n, name in zip(lengths, _LENGTH_FIELDS, strict=True)),
        enc.length_prefixed(enc.token_list(token_ids, "token_ids_delta")),
        enc.length_prefixed(enc.float32_list(token_mask, "token_mask_delta")),
        enc.length_prefixed(enc.float32_list(logprobs, "generation_log_probs_delta")),
        enc.raw_digest(extras_digest, "extras_digest"),
        _PRESENT + enc.raw_digest(chain_hash, "chain_hash"),
        _PRESENT + enc.raw_digest(cumulative_hash, "cumulative_hash"),
    ]
    return b"".join(parts)
