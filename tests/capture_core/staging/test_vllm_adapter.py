"""VLLMCaptureAdapter on vLLM-shaped chat completions, alone and through RolloutTokenCapture."""

from __future__ import annotations

import base64
import copy
import struct
from typing import Any

import pytest

from capture_core.adapters import (
    VLLMCaptureAdapter,
    VLLMPayloadError,
    routed_experts_shape,
)
from capture_core.staging import (
    CaptureAdapter,
    CaptureAdmission,
    CaptureFailureReason,
    CommitCoords,
    Disposition,
    RolloutTokenCapture,
    compute_extras_digest,
)
from capture_core.testing.staging import InMemoryStagingSink

ADAPTER = VLLMCaptureAdapter()
PROMPT_IDS = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


def text_completion() -> dict[str, Any]:
    """A chat completion as the RL vLLM worker returns it for ``"Hello!"``."""
    return {
        "id": "chatcmpl-7f3c",
        "object": "chat.completion",
        "created": 1760000000,
        "model": "policy",
        "prompt_token_ids": list(PROMPT_IDS),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!", "tool_calls": [],
                            "reasoning_content": None},
                "logprobs": {
                    "content": [
                        {"token": "token_id:9707", "logprob": -0.0123, "bytes": [72, 101, 108, 108, 111],
                         "top_logprobs": []},
                        {"token": "token_id:0", "logprob": -1.5, "bytes": [33], "top_logprobs": []},
                        {"token": "token_id:151645", "logprob": 0, "bytes": [], "top_logprobs": []},
                    ]
                },
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": [9707, 0, 151645],
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }  # fmt: skip


def tool_call_completion() -> dict[str, Any]:
    """A chat completion whose message is a tool call (no content), ids only in the logprobs."""
    return {
        "id": "chatcmpl-91aa",
        "object": "chat.completion",
        "created": 1760000001,
        "model": "policy",
        "prompt_token_ids": [*PROMPT_IDS, 151657, 5765],
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "chatcmpl-tool-1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
                    ],
                },
                "logprobs": {
                    "content": [
                        {"token": "token_id:151657", "logprob": -0.25, "bytes": [], "top_logprobs": []},
                        {"token": "token_id:4913", "logprob": -0.5, "bytes": [], "top_logprobs": []},
                        {"token": "token_id:151658", "logprob": -0.75, "bytes": [], "top_logprobs": []},
                    ]
                },
                "finish_reason": "tool_calls",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }  # fmt: skip


def envelope(dtype: str, shape: tuple[int, int, int], values: list[int]) -> str:
    code = {"int8": "b", "int16": "h", "int32": "i"}[dtype]
    packed = struct.pack(f"<{len(values)}{code}", *values)
    return f"nrlre1:{dtype}:{'x'.join(map(str, shape))}:{base64.b64encode(packed).decode()}"


def capture_for(sink: InMemoryStagingSink) -> RolloutTokenCapture:
    return RolloutTokenCapture(sink=sink, weight_version_fn=lambda: 3, adapter=ADAPTER)


def stage(payload: dict[str, Any], call_id: str = "c1") -> tuple[CommitCoords, Any, Any]:
    """Stage a root call from ``payload``; returns the coordinates, the call and the sink."""
    sink = InMemoryStagingSink()
    capture = capture_for(sink)
    call = capture.begin_call(CaptureAdmission(rollout_id="r1", model_call_id=call_id, mode="text"))
    coords = capture.complete_call_from_response(call, payload)
    CommitCoords.model_validate(coords.model_dump())
    return coords, call, sink


def assert_extraction_failed(payload: dict[str, Any]) -> None:
    coords, call, sink = stage(payload)
    assert coords.disposition is Disposition.CAPTURE_FAILED
    assert call.failure_reason == CaptureFailureReason.EXTRACTION_FAILED
    assert len(sink) == 0


def test_the_adapter_is_a_capture_adapter() -> None:
    assert isinstance(ADAPTER, CaptureAdapter)


# --- text and tool calls ------------------------------------------------------------------


