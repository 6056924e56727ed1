"""References from agent-side evidence to captured model calls.

An agent cannot see the ``model_call_id`` the capture server mints (capture never changes what
a client receives), so a :class:`ModelCallRef` may name a call either by that id or by the pair
(model server, protocol ``response_id``) that the agent does see.
"""

from __future__ import annotations

from typing import Final

from pydantic import model_validator

from capture_core.observations._model import StrictModel
from capture_core.records import DEFAULT_MODEL_REF_TYPE, ModelCallRecord

__all__ = ["ModelCallRef", "ModelServerRef", "canonical_ref"]

_INCOMPLETE: Final = "model_call_id or both model_ref and response_id are required"


class ModelServerRef(StrictModel):
    """Which model server answered: ``{"type": "responses_api_models", "name": ...}``."""

    type: str = DEFAULT_MODEL_REF_TYPE
    name: str


class ModelCallRef(StrictModel):
    """One model call as an agent names it: its ``model_call_id``, or model server + response id.

    Example:
        >>> ModelCallRef(model_ref={"name": "policy_model"}, response_id="resp_1").response_id
        'resp_1'
    """

    model_call_id: str | None = None
    model_ref: ModelServerRef | None = None
    response_id: str | None = None

    @model_validator(mode="after")
    def _joinable(self) -> ModelCallRef:
        if not self.model_call_id and not (self.model_ref is not None and self.response_id):
            raise ValueError(_INCOMPLETE)
        return self

    def label(self) -> str:
        """What a gap's detail names the reference by: its call id, else its response id."""
        return self.model_call_id or self.response_id or "unknown"


def canonical_ref(call: ModelCallRecord) -> ModelCallRef:
    """The reference that names ``call`` exactly: its id, model server and response id.

    Raises:
        ValueError: the call has neither a ``model_call_id`` nor a model server and response
            id, so nothing could name it.
    """
    model_ref = None
    if call.model_ref is not None:
        model_ref = ModelServerRef(type=call.model_ref.type, name=call.model_ref.name)
    return ModelCallRef(
        model_call_id=call.model_call_id, model_ref=model_ref, response_id=call.response_id
    )
