"""Frames are exact: every call row equals capture_core's record of that line; schemas hold.

The exactness store has 10,000 rollouts (about 20,000 realistic lines with payloads, plus
hand-made lines for the null, tool-argument and error corners). The expected frames are built
here from ``capture_core.read_model_call_records`` / ``aggregate_model_call_metrics`` without
any ``ngcapture_viz`` code, and compared with ``assert_frame_equal`` for the index cold and
warm, without the index, and through the process pool.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import ngcapture_viz as ngv
from capture_core import (
    ATTACHMENT_KEY,
    CaptureStore,
    ModelCallMetrics,
    ModelCallRecord,
    aggregate_model_call_metrics,
    aggregate_model_call_records,
    is_valid_rollout_id,
    read_model_call_records,
    split_attempt,
)
from capture_core.testing import CaptureLineFactory, RunSpec, write_run
from ngcapture_viz.frames import CALLS, GAPS, LENGTH_FINISH_REASONS, ROLLOUTS, TOOL_CALLS, UTC_TIME
from ngcapture_viz.frames.rollouts import rollout_part_columns
from ngcapture_viz.frames.tool_calls import tool_choice_indices
from tests.ngcapture_viz.conftest import write_capture

ROLLOUTS_N = 10_000
_LENGTH = {"length", "max_tokens", "max_output_tokens"}

#: Hand-made lines for the corners the factory does not reach.
SPECIAL_LINES: list[dict[str, Any]] = [
    # No usage, no model_ref, no timestamps, no request: every metric null.
    {"model_call_id": "bare-line", "dialect": "chat"},
    # Two tool calls, the first with arguments that are not JSON; a custom model_ref type;
    # only prompt tokens reported.
    {
        "model_call_id": "tools-line",
        "dialect": "chat",
        "model_ref": {"type": "judge_models", "name": "judge"},
        "started_at": 1786032154.123456,
        "completed_at": 1786032155.5,
        "latency_ms": 1376.54,
        "status_code": 200,
        "request": {"model": "req-model", "messages": [], "stream": False},
        "response": {
            "id": "chatcmpl-tools",
            "model": "resp-model",
            "choices": [
                {
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_a",
                                "type": "function",
                                "function": {"name": "search", "arguments": "{not json"},
                            },
                            {
                                "id": "call_b",
                                "type": "function",
                                "function": {"name": "fetch", "arguments": '{"url": "x", "n": 2}'},
                            },
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 17},
        },
    },
    # Reported zeros stay zeros.
    {
        "model_call_id": "zero-line",
        "dialect": "chat",
        "status_code": 200,
        "request": {"model": "m", "messages": []},
        "response": {
            "id": "chatcmpl-zero",
            "model": "m",
            "choices": [{"finish_reason": "length", "message": {"content": ""}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        },
    },
    # A server error with an error body.
    {
        "model_call_id": "error-line",
        "dialect": "responses",
        "status_code": 500,
        "error_category": "server_error",
        "latency_ms": 12.5,
        "request": {"model": "m", "input": "hi", "stream": True},
        "response": {"error": {"code": "internal", "message": "boom"}},
    },
]


@dataclass(frozen=True)
class BigStore:
    root: Path
    rollout_ids: list[str]
    total_bytes: int
    records: dict[str, list[ModelCallRecord]]
    metrics: dict[str, ModelCallMetrics]
    calls: pl.DataFrame  # expected calls frame, built from the records
    tools: pl.DataFrame  # expected tool_calls frame


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigStore]:
    """10,000 rollouts of 1-3 lines; model_call_ids unique (rewritten in the line bytes).

    Written to /dev/shm when there is one: creating 10,000 files on a busy disk costs seconds.
    """
    shm = Path("/dev/shm")
    in_memory = shm.is_dir() and os.access(shm, os.W_OK)
    if in_memory:
        holder = Path(tempfile.mkdtemp(prefix="ngcapture-exact-", dir=shm))
    else:
        holder = tmp_path_factory.mktemp("exact")
    try:
        yield _build_big_store(holder / "model-calls")
    finally:
        if in_memory:
            shutil.rmtree(holder, ignore_errors=True)


def _build_big_store(root: Path) -> BigStore:
    root.mkdir()
    made = list(CaptureLineFactory(seed=11).lines(1500))
    # Streamed lines carry their raw SSE text (median ~9 KB): keep the 200 smallest of them,
    # so the store stays ~35 MB and quick to write, with every kind of line in it.
    streamed = sorted((ln.to_jsonl() for ln in made if ln.response_raw is not None), key=len)
    base = [ln.to_jsonl() for ln in made if ln.response_raw is None] + streamed[:200]
    prefix = b'{"model_call_id":"'
    rng = random.Random(5)
    count = 0
    for number in range(ROLLOUTS_N):
        out = []
        for _ in range(rng.randint(1, 3)):
            line = rng.choice(base)
            assert line.startswith(prefix)
            old = line[len(prefix) : len(prefix) + 32]
            out.append(line.replace(old, f"{count:032x}".encode(), 1))
            count += 1
        if number % 1000 == 7:
            special = orjson.dumps(SPECIAL_LINES[number // 1000 % 4]) + b"\n"
            out.insert(rng.randint(0, len(out)), special)
        write_capture(root, f"{number // 4}-{number % 4}", out)
    store = CaptureStore(root, create=False)
    rollout_ids = store.rollout_ids()
    records = {rid: read_model_call_records(store, rid) for rid in rollout_ids}
    metrics = {rid: aggregate_model_call_records(recs) for rid, recs in records.items()}
    # That is what aggregate_model_call_metrics computes; check it on every 25th rollout.
    for rollout_id in rollout_ids[::25]:
        assert aggregate_model_call_metrics(store, rollout_id) == metrics[rollout_id]
    total = sum(p.stat().st_size for p in root.iterdir())
    calls, tools = _expected_frames(store, records)
    return BigStore(root, rollout_ids, total, records, metrics, calls, tools)


def _expected_frames(
    store: CaptureStore, records: dict[str, list[ModelCallRecord]]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The calls and tool_calls frames, from capture_core's records and raw entries alone."""
    rows: list[dict[str, Any]] = []
    tool_rows: list[dict[str, Any]] = []
    for rollout_id, recs in records.items():
        entries = {e.call_index: e for e in store.read(rollout_id).entries}
        path = str(store.path_for(rollout_id))
        for r in recs:
            entry = entries[r.call_index]
            ttft = r.latency_ttft_ms
            rate = None
            if r.tokens_out is not None and r.latency_total_ms is not None:
                span = r.latency_total_ms - ttft if r.stream and ttft is not None else None
                seconds = (span if span is not None else r.latency_total_ms) / 1000
                rate = r.tokens_out / seconds if seconds > 0 else None
            cut = r.finish_reason in _LENGTH and r.error_category in (None, "incomplete")
            outcome = "length" if cut else r.error_category or "ok"
            rows.append(
                {
                    "run": "exact",
                    "rollout_id": rollout_id,
                    "call_index": r.call_index,
                    "model_call_id": r.model_call_id,
                    "response_id": r.response_id,
                    "model_ref_type": r.model_ref.type if r.model_ref else None,
                    "model_ref_name": r.model_ref.name if r.model_ref else None,
                    "model": r.model,
                    "dialect": r.dialect,
                    "stream": r.stream,
                    "status_code": r.status_code,
                    "response_status": r.response_status,
                    "finish_reason": r.finish_reason,
                    "outcome": outcome,
                    "started_at": r.started_at,
                    "completed_at": r.completed_at,
                    "latency_total_ms": r.latency_total_ms,
                    "latency_ttft_ms": ttft,
                    "tokens_in": r.tokens_in,
                    "tokens_out": r.tokens_out,
                    "tokens_reasoning": r.tokens_reasoning,
                    "tokens_total": r.tokens_total,
                    "cached_tokens": r.cached_tokens,
                    "cache_creation_tokens": r.cache_creation_tokens,
                    "cache_hit": r.cache_hit,
                    "output_tokens_per_s": rate,
                    "num_tool_calls": len(r.tool_calls),
                    "tool_names": [t.name for t in r.tool_calls],
                    "reasoning_content": r.reasoning_content,
                    "error_category": r.error_category,
                    "error_code": r.error_code,
                    "error_message": r.error_message,
                    "source": "store",
                    "path": path,
                    "line_number": entry.line_number,
                    "byte_offset": entry.byte_offset,
                    "line_bytes": entry.length,
                }
            )
            choices = tool_choice_indices(r.dialect, entry.data.get("response"))
            if choices is None or len(choices) != len(r.tool_calls):
                choices = [None] * len(r.tool_calls)
            for position, tool in enumerate(r.tool_calls):
                arguments = None if tool.arguments is None else orjson.dumps(tool.arguments)
                tool_rows.append(
                    {
                        "run": "exact",
                        "rollout_id": rollout_id,
                        "model_call_id": r.model_call_id,
                        "call_index": r.call_index,
                        "tool_index": position,
                        "choice_index": choices[position],
                        "call_id": tool.call_id,
                        "type": tool.type,
                        "name": tool.name,
                        "arguments": None if arguments is None else arguments.decode(),
                        "arguments_raw": tool.arguments_raw,
                        "arguments_parse_error": tool.arguments_parse_error,
                        "source": "store",
                    }
                )
    calls = pl.DataFrame(rows, schema=CALLS.polars, orient="row")
    tools = pl.DataFrame(tool_rows, schema=TOOL_CALLS.polars, orient="row")
    return (
        calls.sort("rollout_id", "call_index"),
        tools.sort("rollout_id", "call_index", "tool_index"),
    )