def test_a_text_completion_is_staged_with_its_expanded_prompt() -> None:
    payload = text_completion()
    assert ADAPTER.extract_prompt_ids(payload) == PROMPT_IDS
    assert ADAPTER.extract_generation(payload) == ([9707, 0, 151645], [-0.0123, -1.5, 0.0])
    assert ADAPTER.extract_extras(payload) is None
    coords, _, sink = stage(payload)
    assert coords.disposition is Disposition.STAGED
    (row,) = sink.fetch(["r1/c1"])
    assert row.token_ids_delta == [*PROMPT_IDS, 9707, 0, 151645]
    assert row.token_mask_delta == [0.0] * 9 + [1.0] * 3
    assert row.generation_log_probs_delta[-3:] == [-0.0123, -1.5, 0.0]
    assert row.extras is None and row.weight_version == 3


def test_a_tool_call_completion_reads_ids_from_token_id_tokens() -> None:
    payload = tool_call_completion()
    ids, logprobs = ADAPTER.extract_generation(payload)
    assert ids == [151657, 4913, 151658] and logprobs == [-0.25, -0.5, -0.75]
    coords, _, sink = stage(payload)
    assert coords.disposition is Disposition.STAGED
    assert (coords.delta_len, coords.cum_len) == (14, 14)
    assert sink.fetch(["r1/c1"])[0].token_ids_delta[-3:] == [151657, 4913, 151658]


def test_choice_token_ids_pair_with_text_tokens() -> None:
    """Without return_tokens_as_token_ids the tokens are text; the ids come from token_ids."""
    payload = text_completion()
    for entry, text in zip(
        payload["choices"][0]["logprobs"]["content"], ["Hello", "!", ""], strict=True
    ):
        entry["token"] = text
    assert ADAPTER.extract_generation(payload)[0] == [9707, 0, 151645]
    del payload["choices"][0]["token_ids"]
    with pytest.raises(VLLMPayloadError, match="token_id") as caught:
        ADAPTER.extract_generation(payload)
    assert caught.value.field == "choices[0].logprobs.content[0].token"
    assert_extraction_failed(payload)


def test_token_ids_that_disagree_with_the_logprobs_fail() -> None:
    payload = text_completion()
    payload["choices"][0]["token_ids"] = [9707, 1, 151645]
    with pytest.raises(VLLMPayloadError, match="disagree"):
        ADAPTER.extract_generation(payload)
    assert_extraction_failed(payload)


def test_message_generation_fields_take_precedence() -> None:
    payload = text_completion()
    message = payload["choices"][0]["message"]
    message["generation_token_ids"], message["generation_log_probs"] = [5, 6], [-0.1, -0.2]
    assert ADAPTER.extract_generation(payload) == ([5, 6], [-0.1, -0.2])


def test_the_prompt_falls_back_to_the_message() -> None:
    payload = text_completion()
    payload["choices"][0]["message"]["prompt_token_ids"] = payload.pop("prompt_token_ids")
    assert ADAPTER.extract_prompt_ids(payload) == PROMPT_IDS


def test_enter_prefix_sets_the_required_prefix() -> None:
    request: dict[str, Any] = {"model": "policy", "messages": []}
    ADAPTER.enter_prefix(request, (1, 2, 3))
    assert request["required_prefix_token_ids"] == [1, 2, 3]
    with pytest.raises(VLLMPayloadError):
        ADAPTER.enter_prefix(request, [1, -2])


