"""Payload-free tables, summary metrics, row caps and the Parquet export (no wandb needed)."""

from __future__ import annotations

import hashlib
import re
import statistics
import uuid
from pathlib import Path

import orjson
import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core.testing import RunSpec, write_run
from ngcapture_viz.export import (
    ALLOWED_COLUMNS,
    DIGEST_COLUMNS,
    PAYLOAD_COLUMNS,
    cap_rows,
    payload_free_tables,
    summary_metrics,
    to_parquet,
)

DOC = Path(__file__).parents[2] / "docs" / "wandb-export.md"


def planted_run(root: Path, marker: str, *, label: str = "ckpt-1", seed: int = 0) -> ngv.CaptureRun:
    """A run whose payloads, one damaged line and one rollout field all carry ``marker``."""
    synthetic = write_run(root, RunSpec(tasks=6, repeats=2, seed=seed, marker=marker))
    first = synthetic.capture_dir / f"{synthetic.rollout_ids[0]}.capture.jsonl"
    with first.open("ab") as out:  # a damaged line holding payload text: a gap, never exported
        out.write(b'{"request": {"note": "' + marker.encode() + b'"}, broken\n')
    records = [orjson.loads(line) for line in synthetic.rollouts.read_bytes().splitlines()]
    for n, record in enumerate(records):
        record["question"] = f"question {n}"
        record["output_text"] = f"the answer is {marker}"
    synthetic.rollouts.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return ngv.open_run(synthetic.capture_dir, synthetic.rollouts, label=label, index=False)


@pytest.fixture
def marker() -> str:
    return f"PLANTED-{uuid.uuid4().hex}"


@pytest.fixture
def run(tmp_path: Path, marker: str) -> ngv.CaptureRun:
    return planted_run(tmp_path / "ckpt-1", marker)


def as_text(frame: pl.DataFrame) -> str:
    return frame.write_json()


def test_tables_hold_exactly_the_allowlisted_columns_and_every_row(
    run: ngv.CaptureRun, marker: str
) -> None:
    first = run.calls.row(0, named=True)
    payload = run.payload(first["model_call_id"], rollout_id=first["rollout_id"])
    assert marker in payload.model_dump_json()  # every payload carries the marker...
    assert marker in as_text(run.rollouts)  # ...and so does a task field of the frame...
    tables = payload_free_tables(run)
    assert set(tables) == {"calls", "rollouts", "gaps", "tool_calls"}
    for name, table in tables.items():
        assert table.columns == list(ALLOWED_COLUMNS[name]), name
        assert table.height == getattr(run, name).height, name
        assert not set(table.columns) & PAYLOAD_COLUMNS
        assert marker not in as_text(table), name  # ...but in no exported table
    assert run.gaps["code"].cast(pl.String).to_list() == ["capture_line_damaged"]
    assert tables["gaps"]["detail"][0] == run.gaps["detail"][0]
    # Paths shrink to file names: no user or machine name leaves.
    assert tables["calls"]["file"].to_list() == [Path(p).name for p in run.calls["path"]]
    assert all("/" not in f for f in tables["rollouts"]["file"].drop_nulls())
    ordered = tables["calls"].select("rollout_id", "call_index").rows()
    assert ordered == sorted(ordered)


def test_extra_columns_are_added_on_request(run: ngv.CaptureRun) -> None:
    tables = payload_free_tables(run, extra_columns=["question", "error_message", "path"])
    assert tables["rollouts"].columns[-2:] == ["question", "path"]
    assert (
        tables["rollouts"]["question"].to_list()
        == run.rollouts.sort("rollout_id")["question"].to_list()
    )
    assert tables["calls"].columns[-2:] == ["error_message", "path"]
    assert tables["gaps"].columns[-1] == "path"
    assert "question" not in tables["calls"].columns


