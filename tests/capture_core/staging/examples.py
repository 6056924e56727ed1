"""Golden inputs from the staging reference (Appendix A) and one valid JSON body per wire model."""

from __future__ import annotations

from typing import Any

from capture_core.staging import (
    CallRecord,
    CommitCoords,
    StagedCallRecord,
    build_staged_call_record,
)

GOLDEN_EXTRAS: dict[str, object] = {"routed_experts": [[[1, 2]], [[3, 4]]]}
GOLDEN_EXTRAS_DIGEST = "032024e899456be6e9a78c6d0399c5112d2ca7fa18d4ea9cf0d8cb7d0094f3a3"
GOLDEN_DIGEST = "cdd62002cf93637646f8501ae816eada76e315885219455f53a09dd5a86580f2"
EMPTY_DIGEST = "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6"

# Derived sensitivity variants of the golden call (one field changed each).
GOLDEN_DIGEST_SCHEMA_2 = "1122c7fe7e914c809eb9b1c09b26d94a50c1eb2790e7430fbcd8363b846ccf27"
GOLDEN_DIGEST_NEGATIVE_ZERO = "0441eda3c77a91ade47921dbf15a5775906efa1f891f748f4b73ec86b5490769"
GOLDEN_DIGEST_WEIGHT_8 = "5514250b005eaa59211622ca7cc47d39f0a39d8b7bb2520a9cd2a4924ab8a45f"

# Derived two-call chain (rollout r1, weight_version 7).
C1 = {
    "extras_digest": EMPTY_DIGEST,
    "chain_hash": "cd7963a2fd64b153935a75815b94818244e3c960081e17dad2f7a8c90d093328",
    "cumulative_hash": "9901d8eb23d4383dc2f1a0aac0deca59b6c27071f8d4131997f8f4a0e692cfb8",
    "digest": "aa38dcdd15d8b1bcef1a1f6de20dfb691edbfbbb2193e4013e410002ab9942ff",
}
C2_EXTRAS: dict[str, object] = {"routed_experts": "nrlre1:int8:1x1x1:AA=="}
C2 = {
    "extras_digest": "b4da5ca3548bd241a7d8258b598f9015edeceb884a5f79700eabf9edfd8074dc",
    "chain_hash": "fba381ed1ecc3c855c1e6de7b87d8a10871138fad4f5030a684ad10a1b96758d",
    "cumulative_hash": "3ba47a63043907e8001030342ede33add8df93abfb08aedc299d3e7ad5b2df3a",
    "digest": "e3f1a4c1f9b53400ecaf20cd3a57f0dab05839712e661d515786ac53c67b694a",
}


def golden_call_inputs() -> dict[str, Any]:
    """Keyword arguments of ``compute_staged_call_digest`` for the golden ``staged_call``."""
    return {
        "schema_version": 3,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": "rollout-1",
        "model_call_id": "call-1",
        "parent_call_id": "parent-1",
        "mode": "token_in",
        "prev_len": 3,
        "delta_len": 2,
        "cum_len": 5,
        "weight_version": 7,
        "token_ids_delta": [10, 11],
        "token_mask_delta": [0.0, 1.0],
        "generation_log_probs_delta": [0.0, -0.25],
        "extras_digest": GOLDEN_EXTRAS_DIGEST,
        "chain_hash": "1" * 64,
        "cumulative_hash": "2" * 64,
    }


def golden_record_json() -> dict[str, Any]:
    """The golden staged call as a full ``StagedCallRecord`` JSON body (field order as dumped)."""
    body = golden_call_inputs()
    ordered = {key: body[key] for key in list(body)[:11]}
    return {
        **ordered,
        "digest": GOLDEN_DIGEST,
        "token_ids_delta": body["token_ids_delta"],
        "token_mask_delta": body["token_mask_delta"],
        "generation_log_probs_delta": body["generation_log_probs_delta"],
        "extras_digest": GOLDEN_EXTRAS_DIGEST,
        "chain_hash": body["chain_hash"],
        "cumulative_hash": body["cumulative_hash"],
        "extras": {"routed_experts": [[[1, 2]], [[3, 4]]]},
    }


