"""The scope keys the middleware sets for the training gate, and the header naming a call."""

from __future__ import annotations

from typing import Final

__all__ = ["MODEL_CALL_ID_HEADER", "MODEL_CALL_ID_KEY", "TRAINING_ROUTE_KEY"]

TRAINING_ROUTE_KEY: Final = "ngcapture.training_rollout"
"""Scope key the middleware sets to the rollout id of a valid training-capture request."""
MODEL_CALL_ID_KEY: Final = "ngcapture.model_call_id"
"""Scope key the middleware sets to the id of the call it captures (its capture line's id)."""
MODEL_CALL_ID_HEADER: Final = b"x-ng-model-call-id"
