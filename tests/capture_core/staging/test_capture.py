"""RolloutTokenCapture: staging calls, the attachments contract, and what raises versus fails."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from capture_core.staging import (
    CallAlreadyCompletedError,
    CaptureAdmission,
    CaptureFailureReason,
    CommitCoords,
    Disposition,
    FilesystemStagingSink,
    InvalidAttachmentError,
    InvalidPrefixError,
    InvalidStagedCallError,
    PendingCall,
    RolloutTokenCapture,
    StagedCallRecord,
    StageResult,
    StagingError,
    StreamingUnsupportedError,
    UnsupportedAdmissionError,
    build_staged_call_record,
)
from capture_core.testing.staging import InMemoryStagingSink, LegacyStagingSink
from tests.capture_core.staging.examples import generation_cut_json

PROMPT = [1, 2, 3]
GENERATED = [4, 5]
LOGPROBS = [-0.5, -0.25]
EXTRAS: dict[str, Any] = {"routed_experts": "nrlre1:int8:5x1x1:AAECAwQ="}
PIXELS = {"media_imgs": b"\x00\x01" * 64, "media_imgs_sizes": b"\x10\x10"}


def root_admission(call: str = "c1") -> CaptureAdmission:
    return CaptureAdmission(rollout_id="r1", model_call_id=call, mode="text")


def child_admission(parent: StagedCallRecord, *, chain: bool = False) -> CaptureAdmission:
    prefix = [*PROMPT, *GENERATED]
    return CaptureAdmission(
        rollout_id="r1",
        model_call_id="c2",
        parent_call_id=parent.model_call_id,
        prev_len=parent.cum_len,
        mode="token_in",
        required_prefix_token_ids=[] if chain else prefix,
        staging_chain=["r1/c1"] if chain else [],
        parent_chain_hash=parent.chain_hash,
    )


def root_record() -> StagedCallRecord:
    return build_staged_call_record(
        rollout_id="r1",
        model_call_id="c1",
        prompt_token_ids=PROMPT,
        generated_token_ids=GENERATED,
        generated_logprobs=LOGPROBS,
        weight_version=7,
    )


def capture_for(sink: Any, **kwargs: Any) -> RolloutTokenCapture:
    return RolloutTokenCapture(sink=sink, weight_version_fn=lambda: 7, **kwargs)


def complete(capture: RolloutTokenCapture, call: PendingCall, **kwargs: Any) -> CommitCoords:
    values: dict[str, Any] = {
        "prompt_token_ids": PROMPT,
        "generated_token_ids": GENERATED,
        "generated_logprobs": LOGPROBS,
    }
    return capture.complete_call(call, **{**values, **kwargs})


def assert_failed(coords: CommitCoords, call: PendingCall, reason: str) -> None:
    assert coords.disposition is Disposition.CAPTURE_FAILED
    assert coords.delta_len == 0 and coords.cum_len == coords.prev_len
    assert call.failure_reason == reason
    assert call.coords == coords
    CommitCoords.model_validate(coords.model_dump())


class RecordingSink:
    """A sink that answers with a fixed result (or raises) and records how it was called."""

    def __init__(self, answer: Any = None, error: BaseException | None = None) -> None:
        self.answer = answer
        self.error = error
        self.calls: list[tuple[StagedCallRecord, dict[str, Any]]] = []

    def stage(self, record: StagedCallRecord, **kwargs: Any) -> Any:
        self.calls.append((record, kwargs))
        if self.error is not None:
            raise self.error
        return self.answer or StageResult(ok=True, staging_key=f"custom:{record.model_call_id}")


# --- staging ------------------------------------------------------------------------------


def test_a_root_call_is_staged() -> None:
    sink = InMemoryStagingSink()
    capture = capture_for(sink)
    call = capture.begin_call(root_admission())
    coords = complete(capture, call)
    assert coords == CommitCoords.for_staged(root_record(), staging_key="r1/c1")
    assert call.coords == coords and call.failure_reason is None
    assert sink.fetch(["r1/c1"])[0].model_dump() == root_record().model_dump()


def test_the_sinks_key_is_authoritative() -> None:
    capture = capture_for(RecordingSink())
    coords = complete(capture, capture.begin_call(root_admission()))
    assert coords.staging_key == "custom:c1"


@pytest.mark.parametrize("chain", [False, True])
def test_a_continuation_carries_its_parent_prefix(chain: bool) -> None:
    sink = InMemoryStagingSink()
    capture = capture_for(sink)
    parent = root_record()
    prefix = [*PROMPT, *GENERATED] if chain else None
    call = capture.begin_call(child_admission(parent, chain=chain), prefix_token_ids=prefix)
    assert call.prefix_token_ids == (1, 2, 3, 4, 5)
    coords = complete(
        capture, call, prompt_token_ids=[1, 2, 3, 4, 5, 6, 7], generated_token_ids=[8],
        generated_logprobs=[-1.0],
    )  # fmt: skip
    expected = build_staged_call_record(
        rollout_id="r1", model_call_id="c2", parent_call_id="c1",
        parent_chain_hash=parent.chain_hash, prev_len=5, prompt_token_ids=[1, 2, 3, 4, 5, 6, 7],
        generated_token_ids=[8], generated_logprobs=[-1.0], weight_version=7,
    )  # fmt: skip
    assert coords == CommitCoords.for_staged(expected, staging_key="r1/c2")
    assert (coords.prev_len, coords.delta_len, coords.cum_len) == (5, 3, 8)


@pytest.mark.parametrize(
    "prompt",
    [[1, 2, 3, 4, 9, 6, 7], [1, 2, 3, 4], [], [0, 1, 2, 3, 4, 5]],
    ids=["differs", "shorter", "empty", "shifted"],
)
def test_a_prompt_that_does_not_extend_the_prefix_fails_with_a_reason(
    prompt: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    sink = InMemoryStagingSink()
    capture = capture_for(sink)
    call = capture.begin_call(child_admission(root_record()))
    with caplog.at_level(logging.WARNING, logger="capture_core.staging.capture"):
        coords = complete(capture, call, prompt_token_ids=prompt)
    assert_failed(coords, call, CaptureFailureReason.PREFIX_MISMATCH)
    assert (coords.parent_call_id, coords.prev_len, coords.cum_len) == ("c1", 5, 5)
    assert coords.weight_version == 7
    assert sink.stage_calls == 0
    assert "prefix_mismatch" in caplog.text and "'c2'" in caplog.text


def test_int_logprobs_are_taken_as_floats() -> None:
    sink = InMemoryStagingSink()
    capture = capture_for(sink)
    coords = complete(capture, capture.begin_call(root_admission()), generated_logprobs=[-1, 0])
    assert coords.disposition is Disposition.STAGED
    assert sink.fetch(["r1/c1"])[0].generation_log_probs_delta[-2:] == [-1.0, 0.0]


def test_the_weight_version_is_stamped_at_begin_call() -> None:
    versions = iter([3, 4])
    capture = RolloutTokenCapture(
        sink=InMemoryStagingSink(), weight_version_fn=lambda: next(versions)
    )
    call = capture.begin_call(root_admission())
    assert complete(capture, call).weight_version == 3
    assert capture.begin_call(root_admission("c9"), weight_version=11).weight_version == 11


# --- the attachments contract -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "filesystem"])
def test_an_attachment_aware_sink_stores_record_and_attachments_together(
    kind: str, tmp_path: Path
) -> None:
    sink = InMemoryStagingSink() if kind == "memory" else FilesystemStagingSink(tmp_path)
    capture = capture_for(sink)
    coords = complete(capture, capture.begin_call(root_admission()), attachments=PIXELS)
    assert coords.disposition is Disposition.STAGED
    (snapshot,) = sink.fetch([coords.staging_key])
    assert snapshot.digest == coords.digest
    assert snapshot.model_dump() == root_record().model_dump()
    assert sink.fetch_attachments("r1/c1") == PIXELS


def test_a_legacy_sink_given_attachments_fails_once_and_is_never_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    legacy = LegacyStagingSink()
    capture = capture_for(legacy)
    call = capture.begin_call(root_admission())
    with (
        mock.patch.object(legacy, "stage", wraps=legacy.stage) as spy,
        caplog.at_level(logging.WARNING, logger="capture_core.staging.capture"),
    ):
        coords = complete(capture, call, attachments=PIXELS)
    assert_failed(coords, call, CaptureFailureReason.SINK_REFUSED_ATTACHMENTS)
    spy.assert_called_once()
    assert spy.call_args.kwargs == {"attachments": PIXELS}
    assert legacy.stage_calls == 0 and len(legacy) == 0  # nothing was written without them
    assert "sink_refused_attachments" in caplog.text


def test_a_legacy_sink_keeps_working_without_attachments() -> None:
    legacy = LegacyStagingSink()
    capture = capture_for(legacy)
    with mock.patch.object(legacy, "stage", wraps=legacy.stage) as spy:
        coords = complete(capture, capture.begin_call(root_admission()))
    assert coords.disposition is Disposition.STAGED
    spy.assert_called_once()
    assert spy.call_args.kwargs == {}
    assert legacy.stage_calls == 1


@pytest.mark.parametrize(
    ("attachments", "passed"),
    [(None, {}), ({}, {"attachments": {}}), (PIXELS, {"attachments": PIXELS})],
)
def test_the_keyword_is_passed_only_when_the_caller_gave_a_mapping(
    attachments: dict[str, bytes] | None, passed: dict[str, Any]
) -> None:
    sink = RecordingSink()
    capture = capture_for(sink)
    complete(capture, capture.begin_call(root_admission()), attachments=attachments)
    ((_, kwargs),) = sink.calls
    assert kwargs == passed
    assert kwargs.get("attachments") is (attachments if attachments is not None else None)


def test_attachments_change_no_digest_and_no_coordinate(tmp_path: Path) -> None:
    results = []
    for attachments in (None, PIXELS, {"other": b"\xff" * 1000}):
        sink = FilesystemStagingSink(tmp_path / str(len(results)))
        capture = capture_for(sink)
        call = capture.begin_call(root_admission())
        coords = complete(capture, call, extras=dict(EXTRAS), attachments=attachments)
        results.append((coords, sink.fetch_raw(["r1/c1"])[0]))
    (plain, plain_raw), *others = results
    assert plain.disposition is Disposition.STAGED
    assert plain.extras_digest != root_record().extras_digest  # the extras are digested
    for coords, raw in others:
        assert coords == plain
        assert (coords.digest, coords.extras_digest) == (plain.digest, plain.extras_digest)
        assert raw == plain_raw  # the staged record is byte-identical
        assert b"media_imgs" not in raw and b"other" not in raw


def test_attachments_that_are_not_a_mapping_are_a_caller_error() -> None:
    sink = InMemoryStagingSink()
    capture = capture_for(sink)
    call = capture.begin_call(root_admission())
    with pytest.raises(InvalidAttachmentError) as caught:
        complete(capture, call, attachments=[("media_imgs", b"")])
    assert isinstance(caught.value, TypeError)
    assert sink.stage_calls == 0
    assert complete(capture, call).disposition is Disposition.STAGED  # the call is still open


def test_attachment_values_the_sink_refuses_fail_the_call() -> None:
    sink = InMemoryStagingSink()
    capture = capture_for(sink)
    call = capture.begin_call(root_admission())
    coords = complete(capture, call, attachments={"media_imgs": "not bytes"})
    assert_failed(coords, call, CaptureFailureReason.SINK_REFUSED_ATTACHMENTS)
    assert sink.stage_calls == 1 and len(sink) == 0


# --- sink failures ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sink", "reason"),
    [
        (RecordingSink(error=OSError(28, "No space left on device")), "sink_error"),
        (RecordingSink(error=TypeError("a bug in the sink")), "sink_error"),
        (RecordingSink(answer=StageResult(ok=False, error="quota")), "sink_rejected"),
        (RecordingSink(answer={"ok": True, "staging_key": "k"}), "sink_invalid_result"),
        (RecordingSink(answer=StageResult.model_construct(ok=True, staging_key="")),
         "sink_invalid_result"),
    ],
    ids=["raises", "type-error-without-attachments", "ok-false", "dict", "empty-key"],
)  # fmt: skip
def test_a_failing_sink_gives_capture_failed_after_one_call(
    sink: RecordingSink, reason: str
) -> None:
    capture = capture_for(sink)
    call = capture.begin_call(root_admission())
    assert_failed(complete(capture, call), call, reason)
    assert len(sink.calls) == 1


def test_a_conflicting_restage_gives_capture_failed() -> None:
    sink = InMemoryStagingSink()
    first = capture_for(sink)
    complete(first, first.begin_call(root_admission()))
    second = RolloutTokenCapture(sink=sink, weight_version_fn=lambda: 8)
    call = second.begin_call(root_admission())
    assert_failed(complete(second, call), call, CaptureFailureReason.SINK_ERROR)
    assert sink.fetch(["r1/c1"])[0].weight_version == 7


# --- caller errors ------------------------------------------------------------------------


def test_streaming_is_refused_with_a_clear_message() -> None:
    capture = capture_for(InMemoryStagingSink())
    with pytest.raises(StreamingUnsupportedError, match=r"streaming unsupported.*buffered SSE"):
        capture.begin_call(root_admission(), stream=True)


def test_begin_call_needs_an_admission() -> None:
    capture = capture_for(InMemoryStagingSink())
    with pytest.raises(TypeError, match="CaptureAdmission"):
        capture.begin_call(root_admission().model_dump())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("chain", "prefix", "match"),
    [
        (True, None, "staging_chain"),
        (True, [1, 2, 3, 4], "prev_len"),
        (False, [1, 2, 3, 4, 6], "inline prefix"),
        (False, [1, 2, 3, 4, -5], "not a token id"),
        (False, [1, 2, 3, 4, True], "not a token id"),
        (False, "12345", "sequence of ints"),
    ],
)
def test_a_prefix_that_does_not_fit_the_admission_raises(
    chain: bool, prefix: Any, match: str
) -> None:
    capture = capture_for(InMemoryStagingSink())
    with pytest.raises(InvalidPrefixError, match=match) as caught:
        capture.begin_call(child_admission(root_record(), chain=chain), prefix_token_ids=prefix)
    assert caught.value.model_call_id == "c2"


def test_a_root_takes_no_prefix() -> None:
    capture = capture_for(InMemoryStagingSink())
    assert capture.begin_call(root_admission(), prefix_token_ids=[]).prefix_token_ids == ()
    with pytest.raises(InvalidPrefixError, match="text"):
        capture.begin_call(root_admission(), prefix_token_ids=[1])


def test_a_generation_cut_is_refused() -> None:
    body = {**child_admission(root_record()).model_dump(), "generation_cut": generation_cut_json()}
    admission = CaptureAdmission.model_validate(body)
    with pytest.raises(UnsupportedAdmissionError, match="generation cut"):
        capture_for(InMemoryStagingSink()).begin_call(admission)


@pytest.mark.parametrize("version", [-1, True, 1.0, 2**64, None])
def test_a_bad_weight_version_raises(version: Any) -> None:
    capture = RolloutTokenCapture(sink=InMemoryStagingSink(), weight_version_fn=lambda: version)
    with pytest.raises(InvalidStagedCallError, match="weight_version"):
        capture.begin_call(root_admission())


def test_the_constructor_checks_its_parts() -> None:
    with pytest.raises(TypeError, match="stage"):
        RolloutTokenCapture(sink=object(), weight_version_fn=lambda: 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        RolloutTokenCapture(sink=InMemoryStagingSink(), weight_version_fn=7)  # type: ignore[arg-type]


def test_a_call_completes_once() -> None:
    capture = capture_for(InMemoryStagingSink())
    call = capture.begin_call(root_admission())
    staged = complete(capture, call)
    with pytest.raises(CallAlreadyCompletedError) as caught:
        complete(capture, call)
    assert caught.value.model_call_id == "c1"
    with pytest.raises(CallAlreadyCompletedError):
        capture.fail_call(call, reason="late")
    assert call.coords == staged and call.failure_reason is None
    failed = capture.begin_call(root_admission("c2"))
    capture.fail_call(failed, reason="engine_error")
    with pytest.raises(CallAlreadyCompletedError):
        complete(capture, failed)
    with pytest.raises(TypeError, match="PendingCall"):
        complete(capture, "c1")  # type: ignore[arg-type]


def test_fail_call_answers_capture_failed_without_staging() -> None:
    sink = InMemoryStagingSink()
    capture = capture_for(sink)
    call = capture.begin_call(child_admission(root_record()))
    coords = capture.fail_call(call, reason="engine_error")
    assert_failed(coords, call, "engine_error")
    assert (coords.parent_call_id, coords.prev_len, coords.weight_version) == ("c1", 5, 7)
    assert sink.stage_calls == 0
    with pytest.raises(TypeError, match="reason"):
        capture.fail_call(capture.begin_call(root_admission("c3")), reason="")


def test_complete_call_from_response_needs_an_adapter() -> None:
    capture = capture_for(InMemoryStagingSink())
    with pytest.raises(StagingError, match="CaptureAdapter"):
        capture.complete_call_from_response(capture.begin_call(root_admission()), {})


def test_an_adapter_that_cannot_read_the_response_fails_the_call() -> None:
    adapter = mock.Mock()
    adapter.extract_generation.side_effect = KeyError("choices")
    sink = InMemoryStagingSink()
    capture = capture_for(sink, adapter=adapter)
    call = capture.begin_call(root_admission())
    coords = capture.complete_call_from_response(call, {"choices": []})
    assert_failed(coords, call, CaptureFailureReason.EXTRACTION_FAILED)
    assert sink.stage_calls == 0
    with pytest.raises(CallAlreadyCompletedError):
        capture.complete_call_from_response(call, {})


# --- concurrency --------------------------------------------------------------------------


def test_the_sink_is_called_without_holding_the_capture_lock() -> None:
    """While one call sits in a slow sink, another call completes and a rival completion of
    the first call is refused."""
    entered, release = threading.Event(), threading.Event()
    inner = InMemoryStagingSink()

    class SlowSink:
        def stage(self, record: StagedCallRecord, **kwargs: Any) -> StageResult:
            if record.model_call_id == "c1":
                entered.set()
                assert release.wait(10)
            return inner.stage(record, **kwargs)

    capture = capture_for(SlowSink())
    first, second = (
        capture.begin_call(root_admission("c1")),
        capture.begin_call(root_admission("c2")),
    )
    results: list[CommitCoords] = []
    worker = threading.Thread(target=lambda: results.append(complete(capture, first)))
    worker.start()
    assert entered.wait(10)
    assert complete(capture, second).disposition is Disposition.STAGED
    with pytest.raises(CallAlreadyCompletedError):
        complete(capture, first)
    release.set()
    worker.join(10)
    assert [coords.disposition for coords in results] == [Disposition.STAGED]


# --- property: complete_call answers, it does not raise -----------------------------------

ODD_INTS = st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from([0, 2**64 - 1, 2**64])
ODD_FLOATS = st.floats() | st.sampled_from([-0.0, 0.0, float("nan"), float("inf"), 3.5e38, 1e-46])
ODD_VALUES = ODD_INTS | ODD_FLOATS | st.booleans() | st.none() | st.text(max_size=3)
TOKENS = st.lists(st.integers(min_value=0, max_value=300), max_size=12) | st.lists(
    ODD_INTS | ODD_VALUES, max_size=12
)
LOGPROB_LISTS = st.lists(ODD_FLOATS, max_size=12) | st.lists(ODD_VALUES, max_size=12)
NOT_LISTS = st.none() | st.integers() | st.floats() | st.just(object())
EXTRAS_VALUES = st.none() | st.dictionaries(st.text(max_size=3), ODD_VALUES, max_size=3) | NOT_LISTS


GOOD_TOKENS = st.lists(st.integers(min_value=0, max_value=300), max_size=10)
SPOILS = ("none", "prompt", "generated", "logprobs", "value", "length", "extras", "attachments")


@st.composite
def call_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed call, then (usually) one thing made odd."""
    continuation = draw(st.booleans())
    values: dict[str, Any] = {
        "continuation": continuation,
        "prompt": [*([1, 2, 3, 4, 5] if continuation else []), *draw(GOOD_TOKENS)],
        "generated": draw(GOOD_TOKENS),
        "extras": draw(st.none() | st.just(dict(EXTRAS))),
        "attachments": draw(st.none() | st.just(PIXELS)),
    }
    good_logprobs = st.floats(min_value=-30, max_value=0) | st.just(-0.0)
    n = len(values["generated"])
    values["logprobs"] = draw(st.lists(good_logprobs, min_size=n, max_size=n))
    spoil = draw(st.sampled_from(SPOILS))
    if spoil in ("prompt", "generated"):
        values[spoil] = draw(TOKENS | NOT_LISTS)
    elif spoil == "logprobs":
        values[spoil] = draw(LOGPROB_LISTS | NOT_LISTS)
    elif spoil == "value":
        column = draw(st.sampled_from(["prompt", "generated", "logprobs"]))
        if values[column]:
            position = draw(st.integers(min_value=0, max_value=len(values[column]) - 1))
            values[column][position] = draw(ODD_VALUES)
    elif spoil == "length":
        values["logprobs"] = values["logprobs"][1:] if n else [-1.0]
    elif spoil == "extras":
        values["extras"] = draw(EXTRAS_VALUES)
    elif spoil == "attachments":
        odd = st.dictionaries(st.text(max_size=3), st.binary(max_size=4) | ODD_VALUES, max_size=2)
        values["attachments"] = draw(odd)
    return values


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=call_inputs())
def test_complete_call_never_raises_on_data(inputs: dict[str, Any]) -> None:
    sink = InMemoryStagingSink()
    capture = capture_for(sink)
    admission = child_admission(root_record()) if inputs["continuation"] else root_admission()
    call = capture.begin_call(admission)
    generated = inputs["generated"]
    coords = capture.complete_call(
        call,
        prompt_token_ids=inputs["prompt"],
        generated_token_ids=generated,
        generated_logprobs=inputs["logprobs"],
        extras=inputs["extras"],
        attachments=inputs["attachments"],
    )
    assert CommitCoords.model_validate(coords.model_dump()) == coords
    assert (coords.rollout_id, coords.model_call_id) == ("r1", admission.model_call_id)
    assert coords.prev_len == admission.prev_len
    event(str(call.failure_reason or "staged"))
    if coords.disposition is Disposition.STAGED:
        (snapshot,) = sink.fetch([coords.staging_key])
        assert snapshot.digest == coords.digest and snapshot.cum_len == coords.cum_len
        assert (
            snapshot.token_ids_delta[len(snapshot.token_ids_delta) - len(generated) :] == generated
        )
        assert snapshot.extras == inputs["extras"]
        if inputs["attachments"] is not None:
            assert sink.fetch_attachments(coords.staging_key) == inputs["attachments"]
        assert call.failure_reason is None
    else:
        assert coords.disposition is Disposition.CAPTURE_FAILED
        assert coords.cum_len == admission.prev_len
        assert call.failure_reason in set(CaptureFailureReason)
        assert len(sink) == 0
