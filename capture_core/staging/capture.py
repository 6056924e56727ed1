"""Worker-side token capture: stage each admitted call's tokens and answer with coordinates.

The inference worker wraps every admitted call (``ng_capture`` on the request) in a
:class:`RolloutTokenCapture`::

    call = capture.begin_call(admission, prefix_token_ids=prefix)   # before generating
    ...generate...
    coords = capture.complete_call(call, prompt_token_ids=..., generated_token_ids=...,
                                   generated_logprobs=...)           # or fail_call(...)
    response["ng_commit_coords"] = coords.model_dump(mode="json")

``complete_call`` builds the call's :class:`~capture_core.staging.StagedCallRecord`, stages it
through the sink (with the framework's ``attachments`` when given) and returns ``staged``
coordinates once the sink made the row durable. Whatever is wrong with the call's data or the
sink's write comes back as valid ``capture_failed`` coordinates, with the reason logged and kept
on the call; only the caller's own mistakes raise (see each method).

Attachments are opaque: they are handed to the sink unchanged and never enter the record, its
extras or any digest, so the coordinates are the same with and without them. The ``attachments``
keyword reaches the sink only when the caller gave a mapping, so a :class:`TextOnlyStagingSink`
keeps working for text-only calls; given attachments it fails with ``TypeError``, which is
reported as ``capture_failed`` and never retried without them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, cast

from capture_core.exceptions import quote_value
from capture_core.staging._prefix import prefix_mismatch, resolve_prefix
from capture_core.staging.admission import CaptureAdmission
from capture_core.staging.build import build_staged_call_record
from capture_core.staging.errors import (
    CallAlreadyCompletedError,
    InvalidPrefixError,
    InvalidStagedCallError,
    StagingError,
    StreamingUnsupportedError,
    UnsupportedAdmissionError,
)
from capture_core.staging.pending_call import PendingCall
from capture_core.staging.reasons import CaptureFailureReason
from capture_core.staging.records import CommitCoords, StagedCallRecord, StageResult
from capture_core.staging.sinks import (
    Attachments,
    CaptureAdapter,
    InvalidAttachmentError,
    StagingSink,
    TextOnlyStagingSink,
)

__all__ = [
    "CallAlreadyCompletedError",
    "CaptureFailureReason",
    "InvalidPrefixError",
    "PendingCall",
    "RolloutTokenCapture",
    "UnsupportedAdmissionError",
]

logger = logging.getLogger(__name__)

_U64_LIMIT: Final = 1 << 64
_MAX_DETAIL: Final = 300
_STREAMING_UNSUPPORTED: Final = (
    "streaming unsupported: token capture needs the whole engine response; use buffered SSE "
    "(the server streams to the client after capture) or non-streaming backend requests"
)


class RolloutTokenCapture:
    """Stages the tokens of admitted calls through a sink and returns their coordinates.

    Args:
        sink: where rows are staged. A :class:`TextOnlyStagingSink` works for calls without
            attachments.
        weight_version_fn: the policy's current weight version, read at ``begin_call``.
        adapter: reads token fields from engine responses, for ``complete_call_from_response``.

    Raises:
        TypeError: ``sink`` has no ``stage`` method or ``weight_version_fn`` is not callable.

    Example:
        >>> from capture_core.staging import CaptureAdmission
        >>> from capture_core.testing.staging import InMemoryStagingSink
        >>> capture = RolloutTokenCapture(sink=InMemoryStagingSink(), weight_version_fn=lambda: 7)
        >>> call = capture.begin_call(
        ...     CaptureAdmission(rollout_id="r1", model_call_id="c1", mode="text"))
        >>> coords = capture.complete_call(
        ...     call, prompt_token_ids=[1, 2, 3], generated_token_ids=[4, 5],
        ...     generated_logprobs=[-0.5, -0.25])
        >>> coords.disposition.value, coords.staging_key, coords.cum_len
        ('staged', 'r1/c1', 5)
    """

    def __init__(
        self,
        *,
        sink: StagingSink | TextOnlyStagingSink,
        weight_version_fn: Callable[[], int],
        adapter: CaptureAdapter | None = None,
    ) -> None:
        if not callable(getattr(sink, "stage", None)):
            raise TypeError(f"sink must have a stage() method, got {type(sink).__name__}")
        if not callable(weight_version_fn):
            raise TypeError("weight_version_fn must be callable")
        self._sink = sink
        self._weight_version_fn = weight_version_fn
        self._adapter = adapter
        self._lock = threading.Lock()

    @property
    def adapter(self) -> CaptureAdapter | None:
        return self._adapter

    def begin_call(
        self,
        admission: CaptureAdmission,
        *,
        prefix_token_ids: Sequence[int] | None = None,
        stream: bool = False,
        weight_version: int | None = None,
    ) -> PendingCall:
        """Start capturing an admitted call, before the engine generates.

        Args:
            admission: the call's ``ng_capture`` admission.
            prefix_token_ids: for a ``token_in`` call whose admission names a
                ``staging_chain``, the chain's staged deltas concatenated (``prev_len`` ids);
                otherwise optional, and if given it must equal the admission's inline prefix.
            stream: whether the engine request streams; token capture does not support it.
            weight_version: the policy weight version; defaults to ``weight_version_fn()``.

        Raises:
            TypeError: ``admission`` is not a ``CaptureAdmission``.
            StreamingUnsupportedError: ``stream`` is true.
            UnsupportedAdmissionError: the admission continues a checkpoint generation cut.
            InvalidPrefixError: a prefix that is missing, not ``prev_len`` token ids, or not the
                inline prefix.
            InvalidStagedCallError: a weight version that is not an int in ``[0, 2**64)``.
        """
        if not isinstance(admission, CaptureAdmission):
            raise TypeError(
                f"begin_call() takes a CaptureAdmission, got {type(admission).__name__}"
            )
        if stream:
            raise StreamingUnsupportedError(_STREAMING_UNSUPPORTED)
        if admission.generation_cut is not None:
            raise UnsupportedAdmissionError(
                f"model call {quote_value(admission.model_call_id)} continues a generation cut, "
                "which this worker does not capture"
            )
        prefix = resolve_prefix(admission, prefix_token_ids)
        version = self._weight_version_fn() if weight_version is None else weight_version
        if type(version) is not int or not 0 <= version < _U64_LIMIT:
            raise InvalidStagedCallError(
                "weight_version", f"must be an int in [0, 2**64), got {version!r}"
            )
        return PendingCall(admission, prefix, version)

    def complete_call(
        self,
        call: PendingCall,
        *,
        prompt_token_ids: Sequence[int],
        generated_token_ids: Sequence[int],
        generated_logprobs: Sequence[float],
        extras: dict[str, Any] | None = None,
        attachments: Attachments | None = None,
    ) -> CommitCoords:
        """Stage a call's tokens and return its coordinates.

        Token ids must be ints in ``[0, 2**64)``; log-probs floats (ints are taken as floats),
        finite in float32, one per generated id. Anything else, a prompt that does not start
        with the call's prefix, or a sink that fails, gives ``capture_failed`` coordinates.

        Args:
            call: from :meth:`begin_call`.
            prompt_token_ids: the whole prompt the engine saw (the prefix first).
            generated_token_ids: the sampled ids.
            generated_logprobs: their log-probs.
            extras: JSON extras staged with the call (covered by its extras digest).
            attachments: opaque bytes staged in the same write, by name; never digested.

        Raises:
            TypeError: ``call`` is not a ``PendingCall``, or ``attachments`` is not a mapping.
            CallAlreadyCompletedError: the call was already completed or failed.
        """
        _check_attachments_argument(attachments)
        self._claim(call)
        admission = call.admission
        try:
            prompt = list(prompt_token_ids)
            mismatch = prefix_mismatch(call.prefix_token_ids, prompt)
        except (TypeError, ValueError) as exc:
            return self._failed(call, CaptureFailureReason.INVALID_CAPTURE_DATA, str(exc))
        if mismatch is not None:
            return self._failed(call, CaptureFailureReason.PREFIX_MISMATCH, mismatch)
        try:
            record = build_staged_call_record(
                rollout_id=admission.rollout_id,
                model_call_id=admission.model_call_id,
                parent_call_id=admission.parent_call_id,
                parent_chain_hash=admission.parent_chain_hash,
                prev_len=admission.prev_len,
                prompt_token_ids=prompt,
                generated_token_ids=list(generated_token_ids),
                generated_logprobs=[_as_logprob(value) for value in generated_logprobs],
                weight_version=call.weight_version,
                extras=extras,
            )
        except (TypeError, ValueError, OverflowError) as exc:
            return self._failed(call, CaptureFailureReason.INVALID_CAPTURE_DATA, str(exc))
        return self._stage(call, record, attachments)

    def complete_call_from_response(
        self,
        call: PendingCall,
        payload: Mapping[str, Any],
        *,
        attachments: Attachments | None = None,
    ) -> CommitCoords:
        """Read the call's tokens from the engine response with the adapter, then stage them.

        An adapter that cannot read the response gives ``capture_failed`` coordinates.

        Raises:
            StagingError: the capture has no adapter.
            TypeError: ``call`` is not a ``PendingCall``, or ``attachments`` is not a mapping.
            CallAlreadyCompletedError: the call was already completed or failed.
        """
        if self._adapter is None:
            raise StagingError("complete_call_from_response() needs a CaptureAdapter")
        _check_attachments_argument(attachments)
        _check_pending(call)
        try:
            prompt = self._adapter.extract_prompt_ids(payload)
            generated, logprobs = self._adapter.extract_generation(payload)
            extras = self._adapter.extract_extras(payload)
        except Exception as exc:  # adapters read untrusted payloads: any failure is data
            self._claim(call)
            return self._failed(call, CaptureFailureReason.EXTRACTION_FAILED, repr(exc))
        return self.complete_call(
            call,
            prompt_token_ids=prompt,
            generated_token_ids=generated,
            generated_logprobs=logprobs,
            extras=extras,
            attachments=attachments,
        )

    def fail_call(self, call: PendingCall, *, reason: str) -> CommitCoords:
        """End a call without staging it (the engine failed, the request was cut...).

        Raises:
            TypeError: ``call`` is not a ``PendingCall``, or ``reason`` not a non-empty str.
            CallAlreadyCompletedError: the call was already completed or failed.
        """
        if type(reason) is not str or not reason:
            raise TypeError("fail_call() needs a non-empty str reason")
        self._claim(call)
        return self._failed(call, reason, "failed by the worker", level=logging.INFO)

    # --- internals ----------------------------------------------------------------------

    def _claim(self, call: PendingCall) -> None:
        """Take the call's one completion, atomically."""
        _check_call(call)
        with self._lock:
            if call._claimed:
                raise CallAlreadyCompletedError(call.model_call_id)
            call._claimed = True

    def _stage(
        self, call: PendingCall, record: StagedCallRecord, attachments: Attachments | None
    ) -> CommitCoords:
        reason = CaptureFailureReason.SINK_ERROR
        try:
            if attachments is None:
                result = self._sink.stage(record)
            else:
                # A text-only sink raises TypeError here: reported below, never retried.
                result = cast(StagingSink, self._sink).stage(record, attachments=attachments)
        except TypeError as exc:
            if attachments is not None:
                reason = CaptureFailureReason.SINK_REFUSED_ATTACHMENTS
            return self._failed(call, reason, repr(exc), exc_info=True)
        except Exception as exc:  # a sink is pluggable code; its failure is capture_failed
            return self._failed(call, reason, repr(exc), exc_info=True)
        if not isinstance(result, StageResult):
            detail = f"stage() returned {type(result).__name__}, not a StageResult"
            return self._failed(call, CaptureFailureReason.SINK_INVALID_RESULT, detail)
        if not result.ok:
            return self._failed(call, CaptureFailureReason.SINK_REJECTED, str(result.error))
        try:
            coords = CommitCoords.for_staged(record, staging_key=cast(str, result.staging_key))
        except ValueError as exc:
            return self._failed(call, CaptureFailureReason.SINK_INVALID_RESULT, str(exc))
        call._coords = coords
        return coords

    def _failed(
        self,
        call: PendingCall,
        reason: str,
        detail: str,
        *,
        level: int = logging.WARNING,
        exc_info: bool = False,
    ) -> CommitCoords:
        admission = call.admission
        coords = CommitCoords.for_failure(
            rollout_id=admission.rollout_id,
            model_call_id=admission.model_call_id,
            parent_call_id=admission.parent_call_id,
            prev_len=admission.prev_len,
            weight_version=call.weight_version,
        )
        call._coords = coords
        call._failure_reason = reason
        if len(detail) > _MAX_DETAIL:
            detail = f"{detail[:_MAX_DETAIL]}... ({len(detail)} characters)"
        logger.log(
            level,
            "token capture failed for rollout %s call %s (%s): %s",
            quote_value(admission.rollout_id),
            quote_value(admission.model_call_id),
            reason,
            detail,
            exc_info=exc_info,
        )
        return coords


def _check_call(call: object) -> PendingCall:
    if not isinstance(call, PendingCall):
        raise TypeError(f"expected a PendingCall from begin_call(), got {type(call).__name__}")
    return call


def _check_pending(call: object) -> None:
    """Refuse a completed call early (``_claim`` makes the check atomic later)."""
    pending = _check_call(call)
    if pending._claimed:
        raise CallAlreadyCompletedError(pending.model_call_id)


def _check_attachments_argument(attachments: object) -> None:
    if attachments is not None and not isinstance(attachments, Mapping):
        raise InvalidAttachmentError(
            None, f"must be a mapping of name to bytes or None, got {type(attachments).__name__}"
        )


def _as_logprob(value: float) -> float:
    """An exact int log-prob becomes a float (``OverflowError`` if too big); others unchanged.

    Anything but a float is then refused by the staging rules, as ``capture_failed``.
    """
    return float(value) if type(value) is int else value