def chain_records() -> tuple[StagedCallRecord, StagedCallRecord]:
    """The two derived chain calls c1 (root) and c2 (its continuation), built from their inputs."""
    c1 = build_staged_call_record(
        rollout_id="r1",
        model_call_id="c1",
        prompt_token_ids=[1, 2, 3],
        generated_token_ids=[4, 5],
        generated_logprobs=[-0.5, -0.25],
        weight_version=7,
    )
    c2 = build_staged_call_record(
        rollout_id="r1",
        model_call_id="c2",
        parent_call_id="c1",
        parent_chain_hash=c1.chain_hash,
        prev_len=c1.cum_len,
        prompt_token_ids=[1, 2, 3, 4, 5, 6, 7],
        generated_token_ids=[8],
        generated_logprobs=[-1.0],
        weight_version=7,
        extras=dict(C2_EXTRAS),
    )
    return c1, c2


def call_record_json(record: StagedCallRecord, *, response_id: str) -> dict[str, Any]:
    """A manifest row for a staged record."""
    row = CallRecord(
        model_call_id=record.model_call_id,
        parent_call_id=record.parent_call_id,
        prev_len=record.prev_len,
        delta_len=record.delta_len,
        cum_len=record.cum_len,
        weight_version=record.weight_version,
        digest=record.digest,
        extras_digest=record.extras_digest,
        staging_key=f"{record.rollout_id}/{record.model_call_id}",
        mode=record.mode,
        chain_hash=record.chain_hash,
        cumulative_hash=record.cumulative_hash,
        response_id=response_id,
        admitted_at=1_700_000_000.25,
        output_fingerprint="a" * 64,
        continuation_fingerprint=None,
        fingerprint_version=3,
    )
    return row.model_dump(mode="json")


def valid_bodies() -> dict[str, dict[str, Any]]:
    """One valid JSON body per wire model, keyed by model name, every field present."""
    c1, c2 = chain_records()
    rows = [call_record_json(c1, response_id="resp_1"), call_record_json(c2, response_id="resp_2")]
    return {
        "CaptureAdmission": {
            "schema_version": 3,
            "rollout_id": "r1",
            "model_call_id": "c2",
            "parent_call_id": "c1",
            "prev_len": 5,
            "mode": "token_in",
            "required_prefix_token_ids": [],
            "staging_chain": ["r1/c1"],
            "parent_chain_hash": c1.chain_hash,
            "generation_cut": generation_cut_json(),
        },
        "GenerationCutContinuation": generation_cut_json(),
        "StagedCallBaseSnapshot": c2.model_dump(mode="json", exclude={"extras"}),
        "StagedCallRecord": c2.model_dump(mode="json"),
        "StagedCallSnapshot": golden_record_json(),
        "StageResult": {"schema_version": 3, "ok": True, "staging_key": "r1/c2", "error": None},
        "CommitCoords": CommitCoords.for_staged(c2, staging_key="r1/c2").model_dump(mode="json"),
        "CallRecord": rows[1],
        "ManifestFailure": {
            "schema_version": 3,
            "model_call_id": "c3",
            "reason": "request_finished_without_staged_coordinates",
        },
        "RolloutManifest": {
            "schema_version": 3,
            "rollout_id": "r1",
            "records": rows,
            "failures": [
                {"schema_version": 3, "model_call_id": "c3", "reason": "worker_capture_failed"}
            ],
        },
        "RolloutReceipt": {
            "schema_version": 3,
            "digest_version": 2,
            "extras_digest_version": 1,
            "rollout_id": "r1",
            "reward": 1.0,
            "terminal_model_call_id": "c2",
            "manifest": rows,
            "capture_poisoned": False,
            "failure_reason": None,
            "terminal_selection": "declared",
            "terminal_attribution_reason": "corroborated_by=declared+response_id",
        },
        "RolloutRemoval": {"schema_version": 3, "removed": ["r1"], "absent": ["r2"]},
    }


def generation_cut_json() -> dict[str, Any]:
    return {
        "schema_version": 3,
        "source_capture_key": "r1",
        "source_model_call_id": "c1",
        "staging_keys": ["r1/c1"],
        "prefix_token_count": 5,
        "prefix_digest": "9901d8eb23d4383dc2f1a0aac0deca59b6c27071f8d4131997f8f4a0e692cfb8",
        "effective_output_limit": 128,
        "terminal_finish_reason": "length",
        "terminal_stop_reason": None,
    }
