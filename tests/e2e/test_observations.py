"""Whole-rollout evidence end to end: real worker and capture server processes on loopback,
the official ``openai`` SDK as the agent's client, ``ngcapture collect`` as users run it."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from capture_core import CaptureStore
from capture_core.collect import CollectConfig, SimpleAgent, collect, rollout_base_url
from capture_core.observations import ObservationRecorder
from capture_core.testing.processes import ServiceProcess, run_capture_server, run_worker

SECRET = "iVBORw0KGgoAAAANSUhEUgSECRETIMAGEBYTES"
EVIDENCE = ("ng_model_call_capture", "ng_agent_observations", "ng_trajectory", "ng_perf")


@pytest.fixture(scope="module")
def worker() -> Iterator[ServiceProcess]:
    with run_worker(seed=11, ttft_ms=2, ms_per_token=0.02) as service:
        yield service


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    return tmp_path / "model-calls"


@pytest.fixture
def server(worker: ServiceProcess, capture_dir: Path) -> Iterator[ServiceProcess]:
    with run_capture_server(worker.url, capture_dir) as service:
        yield service


def read(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def ngcapture(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capture_core.cli", *args], capture_output=True,
                          text=True, timeout=180, check=False)  # fmt: skip


def check_perf(record: Mapping[str, Any]) -> dict[str, Any]:
    """ng_perf is there, its parts add up to the wall time, and it matches the trajectory."""
    perf = record["ng_perf"]
    parts = perf["model_time_ms"] + perf["tool_time_ms"] + perf["overhead_time_ms"]
    assert math.isclose(parts, perf["wall_time_ms"], abs_tol=1.0), perf
    assert min(perf["model_time_ms"], perf["tool_time_ms"], perf["overhead_time_ms"]) >= 0
    trajectory = record["ng_trajectory"]
    assert perf["model_calls"] == len(trajectory["model_calls"])
    assert perf["tool_calls"] == len(trajectory["tool_calls"])
    for name, value in perf.items():
        if name not in ("evidence", "schema_version", "started_at", "completed_at"):
            assert name in perf["evidence"] or name in ("model_calls", "tool_calls"), name
            assert value is None or value >= 0
    return perf


def test_the_tool_agent_leaves_whole_rollout_evidence(server: ServiceProcess, capture_dir: Path,
                                                      tmp_path: Path) -> None:  # fmt: skip
    output = tmp_path / "rollouts.jsonl"
    done = ngcapture("collect", "--output", str(output), "--model-url", server.url,
                     "--capture-dir", str(capture_dir), "--limit", "8", "--num-repeats", "2",
                     "--tools")  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = read(output)
    assert len(records) == 16
    for record in records:
        capture, trajectory = record["ng_model_call_capture"], record["ng_trajectory"]
        assert [key for key in record if key in EVIDENCE] == list(EVIDENCE)
        assert trajectory["gaps"] == [] and record["ng_agent_observations"]["gaps"] == []
        (main,) = trajectory["invocations"]
        assert (main["invocation_id"], main["status"]) == ("main", "completed")
        # every captured call is owned by the invocation, by its canonical reference
        assert [ref["model_call_id"] for ref in main["model_calls"]] == [
            call["model_call_id"] for call in capture["calls"]]  # fmt: skip
        first, second = trajectory["model_calls"]
        (tool,) = trajectory["tool_calls"]
        assert (tool["invocation_id"], tool["timing_source"], tool["status"]) == (
            "main", "executor", "completed")  # fmt: skip
        assert tool["tool_call_id"] == capture["calls"][0]["tool_calls"][0]["call_id"]
        (sent_back,) = [item["output"] for item in main["conversation"]
                        if item.get("call_id") == tool["tool_call_id"]
                        and item["type"] == "function_call_output"]  # fmt: skip
        assert tool["output"] == sent_back
        # the tool ran between the call that asked for it and the call that sent its output
        assert first["completed_at"] <= tool["started_at"] <= tool["completed_at"]
        assert tool["completed_at"] <= second["started_at"]
        assert tool["duration_ms"] == pytest.approx(
            (tool["completed_at"] - tool["started_at"]) * 1000)  # fmt: skip
        perf = check_perf(record)
        assert (
            perf["started_at"] <= first["started_at"]
            and second["completed_at"] <= perf["completed_at"]
        )
        assert (perf["model_concurrency_peak"], perf["model_concurrency_mean"]) == (
            1,
            pytest.approx(1),
        )
        assert perf["tool_time_ms"] == pytest.approx(tool["duration_ms"], abs=1e-3)
        assert perf["model_time_ms"] == pytest.approx(
            sum(c["completed_at"] - c["started_at"] for c in (first, second)) * 1000, abs=1e-3)  # fmt: skip
        assert perf["tokens_out"] == sum(c["tokens_out"] for c in capture["calls"])
        assert perf["evidence"]["tool_time_ms"]["sources"][-1] == "tool_timestamps:executor"
        turn = trajectory["turns"][0]
        assert (turn["invocation_id"], turn["answer"]) == ("main", record["output_text"])


def test_a_sub_agent_is_a_child_invocation_inside_its_tool_call(
    server: ServiceProcess, capture_dir: Path, tmp_path: Path
) -> None:
    agent = SimpleAgent(server.url, tools=True, subagent=True, dialect="chat")
    config = CollectConfig(None, tmp_path / "r.jsonl", server.url, [capture_dir], limit=3, tools=True)  # fmt: skip
    summary = collect(config, agent=agent)
    assert summary.ok == 3 and summary.gaps == {}
    for record in read(tmp_path / "r.jsonl"):
        trajectory = record["ng_trajectory"]
        assert trajectory["gaps"] == []
        _, child = trajectory["invocations"]
        tools = {(t["invocation_id"], t["tool_name"]): t for t in trajectory["tool_calls"]}
        delegate = tools["main", "delegate"]
        assert (child["parent_invocation_id"], child["spawned_by_tool_call_id"]) == (
            "main", delegate["tool_call_id"])  # fmt: skip
        assert ("main/1", "lookup") in tools and child["invocation_id"] == "main/1"
        calls = {c["model_call_id"]: c for c in trajectory["model_calls"]}
        assert len(calls) == 4 and {r["model_call_id"] for r in child["model_calls"]} <= set(calls)
        for ref in child["model_calls"]:  # the child's calls run inside the delegate tool call
            inner = calls[ref["model_call_id"]]
            assert (
                delegate["started_at"]
                <= inner["started_at"]
                <= inner["completed_at"]
                <= delegate["completed_at"]
            )
        assert delegate["output"] == child["conversation"][-1]["content"]
        perf = check_perf(record)
        assert perf["tool_model_overlap_ms"] > 0  # the child's calls, under the delegate call
        assert [t["turn_no"] for t in trajectory["turns"]] == [1, 1]


class ImageAgent:
    """Sends an ``input_image`` block, then scrubs it from everything it reports."""

    def __init__(self, url: str) -> None:
        self.url = url

    def run(self, row: Mapping[str, Any], rollout_id: str) -> dict[str, Any]:
        recorder = ObservationRecorder("image_agent")
        main = recorder.invocation("main")
        text = {"type": "input_text", "text": str(row["question"])}
        image = {"type": "input_image", "image_url": f"data:image/png;base64,{SECRET}"}
        client = openai.OpenAI(base_url=rollout_base_url(self.url, rollout_id), api_key="x",
                               max_retries=0)  # fmt: skip
        with client:
            response = client.responses.create(
                model="sim-model-1", input=[{"role": "user", "content": [text, image]}]
            )
        main.model_call(response_id=response.id)
        scrubbed = [{"role": "user", "content": [text, {"type": "input_text", "text": "[image]"}]}]
        answer = [item.model_dump(mode="json", exclude_none=True) for item in response.output]
        main.finish("completed", conversation=[*scrubbed, *answer])
        recorder.gap("multimodal_history_redacted", invocation_id="main",
                     detail="1 input_image block scrubbed")  # fmt: skip
        return {"output_text": response.output_text, "ng_agent_observations": recorder.to_json()}


def test_redacted_multimodal_history_leaves_no_image_in_the_rows(
    server: ServiceProcess, capture_dir: Path, tmp_path: Path
) -> None:
    config = CollectConfig(None, tmp_path / "r.jsonl", server.url, [capture_dir], limit=3)  # fmt: skip
    assert collect(config, agent=ImageAgent(server.url)).ok == 3
    assert SECRET not in (tmp_path / "r.jsonl").read_text()
    store = CaptureStore(capture_dir)
    for record in read(tmp_path / "r.jsonl"):
        rollout_id = record["ng_model_call_capture"]["rollout_id"]
        assert SECRET in store.path_for(rollout_id).read_text()  # the store keeps the raw call
        (call,) = record["ng_trajectory"]["model_calls"]
        assert (call["request"], call["response"]) == (None, None)
        assert (
            call["response_metadata"]["response_id"]
            == record["ng_model_call_capture"]["calls"][0]["response_id"]
        )
        assert [g["code"] for g in record["ng_trajectory"]["gaps"]] == [
            "multimodal_history_redacted",
            "turns_unavailable",
        ]  # this agent reports no turns
        check_perf(record)  # timing is not a payload


def mcqa_rows() -> list[dict[str, Any]]:
    """20 NeMo Gym-style MCQA rows: the params are the request, the rest are task fields."""
    rows = []
    for n in range(20):
        a, b = n + 2, 3 * n + 1
        choices = [a + b, a + b + 1, a * b, a + b - 1]
        letters = "ABCD"
        body = "\n".join(f"{letters[i]}: {v}" for i, v in enumerate(choices))
        prompt = ("You should output your final response letter inside \\boxed{} and nothing else. "
                  f"What is {a} + {b}?\n{body}")  # fmt: skip
        row: dict[str, Any] = {
            "responses_create_params": {"input": [{"role": "user", "content": prompt}],
                                        "temperature": 0.0, "max_output_tokens": None},
            "options": [{letters[i]: str(v)} for i, v in enumerate(choices)],
            "expected_answer": "A", "uuid": f"mcqa-{n:02d}", "metadata": {"source": "test"},
        }  # fmt: skip
        if n % 5 == 1:
            row["template_metadata"] = {"output_regex": r"answer is \\boxed\{([A-Z])\}"}
        if n % 5 == 2:
            row["grading_mode"] = "lenient_answer_colon"  # the model boxes: nothing to extract
        rows.append(row)
    return rows


def test_a_nemo_gym_mcqa_file_is_collected_and_graded(
    server: ServiceProcess, capture_dir: Path, tmp_path: Path
) -> None:
    tasks, output = tmp_path / "mcqa.jsonl", tmp_path / "rollouts.jsonl"
    rows = mcqa_rows()
    unusable = [{"responses_create_params": {"messages": []}, "uuid": "no-input"},
                {**rows[0], "expected_answer": "Z", "uuid": "bad-answer"}]  # fmt: skip
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in [*rows, *unusable]))
    done = ngcapture("collect", "--input", str(tasks), "--output", str(output), "--model-url",
                     server.url, "--capture-dir", str(capture_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "rollouts: 20 ok, 2 failed" in done.stdout
    graded = {r["uuid"]: r for r in read(output)}
    assert set(graded) == {r["uuid"] for r in rows}
    store = CaptureStore(capture_dir)
    extracted = 0
    for row in rows:
        record = graded[row["uuid"]]
        for key, value in row.items():
            assert record[key] == value, key  # every task field kept as it was
        assert record["reward"] == (
            1.0 if record["extracted_answer"] == row["expected_answer"] else 0.0
        )
        if row.get("grading_mode") == "lenient_answer_colon":
            assert record["extracted_answer"] is None
        else:
            assert record["extracted_answer"] in "ABCD"
            extracted += 1
        (line,) = (
            store.path_for(record["ng_model_call_capture"]["rollout_id"]).read_bytes().splitlines()
        )
        sent = orjson.loads(line)["request"]
        assert sent["input"] == row["responses_create_params"]["input"]  # sent as the request
        assert sent["temperature"] == 0.0 and "max_output_tokens" not in sent
        check_perf(record)
    assert extracted == 16
    assert 0 < sum(r["reward"] for r in graded.values()) < 20  # a simulated model, graded
    failures = {r["uuid"]: r["ng_failure"] for r in read(tmp_path / "rollouts_failures.jsonl")}
    assert failures["no-input"]["error_type"] == "TaskRowError"
    assert "responses_create_params has no 'input'" in failures["no-input"]["error"]
    assert (
        "expected_answer 'Z' is not one of the options' letters" in failures["bad-answer"]["error"]
    )


def test_nemo_gym_rows_over_chat_completions_by_translation(
    server: ServiceProcess, capture_dir: Path, tmp_path: Path
) -> None:
    tasks, output = tmp_path / "mcqa.jsonl", tmp_path / "rollouts.jsonl"
    rows = mcqa_rows()[:3]
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    done = ngcapture("collect", "--input", str(tasks), "--output", str(output), "--model-url",
                     server.url, "--capture-dir", str(capture_dir),
                     "--dialect", "chat")  # fmt: skip
    assert done.returncode == 0, done.stderr
    store = CaptureStore(capture_dir)
    records = {r["uuid"]: r for r in read(output)}
    assert set(records) == {r["uuid"] for r in rows}
    for row in rows:
        record = records[row["uuid"]]
        (line,) = (
            store.path_for(record["ng_model_call_capture"]["rollout_id"]).read_bytes().splitlines()
        )
        sent = orjson.loads(line)["request"]
        assert sent["messages"] == row["responses_create_params"]["input"]
        assert record["ng_model_call_capture"]["calls"][0]["dialect"] == "chat"
        assert "extracted_answer" in record and record["options"] == row["options"]


def test_nemo_gym_rows_over_anthropic_messages_by_translation(
    server: ServiceProcess, capture_dir: Path, tmp_path: Path
) -> None:
    tasks, output = tmp_path / "mcqa.jsonl", tmp_path / "rollouts.jsonl"
    rows = mcqa_rows()[:6]
    rows[0]["responses_create_params"] |= {"instructions": "Think, then box the letter.",
                                           "max_output_tokens": 300}  # fmt: skip
    untranslatable = [
        {**rows[1], "uuid": "web-search",
         "responses_create_params": {**rows[1]["responses_create_params"],
                                     "tools": [{"type": "web_search_preview"}]}},
        {**rows[2], "uuid": "follow-up",
         "responses_create_params": {**rows[2]["responses_create_params"],
                                     "previous_response_id": "resp_0"}},
    ]  # fmt: skip
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in [*rows, *untranslatable]))
    done = ngcapture("collect", "--input", str(tasks), "--output", str(output), "--model-url",
                     server.url, "--capture-dir", str(capture_dir),
                     "--dialect", "messages")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "rollouts: 6 ok, 2 failed" in done.stdout
    store = CaptureStore(capture_dir)
    records = {r["uuid"]: r for r in read(output)}
    assert set(records) == {r["uuid"] for r in rows}
    for row in rows:
        record = records[row["uuid"]]
        for key, value in row.items():
            assert record[key] == value, key  # every task field kept as it was
        boxed = row.get("grading_mode") != "lenient_answer_colon"  # the model boxes its letter
        assert (record["extracted_answer"] in ("A", "B", "C", "D")) == boxed  # the text, graded
        assert record["reward"] == (
            1.0 if record["extracted_answer"] == row["expected_answer"] else 0.0
        )
        assert record["response"]["type"] == "message"
        capture = record["ng_model_call_capture"]
        (line,) = store.path_for(capture["rollout_id"]).read_bytes().splitlines()
        sent = orjson.loads(line)["request"]
        assert sent["messages"] == row["responses_create_params"]["input"]
        params = row["responses_create_params"]
        assert sent["max_tokens"] == (params["max_output_tokens"] or 4096)
        assert sent.get("system") == params.get("instructions")
        assert sent["temperature"] == 0.0
        (call,) = capture["calls"]
        assert call["dialect"] == "messages" and call["response_id"] == record["response"]["id"]
        # the agent's reference (by the Messages response id) is joined to the captured call
        (main,) = record["ng_trajectory"]["invocations"]
        assert [ref["model_call_id"] for ref in main["model_calls"]] == [call["model_call_id"]]
        assert record["ng_trajectory"]["gaps"] == []
        check_perf(record)
    failures = {r["uuid"]: r["ng_failure"] for r in read(tmp_path / "rollouts_failures.jsonl")}
    assert failures["web-search"]["error_type"] == "TaskRowError"
    assert "only function tools translate to Anthropic Messages" in (
        failures["web-search"]["error"])  # fmt: skip
    assert "previous_response_id has no Anthropic Messages equivalent" in (
        failures["follow-up"]["error"])  # fmt: skip
    assert len(list(capture_dir.glob("*.capture.jsonl"))) == len(rows)  # no call for those two


def test_the_tool_agent_over_anthropic_messages(
    server: ServiceProcess, capture_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "rollouts.jsonl"
    done = ngcapture("collect", "--output", str(output), "--model-url", server.url,
                     "--capture-dir", str(capture_dir), "--limit", "4", "--tools",
                     "--dialect", "messages")  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = read(output)
    assert len(records) == 4
    store = CaptureStore(capture_dir)
    for record in records:
        capture, trajectory = record["ng_model_call_capture"], record["ng_trajectory"]
        assert [call["dialect"] for call in capture["calls"]] == ["messages", "messages"]
        (main,) = trajectory["invocations"]
        assert [ref["model_call_id"] for ref in main["model_calls"]] == [
            call["model_call_id"] for call in capture["calls"]]  # fmt: skip
        (tool,) = trajectory["tool_calls"]
        assert tool["tool_call_id"].startswith("toolu_")
        assert tool["tool_call_id"] == capture["calls"][0]["tool_calls"][0]["call_id"]
        assert (tool["timing_source"], tool["status"]) == ("executor", "completed")
        # the second call sent the tool_use back with its tool_result in a user message
        _, second = (orjson.loads(line) for line in
                     store.path_for(capture["rollout_id"]).read_bytes().splitlines())  # fmt: skip
        asked, answered = second["request"]["messages"][-2:]
        assert asked["role"] == "assistant" and asked["content"][-1]["type"] == "tool_use"
        assert answered == {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool["tool_call_id"],
             "content": tool["output"]}]}  # fmt: skip
        assert record["output_text"] and "parsed_answer" in record
        check_perf(record)
