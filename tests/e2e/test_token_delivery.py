"""Token-id capture delivered by the collector, end to end through real processes.

A simulated worker in training mode stages every call; a capture server started with a
``token_id_capture`` config records each call's TokenEntry; ``ngcapture collect`` with the
same config runs tool-using rollouts on the training route, rebuilds each rollout's
``response.output`` with token ids, and retires its token capture once the line is durable.
The oracle is what the worker staged, read back through the ledger and verified.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from capture_core.cli import main
from capture_core.collect import CollectConfig, SimpleAgent, collect
from capture_core.exceptions import MaskFractionExceededError, TokenCaptureRetiredError
from capture_core.lineage import LineageStore
from capture_core.staging import FilesystemStagingSink, build_receipt, verify_and_linearize
from capture_core.testing.processes import ServiceProcess, run_capture_server, run_worker
from capture_core.tokens import (
    TokenCaptureStore,
    TokenEntry,
    load_token_capture_config,
)

ROLLOUTS = 20
TIMEOUT_S = 30.0


@dataclass
class Stack:
    root: Path
    worker: ServiceProcess
    server: ServiceProcess
    config: Path
    staging: Path
    captures: Path
    lineage: LineageStore
    store: TokenCaptureStore


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("delivery")
    staging, lineage, captures = root / "staging", root / "lineage", root / "captures"
    config = root / "token-capture.json"
    config.write_text(json.dumps({"token_id_capture": {"enabled": True,
                                                       "dir": str(root / "tokens")}}))  # fmt: skip
    env = {
        "NGCAPTURE_CONTROL_TOKEN": "test-token",
        "NGCAPTURE_TOKEN_ID_CAPTURE_CONFIG": str(config),
    }
    with (
        run_worker(seed=9, staging_dir=staging, ttft_ms=0, ms_per_token=0) as worker,
        run_capture_server(worker.url, captures, lineage_dir=lineage, env=env) as server,
    ):
        yield Stack(root, worker, server, config, staging, captures, LineageStore(lineage),
                    TokenCaptureStore(root / "tokens"))  # fmt: skip


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def f32(values: Any) -> list[int]:
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]


def collect_cli(stack: Stack, output: Path, run_id: str, *extra: str) -> int:
    return main(["collect", "--model-url", stack.server.url, "--capture-dir", str(stack.captures),
                 "--output", str(output), "--limit", str(ROLLOUTS // 2), "--num-repeats", "2",
                 "--tools", "--run-id", run_id, "--token-id-capture-config", str(stack.config),
                 *extra])  # fmt: skip


def check_rebuilt_equals_the_worker(stack: Stack, record: Mapping[str, Any]) -> int:
    """The rebuilt output's token ids are exactly what the worker staged; returns the calls."""
    rollout_id = _rollout_id(record)
    manifest = stack.lineage.manifest(rollout_id)
    assert manifest.failures == []
    response = record["response"]
    outcome = build_receipt(manifest, terminal_response_id=response["id"])
    assert not outcome.masked, outcome.problems
    assert outcome.receipt is not None
    keys = [row.staging_key for row in outcome.receipt.manifest]
    row = verify_and_linearize(
        outcome.receipt, FilesystemStagingSink(stack.staging).fetch_raw(keys)
    )
    carriers = [item for item in response["output"] if item.get("generation_token_ids")]
    assert len(carriers) == len(manifest.records) == len(row.model_call_ids)
    last = carriers[-1]
    assert last["prompt_token_ids"] + last["generation_token_ids"] == list(row.token_ids)
    assert carriers[0]["prompt_token_ids"] == list(row.token_ids[: row.prompt_len])
    generated = [t for t, m in zip(row.token_ids, row.token_mask, strict=True) if m == 1.0]
    logprobs = [lp for lp, m in zip(row.logprobs, row.token_mask, strict=True) if m == 1.0]
    assert [t for item in carriers for t in item["generation_token_ids"]] == generated
    assert f32(lp for item in carriers for lp in item["generation_log_probs"]) == f32(logprobs)
    for before, after in pairwise(carriers):  # one contiguous chain
        seen = before["prompt_token_ids"] + before["generation_token_ids"]
        assert after["prompt_token_ids"][: len(seen)] == seen
    return len(carriers)


def _rollout_id(record: Mapping[str, Any]) -> str:
    return str(record["ng_model_call_capture"]["rollout_id"])


def check_retired(stack: Stack, rollout_id: str) -> None:
    state = stack.store.state(rollout_id)
    assert state.frozen and state.retired and state.entry_digests == {}
    for suffix in (".tokens.jsonl", ".tokens.intents", ".tokens.incomplete"):
        assert not (stack.store.root / f"{rollout_id}{suffix}").exists(), suffix
    with pytest.raises(TokenCaptureRetiredError):
        stack.store.read_entries(rollout_id)


