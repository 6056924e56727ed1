"""Token-id capture in the collector: open the run's :class:`~capture_core.tokens.TokenDelivery`.

With a ``token_id_capture`` config enabled, every rollout of the run takes part (the collector
runs one agent, which calls the training-capture route). Around each rollout the collector
then: deletes the ids' earlier token captures before dispatch (``prepare``); after the rollout
freezes its capture and rebuilds ``response.output`` with token ids, or marks it
``mask_sample`` (``finalize``); writes the line (flushed and fsynced); drops exactly the frozen
snapshot (``retire``); and aborts the run once too many finalized rollouts are masked
(``check_mask_fraction``). Failed rollouts are not finalized: they are not training samples,
and their capture stays as evidence.
"""

from __future__ import annotations

from typing import Any

from capture_core.collect.attempts import CollectError
from capture_core.exceptions import CaptureDirNotFoundError
from capture_core.tokens import TokenDelivery, TokenIdCaptureConfig

__all__ = ["open_token_delivery", "token_capture_on", "token_delivery_summary"]


def token_capture_on(config: TokenIdCaptureConfig | None) -> bool:
    """Whether the run's rollouts take part in token-id capture."""
    return config is not None and config.token_id_capture.enabled


def open_token_delivery(config: TokenIdCaptureConfig | None) -> TokenDelivery | None:
    """The run's delivery, or ``None`` when token-id capture is off; refuses before anything
    is dispatched or touched.

    Raises:
        CollectError: the token store's directory does not exist (the capture server creates
            it: start it with the same config), or rebuilding is on without a source.
    """
    if not token_capture_on(config):
        return None
    assert config is not None
    try:
        delivery = TokenDelivery(config)
    except CaptureDirNotFoundError as exc:
        raise CollectError(
            f"token capture directory {exc.path} does not exist: the capture server creates it "
            "when it starts with the same token_id_capture config; pass the same directory "
            "to both"
        ) from exc
    if delivery.active and delivery.source is None:
        delivery.close()
        raise CollectError(
            "token_id_capture.rebuild_response needs a token source in the collector: give "
            "the block a dir (or model_call_capture_dir), install a source, or set "
            "rebuild_response to false"
        )
    return delivery


def token_delivery_summary(delivery: TokenDelivery | None) -> dict[str, Any] | None:
    """What the run's delivery did, JSON-ready (``None`` when token capture was off)."""
    if delivery is None:
        return None
    s = delivery.summary()
    return {
        "finalized": s.finalized,
        "masked": s.masked,
        "retired": s.retired,
        "kept": s.kept,
        "masked_fraction": None if s.masked_fraction is None else round(s.masked_fraction, 6),
        "reasons": dict(sorted(s.reasons.items())),
    }