def test_paths_are_relative_to_the_capture_directory_unless_asked(
    run: ngv.CaptureRun, tmp_path: Path
) -> None:
    assert run.capture_dir is not None and run.rollouts_path is not None
    tables = payload_free_tables(run, extra_columns=["path"])
    local = str(tmp_path)
    with_paths = {name: t for name, t in tables.items() if "path" in t.columns}
    assert set(with_paths) == {"calls", "rollouts", "gaps"}
    for name, table in with_paths.items():
        assert not any(local in (p or "") for p in table["path"].to_list()), name
    calls = tables["calls"].join(
        run.calls.select("rollout_id", "call_index", pl.col("path").alias("absolute")),
        on=["rollout_id", "call_index"],
    )
    for relative, absolute in calls.select("path", "absolute").rows():
        assert Path(absolute) == run.capture_dir / relative
    rollouts = tables["rollouts"].filter(pl.col("path").is_not_null())
    assert rollouts.height and all(p.endswith(".capture.jsonl") for p in rollouts["path"])
    kept = payload_free_tables(run, extra_columns=["path"], absolute_paths=True)
    assert (
        kept["calls"]["path"].to_list()
        == run.calls.sort("rollout_id", "call_index")["path"].to_list()
    )
    written = to_parquet(run, tmp_path / "parquet", extra_columns=["path"])
    assert local not in str(pl.read_parquet(written["calls"])["path"].to_list())


@pytest.mark.parametrize(
    "column",
    [
        "request",
        "response",
        "request_raw",
        "response_raw",
        "ng_trajectory",
        "reasoning_content",
        "arguments",
        "arguments_raw",
        "output_text",
        "task_response",
    ],
)
def test_payload_columns_are_refused_even_when_asked_for(
    run: ngv.CaptureRun, column: str, tmp_path: Path
) -> None:
    with pytest.raises(ngv.ExportError, match=re.escape(repr(column))):
        payload_free_tables(run, extra_columns=["question", column])
    with pytest.raises(ngv.ExportError, match="never exported"):
        to_parquet(run, tmp_path / "out", extra_columns=[column])
    assert not (tmp_path / "out").exists()


def test_unknown_extra_column_names_the_choices(run: ngv.CaptureRun) -> None:
    with pytest.raises(ngv.ExportError, match=r"'nope' is in no frame.*'question'"):
        payload_free_tables(run, extra_columns=["nope"])


def test_payload_digests_hash_the_exact_capture_line(run: ngv.CaptureRun, marker: str) -> None:
    calls = payload_free_tables(run, payload_digests=True)["calls"]
    assert calls.columns[-2:] == list(DIGEST_COLUMNS)
    assert calls["payload_sha256"].null_count() == 0
    assert calls["payload_bytes"].to_list() == calls["line_bytes"].to_list()
    store = run.capture_dir
    assert store is not None
    for row in calls.head(8).iter_rows(named=True):
        line = (store / row["file"]).read_bytes()[row["byte_offset"] :][: row["line_bytes"]]
        assert marker.encode() in line  # the digest is of the payload line itself
        assert row["payload_sha256"] == hashlib.sha256(line).hexdigest()
        record = orjson.loads(line)
        assert record["model_call_id"] == row["model_call_id"]
    assert calls["payload_sha256"].n_unique() == calls.height


def test_payload_digests_are_null_without_a_store(tmp_path: Path) -> None:
    synthetic = write_run(tmp_path / "r", RunSpec(tasks=2, repeats=1))
    only_file = ngv.open_run(None, synthetic.rollouts)
    calls = payload_free_tables(only_file, payload_digests=True)["calls"]
    assert calls.height == synthetic.num_calls
    assert calls["payload_sha256"].null_count() == calls.height
    assert calls["payload_bytes"].null_count() == calls.height


