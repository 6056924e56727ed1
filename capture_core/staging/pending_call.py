"""PendingCall: one admitted call of ``RolloutTokenCapture``, from ``begin_call`` to its answer.

The handle ``begin_call`` returns and ``complete_call``, ``complete_call_from_response`` and
``fail_call`` take: what the call was admitted with and, once it was answered, its coordinates
and why it failed. The capture that made it sets its private state (the call's one completion
is claimed under the capture's lock).
"""

from __future__ import annotations

from capture_core.staging.admission import CaptureAdmission
from capture_core.staging.records import CommitCoords

__all__ = ["PendingCall"]


class PendingCall:
    """One admitted call between ``begin_call`` and its completion.

    Attributes:
        admission: the call's admission.
        prefix_token_ids: the staged tokens the call continues (empty for a root).
        weight_version: the policy weight version stamped at ``begin_call``.
    """

    __slots__ = ("_claimed", "_coords", "_failure_reason", "admission", "prefix_token_ids",
                 "weight_version")  # fmt: skip

    def __init__(
        self, admission: CaptureAdmission, prefix_token_ids: tuple[int, ...], weight_version: int
    ) -> None:
        self.admission = admission
        self.prefix_token_ids = prefix_token_ids
        self.weight_version = weight_version
        self._claimed = False
        self._coords: CommitCoords | None = None
        self._failure_reason: str | None = None

    def __repr__(self) -> str:
        state = self._coords.disposition.value if self._coords else "pending"
        return f"PendingCall({self.admission.model_call_id!r}, {state})"

    @property
    def rollout_id(self) -> str:
        return self.admission.rollout_id

    @property
    def model_call_id(self) -> str:
        return self.admission.model_call_id

    @property
    def coords(self) -> CommitCoords | None:
        """The coordinates the call was answered with, once it was completed or failed."""
        return self._coords

    @property
    def failure_reason(self) -> str | None:
        """Why the call ended ``capture_failed`` (a :class:`CaptureFailureReason` or the
        reason given to ``fail_call``); ``None`` while pending or when staged."""
        return self._failure_reason
