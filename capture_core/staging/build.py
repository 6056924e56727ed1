"""Building a call's staged row from the engine's prompt and generation.

A call's *delta* is what it adds to its parent's tokens: the prompt after the parent's
``prev_len`` tokens (mask 0.0, logprob 0.0) followed by the generated tokens (mask 1.0, their
logprobs). :func:`build_staged_call_record` turns a prompt and generation into a complete,
validated :class:`~capture_core.staging.StagedCallRecord` with its four hashes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from capture_core.staging.digests import (
    compute_chain_hash,
    compute_cumulative_hash,
    compute_extras_digest,
    compute_staged_call_digest,
)
from capture_core.staging.errors import InvalidStagedCallError
from capture_core.staging.records import StagedCallRecord

__all__ = [
    "StagingDelta",
    "build_staged_call_record",
    "build_staging_delta",
    "default_staging_key",
]


class StagingDelta(NamedTuple):
    """The three aligned token columns a call stages."""

    token_ids: list[int]
    token_mask: list[float]
    logprobs: list[float]


def build_staging_delta(
    prompt_token_ids: Sequence[int],
    generated_token_ids: Sequence[int],
    generated_logprobs: Sequence[float],
    *,
    prev_len: int,
) -> StagingDelta:
    """Split a call's prompt at ``prev_len`` and append its generation.

    Args:
        prompt_token_ids: the full prompt the engine saw (parent tokens first).
        generated_token_ids: the sampled tokens.
        generated_logprobs: one logprob per sampled token.
        prev_len: how many leading prompt tokens the parent already staged (0 for a root).

    Raises:
        InvalidStagedCallError: ``prev_len`` outside ``[0, len(prompt)]``, a logprob count that
            differs from the generated token count, or an empty delta.

    Example:
        >>> build_staging_delta([1, 2, 3, 4, 5, 6, 7], [8], [-1.0], prev_len=5)
        StagingDelta(token_ids=[6, 7, 8], token_mask=[0.0, 0.0, 1.0], logprobs=[0.0, 0.0, -1.0])
    """
    if type(prev_len) is not int or not 0 <= prev_len <= len(prompt_token_ids):
        raise InvalidStagedCallError(
            "prev_len",
            f"must be an int in [0, len(prompt) = {len(prompt_token_ids)}], got {prev_len!r}",
        )
    if len(generated_token_ids) != len(generated_logprobs):
        raise InvalidStagedCallError(
            "generated_logprobs",
            f"must hold one logprob per generated token ({len(generated_token_ids)}), "
            f"got {len(generated_logprobs)}",
        )
    carried = list(prompt_token_ids[prev_len:])
    if not carried and not generated_token_ids:
        raise InvalidStagedCallError("token_ids_delta", "the call adds no tokens")
    return StagingDelta(
        token_ids=carried + list(generated_token_ids),
        token_mask=[0.0] * len(carried) + [1.0] * len(generated_token_ids),
        logprobs=[0.0] * len(carried) + list(generated_logprobs),
    )


def build_staged_call_record(
    *,
    rollout_id: str,
    model_call_id: str,
    prompt_token_ids: Sequence[int],
    generated_token_ids: Sequence[int],
    generated_logprobs: Sequence[float],
    weight_version: int,
    parent_call_id: str | None = None,
    parent_chain_hash: str | None = None,
    prev_len: int = 0,
    extras: dict[str, object] | None = None,
) -> StagedCallRecord:
    """Build and validate the staged row of one call.

    A root passes neither ``parent_call_id`` nor ``parent_chain_hash`` (mode ``text``); a
    continuation passes both and ``prev_len > 0`` (mode ``token_in``). The caller checks that
    ``prompt_token_ids[:prev_len]`` are the parent's tokens: the cumulative hash is taken over
    ``prompt_token_ids + generated_token_ids``. Logprobs must be floats (ints are refused).

    Raises:
        InvalidStagedCallError: a broken staging rule (also a ``ValueError``).
        pydantic.ValidationError: a field of the wrong type (also a ``ValueError``).

    Example:
        >>> record = build_staged_call_record(
        ...     rollout_id="r1", model_call_id="c1", prompt_token_ids=[1, 2, 3],
        ...     generated_token_ids=[4, 5], generated_logprobs=[-0.5, -0.25], weight_version=7,
        ... )
        >>> record.digest[:8], record.token_mask_delta
        ('aa38dcdd', [0.0, 0.0, 0.0, 1.0, 1.0])
    """
    if (parent_call_id is None) != (parent_chain_hash is None):
        raise InvalidStagedCallError(
            "parent_chain_hash", "must be given exactly when parent_call_id is"
        )
    mode = "text" if parent_call_id is None else "token_in"
    delta = build_staging_delta(
        prompt_token_ids, generated_token_ids, generated_logprobs, prev_len=prev_len
    )
    chain_hash = compute_chain_hash(parent_chain_hash, delta.token_ids)
    cumulative_hash = compute_cumulative_hash([*prompt_token_ids, *generated_token_ids])
    extras_digest = compute_extras_digest(extras)
    fields: dict[str, Any] = {
        "rollout_id": rollout_id,
        "model_call_id": model_call_id,
        "parent_call_id": parent_call_id,
        "mode": mode,
        "prev_len": prev_len,
        "delta_len": len(delta.token_ids),
        "cum_len": prev_len + len(delta.token_ids),
        "weight_version": weight_version,
        "token_ids_delta": delta.token_ids,
        "token_mask_delta": delta.token_mask,
        "generation_log_probs_delta": delta.logprobs,
        "extras_digest": extras_digest,
        "chain_hash": chain_hash,
        "cumulative_hash": cumulative_hash,
    }
    digest = compute_staged_call_digest(**fields)
    return StagedCallRecord.model_validate({**fields, "digest": digest, "extras": extras})


def default_staging_key(rollout_id: str, model_call_id: str) -> str:
    """The conventional staging key ``"<rollout_id>/<model_call_id>"``.

    Keys are opaque: the key a sink returns in its ``StageResult`` is the one to use.

    Example:
        >>> default_staging_key("r1", "c2")
        'r1/c2'
    """
    for field, value in (("rollout_id", rollout_id), ("model_call_id", model_call_id)):
        if type(value) is not str or not value:
            raise InvalidStagedCallError(field, "must be a non-empty string")
    return f"{rollout_id}/{model_call_id}"
