"""The W&B export in offline mode: allowlisted tables, row counts, no payload text, summary.

wandb runs fully offline here: every directory it writes (run files, artifact staging, cache,
config) is a temporary directory of this module, and its service process is torn down at the
end. The offline run keeps its summary only in the binary ``.wandb`` log, which
:func:`wandb_records` reads (LevelDB-log framing of ``wandb_internal.Record`` protobufs).
"""

from __future__ import annotations

import json
import struct
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import ngcapture_viz as ngv
from ngcapture_viz.export import (
    ALLOWED_COLUMNS,
    DIGEST_COLUMNS,
    payload_free_tables,
    summary_metrics,
)
from ngcapture_viz.export.wandb import export_to_wandb, wandb_table_data
from tests.ngcapture_viz.test_export import planted_run

wandb = pytest.importorskip("wandb")

_WANDB_DIRS = ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR")


@pytest.fixture(scope="module")
def wandb_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Offline, silent, local-only wandb for the whole module; the service stops at the end."""
    root = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as patch:
        for variable in _WANDB_DIRS:
            path = root / variable.lower()
            path.mkdir()
            patch.setenv(variable, str(path))
        patch.setenv("WANDB_ARTIFACT_DIR", str(root / "wandb_artifact_dir"))
        for variable, value in {
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_DISABLE_GIT": "true",
            "WANDB_DISABLE_CODE": "true",
            "WANDB_CONSOLE": "off",
            "WANDB__DISABLE_STATS": "true",
            "WANDB__DISABLE_META": "true",
        }.items():
            patch.setenv(variable, value)
        yield root
        if wandb.run is not None:
            wandb.finish()
        wandb.teardown()


def wandb_records(path: Path) -> Iterator[Any]:
    """The ``Record`` protobufs of a ``.wandb`` file (32 KiB blocks, 7-byte chunk headers)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, position, pending = 32768, 7, b""
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:  # zero padding up to the end of the block
            position += left
            continue
        if position + 7 + length > len(data):
            return  # the writer is still flushing this chunk: the records before it are whole
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            pending = b""
            yield record
        else:  # first, middle
            pending += chunk


