"""The gate-to-worker contract: which call to capture, and what it continues (``ng_capture``).

* :class:`CaptureAdmission` — sent on the engine-bound request. A ``text`` admission is a root;
  a ``token_in`` admission continues a staged parent and names the parent's call id, length
  (``prev_len``), chain hash and chain of staging keys (or carries the prefix inline).
* :class:`GenerationCutContinuation` — checkpoint/restore only: a cut generation the worker
  continues instead of regenerating.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, Self

from pydantic import Field, StrictInt, StrictStr, model_validator

from capture_core.staging._base import (
    CaptureMode,
    DigestHex,
    Identifier,
    NonNegativeInt,
    PositiveInt,
    StagingModel,
    staging_rules,
)
from capture_core.staging.errors import InvalidStagedCallError

__all__ = ["CAPTURE_ADMISSION_KEY", "CaptureAdmission", "GenerationCutContinuation"]

CAPTURE_ADMISSION_KEY: Final = "ng_capture"
"""Top-level key of a vLLM request body (``offload_params.ng_capture`` for Megatron)."""


class GenerationCutContinuation(StagingModel):
    """A cut generation, restored from a checkpoint, that the worker continues.

    ``staging_keys`` are the rows that hold the cut prefix (at least one, no repeats);
    ``terminal_stop_reason`` may only be set together with ``terminal_finish_reason``.
    """

    source_capture_key: Identifier
    source_model_call_id: Identifier
    staging_keys: Annotated[tuple[Identifier, ...], Field(min_length=1)]
    prefix_token_count: NonNegativeInt
    prefix_digest: DigestHex
    effective_output_limit: PositiveInt
    terminal_finish_reason: Literal["stop", "length"] | None = None
    terminal_stop_reason: StrictStr | StrictInt | None = None

    @model_validator(mode="after")
    def _check_cut(self) -> Self:
        with staging_rules():
            self._check_terminal()
        return self

    def _check_terminal(self) -> None:
        if len(set(self.staging_keys)) != len(self.staging_keys):
            raise InvalidStagedCallError("staging_keys", "must not repeat a key")
        if self.terminal_stop_reason is not None and self.terminal_finish_reason is None:
            raise InvalidStagedCallError("terminal_stop_reason", "requires terminal_finish_reason")


class CaptureAdmission(StagingModel):
    """Admission of one model call to token capture, as the gate sends it to the worker.

    Rules: ``token_in`` needs ``parent_call_id``, ``prev_len > 0`` and ``parent_chain_hash``,
    and, when ``staging_chain`` is empty, an inline prefix of exactly ``prev_len`` ids; ``text``
    has no parent, ``prev_len == 0``, no prefix, no chain and no chain hash.

    Example:
        >>> admission = CaptureAdmission(rollout_id="r1", model_call_id="c1", mode="text")
        >>> admission.mode, admission.prev_len
        (<CaptureMode.TEXT: 'text'>, 0)
    """

    rollout_id: Identifier
    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    prev_len: NonNegativeInt = 0
    mode: CaptureMode
    required_prefix_token_ids: list[NonNegativeInt] = Field(default_factory=list)
    staging_chain: list[Identifier] = Field(default_factory=list)
    parent_chain_hash: DigestHex | None = None
    generation_cut: GenerationCutContinuation | None = None

    @model_validator(mode="after")
    def _check_mode(self) -> Self:
        with staging_rules():
            if self.mode is CaptureMode.TOKEN_IN:
                self._check_continuation()
            else:
                self._check_root()
        return self

    def _check_continuation(self) -> None:
        missing = [
            name
            for name, value in (
                ("parent_call_id", self.parent_call_id),
                ("parent_chain_hash", self.parent_chain_hash),
            )
            if value is None
        ]
        if missing:
            raise InvalidStagedCallError("mode", f"'token_in' requires {', '.join(missing)}")
        if self.prev_len == 0:
            raise InvalidStagedCallError("prev_len", "must be > 0 for mode 'token_in'")
        prefix_len = len(self.required_prefix_token_ids)
        if not self.staging_chain and prefix_len != self.prev_len:
            raise InvalidStagedCallError(
                "required_prefix_token_ids",
                f"must hold prev_len ({self.prev_len}) ids when staging_chain is empty, "
                f"got {prefix_len}",
            )

    def _check_root(self) -> None:
        present = [
            name
            for name, value in (
                ("parent_call_id", self.parent_call_id is not None),
                ("required_prefix_token_ids", bool(self.required_prefix_token_ids)),
                ("staging_chain", bool(self.staging_chain)),
                ("parent_chain_hash", self.parent_chain_hash is not None),
            )
            if value
        ]
        if present:
            raise InvalidStagedCallError("mode", f"'text' carries no {', '.join(present)}")
        if self.prev_len != 0:
            raise InvalidStagedCallError(
                "prev_len", f"must be 0 for mode 'text', got {self.prev_len}"
            )
