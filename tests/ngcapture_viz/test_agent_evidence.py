"""Agent-side frames (invocations, tool executions, compactions, sandboxes, perf) and the
timeline's agent lanes, from rollout records built by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core import GapCode
from ngcapture_viz.figures.timeline import timeline
from ngcapture_viz.frames.agent import COMPACTIONS, INVOCATIONS, SANDBOXES, TOOL_EXECUTIONS
from ngcapture_viz.frames.perf import PERF

DOCS = Path(__file__).resolve().parents[2] / "docs"
T = 1_786_032_154.0
SCHEMAS = (INVOCATIONS, TOOL_EXECUTIONS, COMPACTIONS, SANDBOXES, PERF)


def call(index: int, start: float, end: float, tool_call: str | None = None) -> dict[str, Any]:
    tools = [{"call_id": tool_call, "name": "delegate", "arguments": {}}] if tool_call else []
    return {"model_call_id": f"c{index}", "response_id": f"r{index}", "call_index": index,
            "model_ref": {"type": "responses_api_models", "name": "policy_model"},
            "dialect": "responses", "status_code": 200, "started_at": T + start,
            "completed_at": T + end, "latency_total_ms": (end - start) * 1000,
            "tokens_out": 10, "tool_calls": tools}  # fmt: skip


def tool(invocation: str, call_id: str, start: Any, end: Any, **extra: Any) -> dict[str, Any]:
    return {"kind": "tool_call", "invocation_id": invocation, "tool_call_id": call_id,
            "tool_name": extra.pop("name", "delegate"), "started_at": start,
            "completed_at": end, "duration_ms": 1.0, "timing_source": "executor",
            "status": extra.pop("status", "completed"), **extra}  # fmt: skip


def record(rollout_id: str, **evidence: Any) -> dict[str, Any]:
    task, repeat = rollout_id.split("-")
    return {"task_id": f"t{task}", "_ng_task_index": int(task), "_ng_rollout_index": int(repeat),
            "reward": 1.0, **evidence}  # fmt: skip


def rich() -> dict[str, Any]:
    """A root agent whose delegate tool call runs a sub-agent with a tool of its own."""
    calls = [call(0, 0.1, 0.3, tool_call="t-del"), call(1, 0.40, 0.50, tool_call="t-look"),
             call(2, 0.55, 0.6), call(3, 0.9, 1.0)]  # fmt: skip
    invocations = [
        {"kind": "agent_invocation", "invocation_id": "main", "status": "completed",
         "duration_ms": 1000.0, "model_calls": [{"model_call_id": "c0"}, {"model_call_id": "c3"}],
         "conversation": [{"role": "user", "content": "secret conversation"}]},
        {"kind": "agent_invocation", "invocation_id": "main/1", "parent_invocation_id": "main",
         "spawned_by_tool_call_id": "t-del", "status": "completed",
         "model_calls": [{"model_call_id": "c1"}, {"model_call_id": "c2"},
                         {"model_ref": {"type": "responses_api_models", "name": "x"},
                          "response_id": "unresolved"}]},
        {"kind": "agent_invocation", "invocation_id": "orphan", "parent_invocation_id": "gone"},
    ]  # fmt: skip
    tools = [tool("main", "t-del", T + 0.35, T + 0.8, output="secret output"),
             tool("main/1", "t-look", T + 0.51, T + 0.53, name="lookup", status="failed",
                  error_type="tool_error"),
             tool("main", "untimed", None, None, name="lookup")]  # fmt: skip
    observations = {"source": "s", "records": [
        {"kind": "context_compaction", "invocation_id": "main", "observed_at": T + 0.7,
         "trigger": "auto", "tokens_before": 900, "tokens_after": 120, "outcome": "completed",
         "before_model_call": {"model_call_id": "c0"}},
        {"kind": "sandbox", "role": "agent", "provider": "local", "outcome": "completed",
         "exit_code": 0, "wall_time_s": 1.5, "cpu_time_s": "lots"},
    ]}  # fmt: skip
    perf = {"schema_version": "1", "started_at": T, "completed_at": T + 1.2,
            "wall_time_ms": 1200.0, "model_time_ms": 500.0, "tool_time_ms": 250.0,
            "overhead_time_ms": 450.0, "tool_model_overlap_ms": 200.0, "model_calls": 4,
            "tool_calls": 2, "model_concurrency_peak": 1, "model_concurrency_mean": 1.0,
            "tokens_out": 40, "tokens_out_per_s": 80.0, "ttft_p50_ms": None,
            "cache_hit_share": None, "evidence": {"wall_time_ms": {"sources": ["collector_clock"]}}}  # fmt: skip
    return record("0-0", ng_model_call_capture={"rollout_id": "0-0", "metrics": {"num_calls": 4},
                                                "calls": calls},
                  ng_trajectory={"invocations": invocations, "tool_calls": tools, "gaps": []},
                  ng_agent_observations=observations, ng_perf=perf)  # fmt: skip


def without_perf() -> dict[str, Any]:
    gap = {"code": GapCode.PERF_UNAVAILABLE, "invocation_id": None,
           "detail": "capture:model_call_capture_incomplete"}  # fmt: skip
    return record("1-0", ng_trajectory={"invocations": "not a list", "gaps": [gap]},
                  ng_perf="not an object")  # fmt: skip


def write(path: Path, *records: dict[str, Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


@pytest.fixture
def run(tmp_path: Path) -> ngv.CaptureRun:
    plain = record("2-0")  # no agent evidence at all: no rows anywhere
    return ngv.open_run(rollouts=write(tmp_path / "r.jsonl", rich(), without_perf(), plain),
                        label="a")  # fmt: skip


def test_the_frames_have_their_declared_schemas_and_rows(run: ngv.CaptureRun) -> None:
    for schema in SCHEMAS:
        assert getattr(run, schema.name).schema == schema.polars, schema.name
    invocations = run.invocations.sort("invocation_id")
    assert invocations.select("invocation_id", "depth", "num_model_calls", "num_tool_calls").rows() == [
        ("main", 0, 2, 2), ("main/1", 1, 3, 1), ("orphan", None, 0, 0)]  # fmt: skip
    assert invocations["model_call_ids"][1].to_list() == ["c1", "c2", None]
    tools = run.tool_executions.sort("tool_call_id")
    assert tools.select("tool_call_id", "requested_by_model_call_id", "status").rows() == [
        ("t-del", "c0", "completed"), ("t-look", "c1", "failed"), ("untimed", None, "completed")]  # fmt: skip
    assert tools["started_at"].dt.epoch("us").to_list()[:2] == [
        int((T + 0.35) * 1e6),
        int((T + 0.51) * 1e6),
    ]
    assert tools["started_at"][2] is None
    assert run.compactions.select("tokens_before", "tokens_after", "before_model_call_id").rows() == [
        (900, 120, "c0")]  # fmt: skip
    assert run.sandboxes.select("role", "exit_code", "wall_time_s", "cpu_time_s").rows() == [
        ("agent", 0, 1.5, None)]  # a value of the wrong type reads as unknown  # fmt: skip
    perf = run.perf.sort("rollout_id")
    assert perf.select("rollout_id", "wall_time_ms", "ttft_p50_ms", "unavailable_reason").rows() == [
        ("0-0", 1200.0, None, None), ("1-0", None, None, "capture:model_call_capture_incomplete")]  # fmt: skip
    assert orjson.loads(perf["evidence"][0])["wall_time_ms"]["sources"] == ["collector_clock"]


def test_no_payload_or_conversation_is_kept(tmp_path: Path) -> None:
    source = ngv.load.read_rollouts(write(tmp_path / "r.jsonl", rich()))
    (only,) = source.records
    assert b"secret" not in orjson.dumps(only.evidence)


def test_stacked_runs_keep_their_run_labels(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", rich())
    b = write(tmp_path / "b.jsonl", rich(), without_perf())
    both = ngv.open_runs({"a": (None, a), "b": (None, b)})
    assert both.perf.group_by(pl.col("run").cast(pl.String)).len().sort("run").rows() == [
        ("a", 1),
        ("b", 2),
    ]
    assert both.tool_executions.height == 6 and both.to_pandas()["perf"].shape[0] == 3


def test_the_timeline_draws_tools_sub_agents_links_and_compactions(run: ngv.CaptureRun) -> None:
    fig = timeline(run, "0-0")
    kinds = {(t.meta or {}).get("kind"): t for t in fig.data}
    assert list(fig.layout.yaxis.ticktext) == [
        "0",
        "tools · main",
        "tools · main/1",
        "sub-agent · main/1",
    ]
    tools = [t for t in fig.data if (t.meta or {}).get("kind") == "tools"]
    by_lane = {t.y[0]: t for t in tools}
    assert set(by_lane) == {1, 2}  # the untimed execution is not drawn
    assert by_lane[1].base[0] == pytest.approx(250.0) and by_lane[1].x[0] == pytest.approx(450.0)
    assert list(by_lane[2].customdata[0]) == ["t-look", "c1"]
    sub = kinds["subagent"]  # spans the tool call that spawned it
    assert (sub.y[0], sub.base[0], sub.x[0]) == (3, pytest.approx(250.0), pytest.approx(450.0))
    links = kinds["tool_links"]  # call end -> tool start, by tool_call_id
    assert list(links.x) == [pytest.approx(200.0), pytest.approx(250.0), None,
                             pytest.approx(400.0), pytest.approx(410.0), None]  # fmt: skip
    assert list(links.y) == [0, 1, None, 0, 2, None]
    assert list(kinds["compactions"].x) == [pytest.approx(600.0)]
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert len(legend) == len(set(legend))  # one legend entry per kind


def test_a_rollout_without_agent_evidence_draws_as_before(
    run: ngv.CaptureRun, tmp_path: Path
) -> None:
    capture = tmp_path / "model-calls"
    capture.mkdir()
    plain = ngv.open_run(rollouts=write(tmp_path / "p.jsonl", {**rich(), "ng_trajectory": None,
                                                               "ng_agent_observations": None}))  # fmt: skip
    fig = timeline(plain, "0-0")
    assert not [t for t in fig.data if (t.meta or {}).get("kind") in ("tools", "subagent")]
    assert fig.layout.yaxis.ticktext is None


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.name)
def test_docs_list_every_column_with_its_dtype(schema: Any) -> None:
    text = (DOCS / "frames.md").read_text()
    section = text.split(f"### `{schema.name}`", 1)[1].split("###", 1)[0]
    for column in schema.columns:
        assert f"| `{column.name}` | {column.dtype} |" in section, column.name


def test_where_the_time_goes(run: ngv.CaptureRun, tmp_path: Path) -> None:
    from ngcapture_viz.figures.time_split import time_split, time_split_figure

    table = time_split(run.perf)
    assert table.select("run", "rollouts", "with_perf", "wall_time_ms", "model_time_ms",
                        "tool_time_ms", "overhead_time_ms", "top_unavailable_reason").rows() == [
        ("a", 2, 1, 1200.0, 500.0, 250.0, 450.0, "capture:model_call_capture_incomplete")]  # fmt: skip
    fig = time_split_figure(table, ["a", "b"])
    shares = {t.name: list(t.x) for t in fig.data}
    assert shares == {"model calls in flight": [pytest.approx(500 / 1200), None],
                      "tools only": [pytest.approx(250 / 1200), None],
                      "neither (harness overhead)": [pytest.approx(450 / 1200), None]}  # fmt: skip
    assert list(fig.data[0].y) == ["a (1/2 rollouts)", "b (no agent evidence)"]
    board = ngv.dashboard(run)
    assert board.figures["time"].data[0].x[0] == pytest.approx(500 / 1200)
    bare = ngv.open_run(rollouts=write(tmp_path / "bare.jsonl", record("0-0")), label="bare")
    empty = time_split(bare.perf)
    assert empty.height == 0 and time_split_figure(empty, ["bare"]).layout.annotations


def perf_record(rollout_id: str, wall: float | None, model: float, tool: float) -> dict[str, Any]:
    if wall is None:  # no ng_perf: the reason only
        gap = {"code": "perf_unavailable", "invocation_id": None, "detail": "x"}
        return record(rollout_id, ng_trajectory={"gaps": [gap]})
    perf = {"started_at": T, "completed_at": T + wall / 1000, "wall_time_ms": wall,
            "model_time_ms": model, "tool_time_ms": tool, "overhead_time_ms": wall - model - tool}  # fmt: skip
    return record(rollout_id, ng_perf=perf)


def test_diff_compares_the_perf_figures(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", *(perf_record(f"{t}-0", 1000.0, 600.0, 100.0) for t in range(4)),
              perf_record("4-0", None, 0, 0))  # fmt: skip
    b = write(tmp_path / "b.jsonl", *(perf_record(f"{t}-0", 2000.0, 500.0, 500.0 * (t % 2))
                                      for t in range(5)))  # fmt: skip
    runs = ngv.open_runs({"a": (None, a), "b": (None, b)})
    names = ["rollout_wall_time_ms", "model_time_share", "tool_time_share", "overhead_share"]
    change = ngv.diff(runs, metrics=names, n_boot=50, seed=1)
    rows = {r["metric"]: r for r in change.frame.iter_rows(named=True)}
    assert rows["rollout_wall_time_ms"]["value_a"] == pytest.approx(1000.0)
    assert rows["rollout_wall_time_ms"]["value_b"] == pytest.approx(2000.0)
    assert (rows["rollout_wall_time_ms"]["n_a"], rows["rollout_wall_time_ms"]["coverage_a"]) == (
        4, pytest.approx(4 / 5))  # the rollout without ng_perf is left out, not counted as 0  # fmt: skip
    assert rows["model_time_share"]["value_a"] == pytest.approx(0.6)
    assert rows["model_time_share"]["value_b"] == pytest.approx(0.25)
    assert rows["tool_time_share"]["value_b"] == pytest.approx(0.1)  # (0 + 0.25 + 0 + 0.25 + 0) / 5
    assert rows["overhead_share"]["value_a"] == pytest.approx(0.3)
    assert rows["model_time_share"]["unit"] == "share"