def finished_records(run_dir: Path, timeout: float = 20.0) -> list[Any]:
    """The records of the run's ``.wandb`` log, once its ``exit`` record is on disk.

    ``run.finish()`` can return before the wandb service has flushed the log's last block, so
    the test waits (bounded) for the run's final record before reading or searching anything;
    a chunk still being written is not read (parsing half of it failed a CI run at aaefb79).
    """
    (log,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    while True:
        records = list(wandb_records(log))
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{log} has no exit record after {timeout} s"
        time.sleep(0.05)


def offline_summary(run_dir: Path) -> dict[str, Any]:
    """The last value of every top-level summary key written to the run's ``.wandb`` log."""
    summary: dict[str, Any] = {}
    for record in finished_records(run_dir):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                if item.key:
                    summary[item.key] = json.loads(item.value_json)
    return summary


def logged_tables(run_dir: Path, prefix: str = "ngcapture") -> dict[str, dict[str, Any]]:
    """The table files of the run, by table name."""
    found = {}
    for path in (run_dir / "files" / "media" / "table" / prefix).glob("*.table.json"):
        found[path.name.rsplit("_", 2)[0]] = json.loads(path.read_text())
    return found


def files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_offline_export_logs_allowlisted_tables_summary_and_no_payload(
    wandb_root: Path, tmp_path: Path
) -> None:
    marker = f"PLANTED-{uuid.uuid4().hex}"
    run = planted_run(tmp_path / "ckpt-1", marker)
    assert files_holding(tmp_path / "ckpt-1", marker.encode())  # the marker is there to find

    result = export_to_wandb(run, project="ngcapture-test", name="leak-check", payload_digests=True)

    assert result.started_run
    assert wandb.run is None  # the run it started is finished
    assert result.run_dir is not None
    assert result.run_dir.is_relative_to(wandb_root)
    assert result.notes == []
    expected = payload_free_tables(run, payload_digests=True)
    tables = logged_tables(result.run_dir)
    assert set(tables) == {"calls", "rollouts", "gaps", "tool_calls"}
    for name, table in tables.items():
        digests = list(DIGEST_COLUMNS) if name == "calls" else []
        assert table["columns"] == [*ALLOWED_COLUMNS[name], *digests], name
        assert len(table["data"]) == getattr(run, name).height == result.rows[name], name
    data = tables["calls"]["data"]
    calls = {c: [row[i] for row in data] for i, c in enumerate(tables["calls"]["columns"])}
    assert calls["model_call_id"] == expected["calls"]["model_call_id"].to_list()
    assert calls["payload_sha256"] == expected["calls"]["payload_sha256"].to_list()
    assert calls["tokens_in"] == expected["calls"]["tokens_in"].to_list()

    # No payload text anywhere wandb wrote: run files, the binary log, artifact staging, cache.
    summary = offline_summary(result.run_dir)  # waits until the run's log is complete
    assert files_holding(wandb_root, marker.encode()) == []
    (log,) = result.run_dir.glob("run-*.wandb")
    assert b"ngcapture/latency_p50_ms" in log.read_bytes()  # the search does read the log
    first_id = expected["calls"]["model_call_id"][0].encode()
    assert files_holding(result.run_dir / "files", first_id)  # ...and the table files

    metrics = summary_metrics(run)
    assert summary["ngcapture/calls"] == run.calls.height
    assert summary["ngcapture/rollouts"] == 12
    assert summary["ngcapture/gaps"] == 1
    assert summary["ngcapture/calls_rows"] == run.calls.height
    for key in ("tokens_in", "latency_p50_ms", "latency_p99_ms", "ttft_p95_ms", "error_rate"):
        assert summary[f"ngcapture/{key}"] == pytest.approx(metrics[key]), key
    assert summary["ngcapture/gap_rate"] == pytest.approx(1 / 12)
    assert result.summary["ngcapture/calls"] == run.calls.height


def test_export_into_the_active_run_caps_rows_with_a_note(wandb_root: Path, tmp_path: Path) -> None:
    a = planted_run(tmp_path / "a", "PLANTED-a", label="ckpt-a", seed=1)
    b = planted_run(tmp_path / "b", "PLANTED-b", label="ckpt-b", seed=2)
    active = wandb.init(project="ngcapture-test", name="active")
    try:
        result = export_to_wandb([a, b], max_rows=10, prefix="cap")
        assert wandb.run is active  # left open: the caller owns it
    finally:
        active.finish()
    assert not result.started_run
    assert result.run_id == active.id
    assert result.rows == {"calls": 10, "rollouts": 10, "gaps": 2, "tool_calls": 10}
    assert result.total_rows["calls"] == a.calls.height + b.calls.height
    assert result.notes[0].startswith(f"calls: kept 10 of {result.total_rows['calls']} rows")
    assert [n.split(":")[0] for n in result.notes] == ["calls", "rollouts", "tool_calls"]
    assert result.run_dir is not None
    tables = logged_tables(result.run_dir, prefix="cap")
    assert len(tables["calls"]["data"]) == 10
    runs = [row[0] for row in tables["calls"]["data"]]
    assert runs == ["ckpt-a"] * 5 + ["ckpt-b"] * 5
    summary = offline_summary(result.run_dir)
    assert summary["cap/calls_rows_dropped"] == result.total_rows["calls"] - 10
    assert summary["cap/ckpt-a/calls"] == a.calls.height
    assert summary["cap/ckpt-b/calls"] == b.calls.height
    assert "cap/gaps_rows_dropped" not in summary


def test_refused_column_fails_before_any_run_starts(wandb_root: Path, tmp_path: Path) -> None:
    run = planted_run(tmp_path / "r", "PLANTED-r")
    before = sorted((wandb_root / "wandb_dir").rglob("run-*.wandb"))
    with pytest.raises(ngv.ExportError, match="'response'"):
        export_to_wandb(run, project="ngcapture-test", extra_columns=["response"])
    assert wandb.run is None
    assert sorted((wandb_root / "wandb_dir").rglob("run-*.wandb")) == before


def test_missing_wandb_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run = planted_run(tmp_path / "r", "PLANTED-r")
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ngv.MissingExtraError, match=r"pip install 'ngcapture\[wandb\]'") as error:
        export_to_wandb(run, project="p")
    assert isinstance(error.value, ImportError)


def test_table_data_converts_polars_types() -> None:
    frame = pl.DataFrame(
        {
            "at": [datetime(2026, 8, 1, 12, 0, 0, 250, tzinfo=UTC), None],
            "model": pl.Series(["m1", None], dtype=pl.Categorical()),
            "tool_names": [["search", "lookup"], []],
            "tokens": [3, None],
        }
    )
    columns, rows = wandb_table_data(frame)
    assert columns == ["at", "model", "tool_names", "tokens"]
    assert rows == [
        ["2026-08-01T12:00:00.000250Z", "m1", "search,lookup", 3],
        [None, None, "", None],
    ]