def _expected_rollout_metrics(big: BigStore) -> pl.DataFrame:
    rows = [{"rollout_id": rid, **m.model_dump()} for rid, m in big.metrics.items()]
    schema = {
        "rollout_id": pl.String(),
        "tokens_in": pl.Int64(),
        "tokens_out": pl.Int64(),
        "tokens_reasoning": pl.Int64(),
        "tokens_total": pl.Int64(),
        "cached_tokens": pl.Int64(),
        "latency_total_ms": pl.Float64(),
        "num_calls": pl.Int64(),
    }
    return pl.DataFrame(rows, schema=schema, orient="row").sort("rollout_id")


def _assert_exact(run: ngv.CaptureRun, big: BigStore) -> None:
    assert run.gaps.height == 0, run.gaps.head(3)
    assert run.calls.height == big.calls.height
    assert_frame_equal(run.calls, big.calls, check_exact=True, categorical_as_str=True)
    assert_frame_equal(run.tool_calls, big.tools, check_exact=True, categorical_as_str=True)
    metrics = _expected_rollout_metrics(big)
    got = run.rollouts.select(metrics.columns).sort("rollout_id")
    assert_frame_equal(got, metrics, check_exact=True)
    assert run.rollouts["rollout_id"].to_list() == sorted(big.rollout_ids)


