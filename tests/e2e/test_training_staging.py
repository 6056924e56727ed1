"""A three-call continuation staged by two worker processes, fetched back and linearized."""

from __future__ import annotations

import struct
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from capture_core.staging import (
    COMMIT_COORDS_KEY,
    CallRecord,
    CaptureAdmission,
    CaptureMode,
    FilesystemStagingSink,
    RolloutManifest,
    StagedRowDamagedError,
    VerificationError,
    build_receipt,
    verify_and_linearize,
)
from capture_core.testing.processes import run_worker

QUESTIONS = [
    "Which is larger? (A) 2 (B) 3",
    "And which is smaller? (A) 5 (B) 4",
    "Now pick the even one. (A) 7 (B) 8",
]


def f32(values: Any) -> list[int]:
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]


def run_conversation(urls: list[str], rollout_id: str) -> list[dict[str, Any]]:
    """Three chat calls, alternating between the two worker processes."""
    messages: list[dict[str, str]] = []
    calls: list[dict[str, Any]] = []
    for index, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        call_id = uuid.uuid4().hex
        if not calls:
            admission = CaptureAdmission(
                rollout_id=rollout_id, model_call_id=call_id, mode=CaptureMode.TEXT
            )
        else:
            parent = calls[-1]
            coords = parent["coords"]
            admission = CaptureAdmission(
                rollout_id=rollout_id, model_call_id=call_id, mode=CaptureMode.TOKEN_IN,
                parent_call_id=coords["model_call_id"], prev_len=coords["cum_len"],
                required_prefix_token_ids=parent["prompt"] + parent["generated"],
                parent_chain_hash=coords["chain_hash"],
            )  # fmt: skip
        body = {"model": "sim-model-1", "messages": messages,
                "ng_capture": admission.model_dump(mode="json")}  # fmt: skip
        response = httpx.post(urls[index % 2] + "/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        payload = response.json()
        choice = payload["choices"][0]
        calls.append({
            "coords": payload[COMMIT_COORDS_KEY], "response_id": payload["id"],
            "prompt": payload["prompt_token_ids"], "generated": choice["token_ids"],
            "logprobs": [entry["logprob"] for entry in choice["logprobs"]["content"]],
        })  # fmt: skip
        messages.append({"role": "assistant", "content": choice["message"]["content"]})
    return calls


def manifest_of(rollout_id: str, calls: list[dict[str, Any]]) -> RolloutManifest:
    keep = set(CallRecord.model_fields) - {"mode", "response_id", "rollout_id"}
    rows = []
    for call in calls:
        coords = call["coords"]
        assert coords["disposition"] == "staged"
        mode = CaptureMode.TEXT if coords["prev_len"] == 0 else CaptureMode.TOKEN_IN
        fields = {k: v for k, v in coords.items() if k in keep}
        rows.append(CallRecord(response_id=call["response_id"], mode=mode, **fields))
    return RolloutManifest(rollout_id=rollout_id, records=rows)


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("staging") / "stage"
    with (
        run_worker(seed=11, staging_dir=root, ttft_ms=0, ms_per_token=0) as first,
        run_worker(seed=11, staging_dir=root, ttft_ms=0, ms_per_token=0) as second,
    ):
        calls = run_conversation([first.url, second.url], "train-0")
    return root, calls


def test_three_calls_from_two_processes_linearize_exactly(
    staged: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, calls = staged
    outcome = build_receipt(manifest_of("train-0", calls))
    assert not outcome.masked, outcome.problems
    assert outcome.receipt is not None
    sink = FilesystemStagingSink(root)
    keys = [row.staging_key for row in outcome.receipt.manifest]
    row = verify_and_linearize(outcome.receipt, sink.fetch_raw(keys))
    last = calls[-1]
    assert list(row.token_ids) == last["prompt"] + last["generated"]
    assert list(row.model_call_ids) == [c["coords"]["model_call_id"] for c in calls]
    assert row.prompt_len == len(calls[0]["prompt"])
    # the generated positions carry mask 1 and exactly the worker's log-probs (float32 bits)
    generated_positions = [i for i, m in enumerate(row.token_mask) if m == 1.0]
    expected_ids: list[int] = []
    expected_logprobs: list[float] = []
    for call in calls:
        expected_ids += call["generated"]
        expected_logprobs += call["logprobs"]
    assert [row.token_ids[i] for i in generated_positions] == expected_ids
    assert f32(row.logprobs[i] for i in generated_positions) == f32(expected_logprobs)
    assert row.weight_version_spans == ((1, 0, len(row.token_ids)),)


def test_tampering_with_any_staged_byte_is_detected(
    staged: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, calls = staged
    outcome = build_receipt(manifest_of("train-0", calls))
    assert outcome.receipt is not None
    sink = FilesystemStagingSink(root)
    keys = [row.staging_key for row in outcome.receipt.manifest]
    middle = sink.path_for(keys[1])
    original = middle.read_bytes()
    step = max(1, len(original) // 150)
    try:
        for position in range(0, len(original), step):
            damaged = bytearray(original)
            damaged[position] ^= 0x01
            middle.write_bytes(bytes(damaged))
            with pytest.raises((StagedRowDamagedError, VerificationError)):
                verify_and_linearize(outcome.receipt, sink.fetch_raw(keys))
    finally:
        middle.write_bytes(original)
    assert verify_and_linearize(outcome.receipt, sink.fetch_raw(keys)).token_ids
