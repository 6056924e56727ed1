"""The base of every observation and trajectory model: strict, as upstream's are."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel"]


class StrictModel(BaseModel):
    """Unknown keys are refused, assignments are validated, NaN and infinities are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
