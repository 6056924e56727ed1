"""One rollout's token capture as the collector hands it over, step by step, on any source.

Each step is a function of one rollout, stateless and safe to run concurrently for different
rollouts: :func:`clear_token_captures_for_rollouts` before dispatch,
:func:`finalize_rollout_token_capture` after the rollout (freeze, then rebuild
``response.output`` or mask the result, writing ``_ng_token_capture`` and ``mask_sample`` on
it), and :func:`retire_rollout_token_capture` once the result is durable. The finalize and
retire steps are async and work on any :class:`TokenSource`; :class:`~.delivery.TokenDelivery`
runs them for a whole run, on one event loop of its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Final

from capture_core.ids import is_valid_rollout_id, validate_rollout_id
from capture_core.tokens.builders import DEFAULT_BUILDER
from capture_core.tokens.consumer import (
    SnapshotRef,
    TokenBuild,
    TokenCaptureMetrics,
    failed_build,
    trajectories_from_source,
)
from capture_core.tokens.protocols import TokenSource
from capture_core.tokens.store import TokenCaptureStore

__all__ = [
    "MASK_SAMPLE_KEY",
    "TOKEN_CAPTURE_KEY",
    "capture_build_can_retire",
    "clear_token_captures_for_rollouts",
    "finalize_rollout_token_capture",
    "retire_rollout_token_capture",
    "rollout_carries_token_ids",
]

logger = logging.getLogger("capture_core.tokens")

TOKEN_CAPTURE_KEY: Final = "_ng_token_capture"
"""Record key of the rollout's :class:`TokenCaptureMetrics` (as a JSON object)."""
MASK_SAMPLE_KEY: Final = "mask_sample"
"""Top-level record flag, present (``true``) only on a masked rollout."""


def rollout_carries_token_ids(result: Mapping[str, Any]) -> bool:
    """Whether ``result["response"]`` has an output item with non-empty
    ``generation_token_ids`` (an agent that returns its own token ids).

    Example:
        >>> rollout_carries_token_ids({"response": {"output": [{"generation_token_ids": [1]}]}})
        True
    """
    response = result.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    if not isinstance(output, list):
        return False
    return any(isinstance(item, Mapping) and item.get("generation_token_ids") for item in output)


def _unusable(result: MutableMapping[str, Any], build: TokenBuild) -> TokenBuild:
    result[MASK_SAMPLE_KEY] = True
    result[TOKEN_CAPTURE_KEY] = build.metrics.to_record()
    logger.warning(
        "rollout %s is marked for masking: %s", build.rollout_id, build.error or "unusable"
    )
    return build


async def finalize_rollout_token_capture(
    result: MutableMapping[str, Any],
    source: TokenSource | None,
    *,
    rollout_id: str | None,
    builder: str = DEFAULT_BUILDER,
) -> TokenBuild | None:
    """Freeze the rollout's capture and rebuild ``result["response"]["output"]`` from it.

    Never raises; changes ``result`` in place: only ``response.output`` is replaced (the reward
    and every other field stay), ``_ng_token_capture`` gets the build's metrics, and a masked
    rollout gets ``mask_sample: true`` (with a WARNING log naming why).

    * no source: ``None``, nothing changed;
    * a malformed ``rollout_id``: masked, ``"malformed rollout id: ..."``;
    * a result that already carries token ids: left as it is; the capture is frozen only so
      it can be retired (a *redundant* build), or ``None`` when there is no id or the freeze
      fails;
    * no id (``None``): masked, ``"no capture key"``;
    * a source that raises: masked with ``"<Type>: <message>"``, this rollout only.

    Returns:
        The build, or ``None`` as above.
    """
    if source is None:
        return None
    if rollout_id is not None and not is_valid_rollout_id(rollout_id):
        bad = failed_build(str(rollout_id)[:200], f"malformed rollout id: {rollout_id!r}")
        return _unusable(result, bad)
    if rollout_carries_token_ids(result):
        return await _redundant(source, rollout_id, builder)
    if rollout_id is None:
        return _unusable(result, failed_build("", "no capture key", builder=builder))
    response = result.get("response")
    model = response.get("model") if isinstance(response, Mapping) else None
    try:
        build = await trajectories_from_source(
            rollout_id, source, builder=builder, model=model if isinstance(model, str) else ""
        )
    except Exception as exc:  # one rollout's source failure masks that rollout only
        error = f"{type(exc).__name__}: {exc}"
        return _unusable(result, failed_build(rollout_id, error, builder=builder))
    if build.rebuilt_response is not None:
        if isinstance(response, MutableMapping):
            response["output"] = build.rebuilt_response["output"]
        else:
            result["response"] = build.rebuilt_response
    result[TOKEN_CAPTURE_KEY] = build.metrics.to_record()
    if build.mask_sample:
        result[MASK_SAMPLE_KEY] = True
        logger.warning(
            "rollout %s is marked for masking: %s", rollout_id, ", ".join(build.mask_reasons)
        )
    return build


async def _redundant(
    source: TokenSource, rollout_id: str | None, builder: str
) -> TokenBuild | None:
    if rollout_id is None:
        return None
    try:
        snapshot = await source.freeze(rollout_id)
    except Exception as exc:
        logger.warning("could not freeze the token capture of rollout %s: %s", rollout_id, exc)
        return None
    return TokenBuild(
        rollout_id,
        builder,
        None,
        False,
        TokenCaptureMetrics(n_calls=len(snapshot.entries)),
        snapshot=SnapshotRef(snapshot.snapshot_id, snapshot.version),
        redundant=True,
    )


def capture_build_can_retire(build: TokenBuild | None) -> bool:
    """Whether ``build`` may have its snapshot dropped: unmasked, rebuilt or redundant."""
    return build is not None and build.can_retire


async def retire_rollout_token_capture(
    rollout_id: str, source: TokenSource | None, build: TokenBuild | None
) -> bool:
    """Drop exactly the snapshot ``build`` came from; call it once the result is durable.

    Failed and masked builds keep their evidence (``False``); so does a rollout that changed
    after its freeze (the source refuses). Never raises: a failure is logged and gives
    ``False``.
    """
    if source is None or build is None or not build.can_retire:
        return False
    if build.snapshot is None:
        logger.warning("rollout %s has no token snapshot to retire", rollout_id)
        return False
    try:
        return await source.drop(
            rollout_id, snapshot_id=build.snapshot.snapshot_id, version=build.snapshot.version
        )
    except Exception as exc:
        logger.warning("could not retire the token capture of rollout %s: %s", rollout_id, exc)
        return False


def clear_token_captures_for_rollouts(
    rollout_ids: Sequence[str], dirs: Sequence[str | os.PathLike[str]]
) -> int:
    """Delete the token captures (and fences) of ``rollout_ids`` in every directory of
    ``dirs``, before they are dispatched again; a no-op without directories.

    Returns:
        How many rollouts had files removed.

    Raises:
        InvalidRolloutIdError: an id is malformed (checked before anything is deleted).
        CaptureDirNotFoundError: a directory does not exist (the collector never creates one:
            a path that differs from the model servers' fails here, before dispatch).
    """
    if isinstance(rollout_ids, str):
        raise TypeError("expected a sequence of rollout ids, got a single string")
    ids = [validate_rollout_id(rid) for rid in rollout_ids]
    removed = 0
    for directory in dirs:
        store = TokenCaptureStore(directory, create=False)
        removed += sum(store.delete(rid) for rid in ids)
    return removed