def _sample_payloads(run: ngv.CaptureRun, big: BigStore) -> None:
    picks = ["0-0", "1-3", "250-1", "1999-2", "2499-3"]
    picks += [f"{n // 4}-{n % 4}" for n in (7, 1007, 2007, 3007)]  # hand-made lines
    for rollout_id in picks:
        for record in big.records[rollout_id]:
            assert record.model_call_id is not None
            got = run.payload(record.model_call_id, rollout_id=rollout_id)
            assert got == record  # every field, request and response included


def test_the_special_lines_reach_their_corners(big_store: BigStore) -> None:
    by_id = {r.model_call_id: r for recs in big_store.records.values() for r in recs}
    bare, tools, zero, error = (by_id[f"{n}-line"] for n in ("bare", "tools", "zero", "error"))
    assert bare.model_ref is None and bare.tokens_in is None and bare.started_at is None
    assert [t.arguments_parse_error for t in tools.tool_calls] == [True, False]
    assert tools.tool_calls[0].arguments_raw == "{not json"
    assert tools.tokens_in == 17 and tools.tokens_out is None
    assert (zero.tokens_in, zero.tokens_out, zero.finish_reason) == (0, 0, "length")
    assert (error.error_code, error.error_message) == ("internal", "boom")
    assert big_store.calls.height > 2 * len(big_store.rollout_ids) * 0.9
    assert len(big_store.rollout_ids) == ROLLOUTS_N