def test_a_continuation_through_the_adapter() -> None:
    sink = InMemoryStagingSink()
    capture = capture_for(sink)
    first = capture.begin_call(CaptureAdmission(rollout_id="r1", model_call_id="c1", mode="text"))
    parent = capture.complete_call_from_response(first, text_completion())
    follow_up = tool_call_completion()
    follow_up["prompt_token_ids"] = [*PROMPT_IDS, 9707, 0, 151645, 198, 151644, 872]
    admission = CaptureAdmission(
        rollout_id="r1", model_call_id="c2", parent_call_id="c1", prev_len=parent.cum_len,
        mode="token_in", staging_chain=[parent.staging_key or ""],
        parent_chain_hash=parent.chain_hash,
    )  # fmt: skip
    staged = sink.fetch(admission.staging_chain)
    prefix = [token for row in staged for token in row.token_ids_delta]
    call = capture.begin_call(admission, prefix_token_ids=prefix)
    coords = capture.complete_call_from_response(call, follow_up)
    assert coords.disposition is Disposition.STAGED
    assert (coords.prev_len, coords.delta_len) == (12, 3 + 3)
    follow_up["prompt_token_ids"][0] = 1  # a prompt that is not the staged prefix
    other = capture.begin_call(
        admission.model_copy(update={"model_call_id": "c3"}), prefix_token_ids=prefix
    )
    failed = capture.complete_call_from_response(other, follow_up)
    assert failed.disposition is Disposition.CAPTURE_FAILED
    assert other.failure_reason == CaptureFailureReason.PREFIX_MISMATCH


# --- routed experts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("routed", "shape"),
    [
        (envelope("int8", (3, 2, 2), [0, 1, 2, 3, 4, 5, 6, 7, -1, -1, 8, 9]), (3, 2, 2)),
        (envelope("int16", (1, 1, 2), [300, -1]), (1, 1, 2)),
        (envelope("int32", (2, 1, 1), [70000, 5]), (2, 1, 1)),
        ([[[1, 2], [3, 4]], [[5, -1], [6, 7]], [[0, 0], [1, 1]]], (3, 2, 2)),
    ],
    ids=["int8", "int16", "int32", "nested"],
)
def test_routed_experts_are_validated_and_staged_verbatim(
    routed: Any, shape: tuple[int, int, int]
) -> None:
    assert routed_experts_shape(routed) == shape
    payload = text_completion()
    payload["choices"][0]["message"]["routed_experts"] = copy.deepcopy(routed)
    assert ADAPTER.extract_extras(payload) == {"routed_experts": routed}
    coords, _, sink = stage(payload)
    assert coords.disposition is Disposition.STAGED
    assert coords.extras_digest == compute_extras_digest({"routed_experts": routed})
    assert sink.fetch(["r1/c1"])[0].extras == {"routed_experts": routed}


@pytest.mark.parametrize(
    "routed",
    [
        envelope("int8", (3, 2, 2), list(range(12))).replace("nrlre1:", "nrlre2:"),
        envelope("int8", (1, 1, 2), [1, 2]).replace("int8", "int64"),
        "nrlre1:int8:0x1x1:",
        "nrlre1:int8:1x1:AA==",
        "nrlre1:int8:01x1x1:AA==",
        "nrlre1:int8:1x1x1:!!==",
        "nrlre1:int8:1x1x1:AA",  # missing padding
        "nrlre1:int8:1x1x2:AA==",  # one byte for two values
        envelope("int16", (1, 1, 2), [1, 2]).replace("1x1x2", "1x1x1"),  # too many bytes
        "nrlre1:int8:1x1x1:AA==:extra",
        "nrlre1:int8:1x1x1:ÄÄ==",
        [],
        [[]],
        [[[]]],
        [[[1, 2]], [[3]]],  # ragged top-k
        [[[1, 2]], [[3, 4], [5, 6]]],  # ragged layers
        [[[1.0, 2]]],
        [[[True, 2]]],
        [[[-2, 1]]],
        [[[2**31, 1]]],
        [[1, 2]],
        {"data": "AA==", "shape": [1, 1, 1]},
        17,
    ],
)
def test_invalid_routed_experts_fail_the_call(routed: Any) -> None:
    with pytest.raises(VLLMPayloadError):
        routed_experts_shape(routed)
    payload = text_completion()
    payload["choices"][0]["message"]["routed_experts"] = routed
    assert_extraction_failed(payload)


def test_null_routed_experts_are_no_extras() -> None:
    payload = text_completion()
    payload["choices"][0]["message"]["routed_experts"] = None
    assert ADAPTER.extract_extras(payload) is None


# --- media spans --------------------------------------------------------------------------