def test_twenty_rollouts_rebuilt_with_the_worker_tokens_retired_and_rerun_after_delete(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    output = stack.root / "run" / "rollouts.jsonl"
    assert collect_cli(stack, output, "tok") == 0
    printed = capsys.readouterr().out
    assert f"token capture: {ROLLOUTS} finalized, 0 masked (none), {ROLLOUTS} retired" in printed
    records = read_lines(output)
    assert len(records) == ROLLOUTS
    ids = [_rollout_id(r) for r in records]
    assert len(set(ids)) == ROLLOUTS and all(rid.startswith("tok.") for rid in ids)
    calls = 0
    for record in records:
        metrics = record["_ng_token_capture"]
        assert "mask_sample" not in record
        assert metrics["chains"] == 1 and metrics["roots"] == 1
        assert metrics["delivered_fraction"] == 1.0 and metrics["quarantined_calls"] == 0
        assert metrics["n_calls"] == record["ng_model_call_capture"]["metrics"]["num_calls"]
        calls += check_rebuilt_equals_the_worker(stack, record)
        check_retired(stack, _rollout_id(record))
    assert calls > ROLLOUTS  # tool use: several calls per rollout, each one link of the chain

    # A late call of a delivered rollout is refused by the fence (409), never staged.
    late = httpx.post(
        f"{stack.server.url}/ng-rollout/{ids[0]}/training-token-capture/v1/responses",
        json={"model": "sim-model-1", "input": "one more?"}, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert late.status_code == 409 and "retired" in late.json()["error"]["message"]
    check_retired(stack, ids[0])

    # The same ids again: the collector deletes the fences before dispatch (the framework
    # deletes its ledgers, which are not the collector's to manage).
    stack.lineage.delete(ids)
    assert collect_cli(stack, output, "tok", "--overwrite") == 0
    assert f"{ROLLOUTS} finalized, 0 masked (none), {ROLLOUTS} retired" in capsys.readouterr().out
    again = read_lines(output)
    assert sorted(_rollout_id(r) for r in again) == sorted(ids)
    for record in again:
        assert "mask_sample" not in record
        check_rebuilt_equals_the_worker(stack, record)
        check_retired(stack, _rollout_id(record))


def test_earlier_capture_of_an_id_is_cleared_before_dispatch(stack: Stack) -> None:
    rollout_id = "clr.0-0"
    stack.store.root.mkdir(parents=True, exist_ok=True)
    leftover = TokenEntry(rollout_id=rollout_id, model_call_id="crashed-run", model="m",
                          prompt_token_ids=[1, 2, 3], generation_token_ids=[4],
                          generation_log_probs=[-0.5])  # fmt: skip
    stack.store.append(leftover)
    stack.store.mark_incomplete_now(rollout_id, "crashed-run")
    config = CollectConfig(None, stack.root / "clr" / "rollouts.jsonl", stack.server.url,
                           [stack.captures], limit=1, run_id="clr",
                           token_capture=load_token_capture_config(stack.config))  # fmt: skip
    summary = collect(config)
    assert summary.ok == 1 and summary.token_capture is not None
    assert summary.token_capture["masked"] == 0 and summary.token_capture["retired"] == 1
    (record,) = read_lines(stack.root / "clr" / "rollouts.jsonl")
    assert record["_ng_token_capture"]["n_calls"] == 1  # the leftover call is gone
    check_rebuilt_equals_the_worker(stack, record)


class HalfAgent:
    """Every other rollout skips the training route: its calls leave no token entries."""

    def __init__(self, model_url: str) -> None:
        self.training = SimpleAgent(model_url, token_capture=True)
        self.plain = SimpleAgent(model_url, token_capture=False)
        self.runs = 0

    def run(self, row: Mapping[str, Any], rollout_id: str) -> dict[str, Any]:
        self.runs += 1
        agent = self.plain if self.runs % 2 == 0 else self.training
        return agent.run(row, rollout_id)


def test_run_aborts_once_too_many_finalized_rollouts_are_masked(stack: Stack) -> None:
    config_path = stack.root / "strict.json"
    config_path.write_text(json.dumps({"token_id_capture": {
        "enabled": True, "dir": str(stack.store.root), "max_mask_fraction": 0.3,
        "mask_fraction_min_samples": 4}}))  # fmt: skip
    output = stack.root / "abort" / "rollouts.jsonl"
    agent = HalfAgent(stack.server.url)
    config = CollectConfig(None, output, stack.server.url, [stack.captures], limit=10,
                           concurrency=1, run_id="abort",
                           token_capture=load_token_capture_config(config_path))  # fmt: skip
    with pytest.raises(MaskFractionExceededError) as caught:
        collect(config, agent=agent)
    assert (caught.value.masked, caught.value.finalized) == (2, 4)
    assert caught.value.reasons == {"capture contains no token records": 2}
    assert agent.runs == 4  # nothing was dispatched after the abort
    records = read_lines(output)
    assert len(records) == 4  # the rollout that tipped the run is on disk, with its reason
    masked = [r for r in records if r.get("mask_sample")]
    assert [_rollout_id(r) for r in masked] == ["abort.1-0", "abort.3-0"]
    assert masked[-1]["_ng_token_capture"]["error"] == "capture contains no token records"
    for record in records:
        rollout_id = _rollout_id(record)
        state = stack.store.state(rollout_id)
        # delivered rollouts are retired; masked ones keep their (empty) frozen evidence
        assert state.frozen and state.retired == (not record.get("mask_sample"))
    assert not (stack.captures / "abort.4-0.capture.jsonl").exists()