def test_calls_equal_records_cold_then_warm_index(big_store: BigStore, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    cold = ngv.open_run(big_store.root, label="exact", index_dir=index_dir, workers=1)
    assert cold.index_stats is not None
    assert (cold.index_stats.new, cold.index_stats.reused) == (ROLLOUTS_N, 0)
    assert cold.index_stats.bytes_parsed == big_store.total_bytes
    _assert_exact(cold, big_store)
    _sample_payloads(cold, big_store)

    warm = ngv.open_run(big_store.root, label="exact", index_dir=index_dir)
    assert warm.index_stats is not None
    assert (warm.index_stats.reused, warm.index_stats.bytes_parsed) == (ROLLOUTS_N, 0)
    _assert_exact(warm, big_store)
    _sample_payloads(warm, big_store)


def test_calls_equal_records_without_index(big_store: BigStore) -> None:
    run = ngv.open_run(big_store.root, label="exact", index=False, workers=1)
    assert run.index_stats is not None
    assert run.index_stats.bytes_parsed == big_store.total_bytes  # parsed, not read from an index
    assert not (big_store.root / ".ngcapture-index").exists()
    _assert_exact(run, big_store)
    _sample_payloads(run, big_store)


# -- schemas -----------------------------------------------------------------------------------


def test_every_frame_has_its_declared_schema(tmp_path: Path) -> None:
    synthetic = write_run(tmp_path / "ckpt", RunSpec(tasks=3, repeats=2, seed=1))
    (synthetic.capture_dir / "notes.txt").write_text("a gap")
    run = ngv.open_run(synthetic.capture_dir, synthetic.rollouts, index=False)
    assert run.calls.schema == CALLS.polars
    assert run.tool_calls.schema == TOOL_CALLS.polars
    assert run.gaps.schema == GAPS.polars
    # The rollouts frame: the declared columns, then the task fields of the records.
    assert run.rollouts.columns[: len(ROLLOUTS.names)] == ROLLOUTS.names
    assert run.rollouts.select(ROLLOUTS.names).schema == ROLLOUTS.polars
    extras = run.rollouts.columns[len(ROLLOUTS.names) :]  # task fields, after the declared ones
    assert "reward" not in extras and ATTACHMENT_KEY not in extras
    assert run.calls.schema["started_at"] == pl.Datetime("us", "UTC") == UTC_TIME
    assert run.rollouts.schema["completed_at"] == UTC_TIME
    for name in ("run", "model", "dialect", "outcome", "error_category", "source"):
        assert run.calls.schema[name] == pl.Categorical()
    assert run.gaps.schema["code"] == pl.Categorical()
    assert run.calls.height == synthetic.num_calls and run.gaps.height == 1
    assert run.tool_calls.height > 0
    for frame in (CALLS, ROLLOUTS, GAPS, TOOL_CALLS):
        assert frame.empty().schema == frame.polars


def test_empty_runs_keep_their_schemas(capture_dir: Path) -> None:
    run = ngv.open_run(capture_dir, index=False)
    assert (run.calls.height, run.rollouts.height, run.gaps.height) == (0, 0, 0)
    assert run.calls.schema == CALLS.polars
    assert run.rollouts.schema == ROLLOUTS.polars
    assert run.gaps.schema == GAPS.polars
    assert run.tool_calls.schema == TOOL_CALLS.polars


def test_unreported_tokens_stay_null(capture_dir: Path) -> None:
    bare = {"model_call_id": "bare", "dialect": "chat", "latency_ms": 5.0}
    zero = SPECIAL_LINES[2]
    write_capture(capture_dir, "0-0", [bare, {**bare, "model_call_id": "bare-2"}])
    write_capture(capture_dir, "0-1", [bare, zero])
    run = ngv.open_run(capture_dir, index=False)
    tokens = ["tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens"]
    calls = run.calls.select("rollout_id", "model_call_id", *tokens, "cache_hit")
    assert calls.rows() == [
        ("0-0", "bare", None, None, None, None, None, None),
        ("0-0", "bare-2", None, None, None, None, None, None),
        ("0-1", "bare", None, None, None, None, None, None),
        ("0-1", "zero-line", 0, 0, None, 0, None, None),
    ]
    totals = run.rollouts.select("rollout_id", *tokens, "latency_total_ms", "num_calls")
    assert totals.rows() == [
        ("0-0", None, None, None, None, None, 10.0, 2),
        ("0-1", 0, 0, None, 0, None, 5.0, 2),
    ]
    assert run.calls["output_tokens_per_s"].to_list() == [None, None, None, None]


def test_to_parquet_round_trips_every_frame(capture_dir: Path, tmp_path: Path) -> None:
    write_capture(capture_dir, "0-0", CaptureLineFactory(seed=2).lines(5))
    run = ngv.open_run(capture_dir, index=False)
    written = run.write_frames(tmp_path / "out")
    assert sorted(written) == ["calls", "compactions", "gaps", "invocations", "perf",
                               "rollouts", "sandboxes", "tokens", "tool_calls",
                               "tool_executions"]  # fmt: skip
    for name, path in written.items():
        back = pl.read_parquet(path)
        assert_frame_equal(back, getattr(run, name), categorical_as_str=True)


def _parts(rollout_id: str) -> tuple[int | None, int | None, int | None]:
    """The scalar reading: ``split_attempt``, then ``<task>-<rollout>`` (Int64 or unknown)."""
    parts = split_attempt(rollout_id)
    match = re.fullmatch(r"(\d+)-(\d+)", parts.base)
    indices = (None, None) if match is None else (int(match[1]), int(match[2]))
    task, rollout = (i if i is not None and i < 2**63 else None for i in indices)
    return task, rollout, parts.attempt if parts.attempt < 2**63 else None


def test_rollout_part_columns_agree_with_split_attempt() -> None:
    rng = random.Random(7)
    alphabet = "0123456789-a.b_"
    ids = ["3-2", "3-2-a1", "3-2-a0", "3-2-a01", "s7-3-2-a12", "custom-id", "0-0-a9-a3"]
    ids += ["7-1-a", "12-34-a5x", "1-2-3", "99999999999999999999-1", "1-1-a99999999999999999999"]
    ids += [
        "x" + "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(300)
    ]
    ids += [
        "".join(rng.choice("0123456789-a") for _ in range(rng.randint(1, 9))) for _ in range(300)
    ]
    ids = [i for i in ids if is_valid_rollout_id(i)]
    assert len(ids) > 400
    got = pl.DataFrame({"id": ids}).select(rollout_part_columns(pl.col("id"))).rows()
    assert got == [_parts(i) for i in ids]
    assert got[:3] == [(3, 2, 0), (3, 2, 1), (None, None, 0)]  # "3-2-a0" has no attempt


def test_token_limit_cuts_are_truncations_whatever_the_error_category(tmp_path: Path) -> None:
    written = write_run(tmp_path / "run", RunSpec(tasks=200, repeats=2, seed=4))
    run = ngv.open_run(written.capture_dir, written.rollouts)
    calls = run.calls.with_columns(pl.col("outcome", "error_category").cast(pl.String))
    limit = pl.col("finish_reason").cast(pl.String).is_in(list(LENGTH_FINISH_REASONS))
    cut = calls.filter(limit & pl.col("error_category").is_in(["incomplete"]))
    assert cut.height > 0  # the recorder files token-limit stops under "incomplete"
    assert set(cut["outcome"]) == {"length"}
    others = calls.filter(~limit & pl.col("error_category").is_not_null())
    assert (others["outcome"] == others["error_category"]).all()
    truncated = calls.filter(pl.col("outcome").is_in(["length", "stream_truncated"])).height
    assert truncated > cut.height  # stream cut-offs count too
    rate = ngv.summary_metrics(run)["truncation_rate"]
    assert rate == pytest.approx(truncated / calls.height)
    d = ngv.diff(run, run, metrics=["truncation_rate"], n_boot=0)
    assert d.row("truncation_rate")["value_a"] == pytest.approx(truncated / calls.height)