def test_media_spans_pass_through() -> None:
    spans = [
        {"modality": "image", "offset": 3, "length": 256, "placeholder_token_id": 151655},
        {"modality": "image", "offset": 262, "length": 64, "placeholder_token_id": 151655,
         "hash": "9c1f", "extra": {"grid": [1, 8, 8]}},
    ]  # fmt: skip
    payload = text_completion()
    payload["media_spans"] = copy.deepcopy(spans)
    routed = envelope("int8", (1, 1, 1), [4])
    payload["choices"][0]["message"]["routed_experts"] = routed
    assert ADAPTER.extract_extras(payload) == {"routed_experts": routed, "media_spans": spans}
    coords, _, sink = stage(payload)
    assert coords.disposition is Disposition.STAGED
    assert sink.fetch(["r1/c1"])[0].extras == {"routed_experts": routed, "media_spans": spans}
    payload["media_spans"] = []
    assert ADAPTER.extract_extras(payload) == {"routed_experts": routed, "media_spans": []}


@pytest.mark.parametrize("spans", [{"offset": 3}, [3, 4], "spans", [{"ok": 1}, None]])
def test_media_spans_must_be_a_list_of_objects(spans: Any) -> None:
    payload = text_completion()
    payload["media_spans"] = spans
    with pytest.raises(VLLMPayloadError, match="media_spans"):
        ADAPTER.extract_extras(payload)
    assert_extraction_failed(payload)


def test_media_spans_that_cannot_be_digested_fail_the_call() -> None:
    payload = text_completion()
    payload["media_spans"] = [{"offset": float("nan")}]
    coords, call, _ = stage(payload)
    assert coords.disposition is Disposition.CAPTURE_FAILED
    assert call.failure_reason == CaptureFailureReason.INVALID_CAPTURE_DATA


# --- what fails ---------------------------------------------------------------------------


def test_two_choices_fail_the_call() -> None:
    payload = text_completion()
    payload["choices"].append({**copy.deepcopy(payload["choices"][0]), "index": 1})
    with pytest.raises(VLLMPayloadError, match="exactly one choice object, got 2"):
        ADAPTER.extract_generation(payload)
    assert_extraction_failed(payload)


@pytest.mark.parametrize("choices", [[], None, "x", ["not an object"]])
def test_no_usable_choice_fails_the_call(choices: Any) -> None:
    payload = text_completion()
    payload["choices"] = choices
    assert_extraction_failed(payload)


def test_missing_prompt_ids_fail_the_call() -> None:
    payload = text_completion()
    del payload["prompt_token_ids"]
    with pytest.raises(VLLMPayloadError, match="prompt_token_ids"):
        ADAPTER.extract_prompt_ids(payload)
    assert_extraction_failed(payload)


def test_missing_generated_ids_fail_the_call() -> None:
    payload = text_completion()
    payload["choices"][0]["logprobs"] = None
    with pytest.raises(VLLMPayloadError, match="logprobs"):
        ADAPTER.extract_generation(payload)
    assert_extraction_failed(payload)


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("prompt", [1, "2"]),
        ("prompt", [1, -2]),
        ("prompt", [1, 2.0]),
        ("prompt", "1 2"),
        ("token_ids", [9707, 0]),  # one id short
        ("logprob", float("nan")),
        ("logprob", float("-inf")),
        ("logprob", "-0.5"),
        ("logprob", True),
        ("logprob", 10**400),
        ("token", "token_id:-1"),
        ("token", "token_id:1.5"),
    ],
)
def test_malformed_token_fields_fail_the_call(where: str, value: Any) -> None:
    payload = text_completion()
    choice = payload["choices"][0]
    if where == "prompt":
        payload["prompt_token_ids"] = value
    elif where == "token_ids":
        choice["token_ids"] = value
    elif where == "logprob":
        choice["logprobs"]["content"][1]["logprob"] = value
    else:
        del choice["token_ids"]
        choice["logprobs"]["content"][1]["token"] = value
    assert_extraction_failed(payload)


def test_a_payload_that_is_not_an_object_fails_the_call() -> None:
    coords, call, _ = stage(["not", "a", "payload"])  # type: ignore[arg-type]
    assert coords.disposition is Disposition.CAPTURE_FAILED
    assert call.failure_reason == CaptureFailureReason.EXTRACTION_FAILED