def test_summary_metrics_match_an_independent_computation(run: ngv.CaptureRun) -> None:
    metrics = summary_metrics(run)
    calls = run.calls.to_dicts()
    latencies = sorted(c["latency_total_ms"] for c in calls if c["latency_total_ms"] is not None)
    assert metrics["calls"] == len(calls) == run.calls.height
    assert metrics["rollouts"] == 12
    assert metrics["gaps"] == 1
    assert metrics["tokens_in"] == sum(c["tokens_in"] for c in calls if c["tokens_in"] is not None)
    reported = sum(c["tokens_out"] is not None for c in calls)
    assert metrics["tokens_out_coverage"] == pytest.approx(reported / len(calls))
    assert metrics["latency_p50_ms"] == pytest.approx(statistics.median(latencies))
    assert metrics["latency_p90_ms"] == pytest.approx(
        statistics.quantiles(latencies, n=10, method="inclusive")[-1]
    )
    errors = sum(c["error_category"] is not None for c in calls)
    assert metrics["error_rate"] == pytest.approx(errors / len(calls))
    assert metrics["gap_rate"] == pytest.approx(1 / 12)  # the damaged line's rollout
    ttft = [c["latency_ttft_ms"] for c in calls if c["latency_ttft_ms"] is not None]
    assert metrics["ttft_coverage"] == pytest.approx(len(ttft) / len(calls))


def test_summary_metrics_are_unknown_not_zero_without_calls() -> None:
    empty = ngv.CaptureRun(
        "empty",
        calls=ngv.CALLS.empty(),
        rollouts=ngv.ROLLOUTS.empty(),
        gaps=ngv.GAPS.empty(),
        tool_calls=ngv.TOOL_CALLS.empty(),
    )
    metrics = summary_metrics(empty)
    assert metrics["calls"] == 0
    assert metrics["tokens_in"] is None
    assert metrics["latency_p95_ms"] is None
    assert metrics["error_rate"] is None
    assert metrics["gap_rate"] is None


def test_stacked_runs_prefix_metrics_and_share_the_row_cap(tmp_path: Path, marker: str) -> None:
    a = planted_run(tmp_path / "a", marker, label="ckpt-a", seed=1)
    b = planted_run(tmp_path / "b", marker, label="ckpt-b", seed=2)
    metrics = summary_metrics([a, b])
    assert metrics["ckpt-a/calls"] == a.calls.height
    assert metrics["ckpt-b/latency_p50_ms"] == summary_metrics(b)["latency_p50_ms"]
    assert "calls" not in metrics

    tables = payload_free_tables([a, b])
    assert tables["calls"].height == a.calls.height + b.calls.height
    capped, notes = cap_rows(tables, 20)
    assert capped["calls"].height == 20
    assert capped["calls"].group_by("run").len().sort("run")["len"].to_list() == [10, 10]
    first = tables["calls"].filter(pl.col("run") == "ckpt-a").head(10)
    assert capped["calls"].filter(pl.col("run") == "ckpt-a").equals(first)
    assert capped["rollouts"].height == 20
    assert capped["gaps"] is tables["gaps"]  # 2 rows: not capped
    assert [note.split(":")[0] for note in notes] == [
        name for name, table in tables.items() if table.height > 20
    ]
    assert notes[1] == (
        "rollouts: kept 20 of 24 rows (the row limit); "
        "the first rows of each run in table order were kept, the rest were not exported"
    )
    again, _ = cap_rows(payload_free_tables([a, b]), 20)
    assert again["calls"].equals(capped["calls"])
    with pytest.raises(ngv.ExportError, match="at least 1"):
        cap_rows(tables, 0)


def test_to_parquet_writes_the_same_payload_free_tables(
    run: ngv.CaptureRun, marker: str, tmp_path: Path
) -> None:
    written = to_parquet(run, tmp_path / "out", payload_digests=True)
    assert sorted(written) == ["calls", "gaps", "rollouts", "tool_calls"]
    expected = payload_free_tables(run, payload_digests=True)
    for name, path in written.items():
        assert path == tmp_path / "out" / f"{name}.parquet"
        assert pl.read_parquet(path).equals(expected[name]), name
        assert marker.encode() not in path.read_bytes()


def test_the_doc_lists_every_allowlisted_and_refused_column() -> None:
    text = DOC.read_text()
    for name, columns in ALLOWED_COLUMNS.items():
        section = text.split(f"### {name}", 1)[1].split("###", 1)[0]
        for column in columns:
            assert f"`{column}`" in section, (name, column)
    for column in (*PAYLOAD_COLUMNS, *DIGEST_COLUMNS):
        assert f"`{column}`" in text, column
