"""open_run on damaged directories, strict mode, payloads, column selection and stacking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core.testing import CaptureLineFactory
from ngcapture_viz import DamagedSourceError, PayloadUnavailableError, SourceError
from ngcapture_viz.frames import CALLS, GAPS, ROLLOUTS, TOOL_CALLS
from tests.ngcapture_viz.conftest import write_capture

GAP_COLUMNS = ["rollout_id", "model_call_id", "call_index", "code", "source"]
GAP_COLUMNS += ["path", "line_number", "byte_offset"]


def _damaged_dir(capture_dir: Path, factory: CaptureLineFactory) -> dict[str, Any]:
    """Every kind of problem a capture directory can hold; returns where each one is."""
    a, b, c, d = (line.to_jsonl() for line in factory.lines(4))
    garbage = b"{garbage\n"
    array = b"[1, 2]\n"
    wrong = b'{"model_call_id": "wrong", "dialect": "chat", "status_code": "abc"}\n'
    tail = d[:40]
    parts = [a, garbage, b, array, wrong, c, tail]
    offsets = [sum(len(p) for p in parts[:n]) for n in range(len(parts))]
    write_capture(capture_dir, "0-0", parts)
    (capture_dir / "0-1.capture.incomplete").write_bytes(b"")
    write_capture(capture_dir, "0-2", [])
    (capture_dir / "notes.txt").write_text("not capture data")
    write_capture(capture_dir, "bad id", [a])
    (capture_dir / ".pending").mkdir()
    (capture_dir / ".pending" / "0-3@call-9").write_bytes(b"")
    return {"offsets": offsets, "lines": (a, b, c)}


def test_a_damaged_directory_loads_and_lists_every_problem(
    capture_dir: Path, line_factory: CaptureLineFactory
) -> None:
    where = _damaged_dir(capture_dir, line_factory)
    offsets = where["offsets"]
    run = ngv.open_run(capture_dir, index=False)
    data = str(capture_dir / "0-0.capture.jsonl")
    store = "store"
    damaged = "capture_line_damaged"
    expected = [
        ("0-0", None, 1, damaged, store, data, 2, offsets[1]),
        ("0-0", None, 3, damaged, store, data, 4, offsets[3]),
        ("0-0", None, 4, damaged, store, data, 5, offsets[4]),
        ("0-0", None, 6, damaged, store, data, 7, offsets[6]),
        (
            "0-1",
            None,
            None,
            "model_call_capture_incomplete",
            store,
            str(capture_dir / "0-1.capture.incomplete"),
            None,
            None,
        ),
        ("0-2", None, None, "capture_file_empty", store, data.replace("0-0", "0-2"), None, None),
        (
            "0-3",
            "call-9",
            None,
            "model_call_capture_pending",
            store,
            str(capture_dir / ".pending" / "0-3@call-9"),
            None,
            None,
        ),
        (
            None,
            None,
            None,
            "capture_dir_foreign_file",
            store,
            str(capture_dir / "bad id.capture.jsonl"),
            None,
            None,
        ),
        (
            None,
            None,
            None,
            "capture_dir_foreign_file",
            store,
            str(capture_dir / "notes.txt"),
            None,
            None,
        ),
    ]
    got = run.gaps.select(GAP_COLUMNS).with_columns(pl.col("code", "source").cast(pl.String))
    assert got.rows() == expected
    details = run.gaps["detail"].to_list()
    assert details[1] == "a JSON array, not an object"
    assert details[2].startswith("field 'status_code'")
    assert details[3] == "torn line at end of file (no newline)"
    # The readable lines keep their call_index and location between the damaged ones.
    assert run.calls.select("call_index", "line_number", "byte_offset").rows() == [
        (0, 1, offsets[0]),
        (2, 3, offsets[2]),
        (5, 6, offsets[5]),
    ]
    facts = run.rollouts.select(
        "rollout_id", "incomplete", "pending_writes", "num_calls", "num_gaps", "num_damaged"
    )
    assert facts.rows() == [
        ("0-0", False, 0, 3, 4, 4),
        ("0-1", True, 0, 0, 1, 0),
        ("0-2", False, 0, 0, 1, 0),
        ("0-3", False, 1, 0, 1, 0),
    ]


def test_the_index_reports_the_same_gaps_as_a_plain_read(
    capture_dir: Path, line_factory: CaptureLineFactory
) -> None:
    _damaged_dir(capture_dir, line_factory)
    plain = ngv.open_run(capture_dir, index=False)
    cold = ngv.open_run(capture_dir)
    warm = ngv.open_run(capture_dir)
    assert warm.index_stats is not None and warm.index_stats.bytes_parsed > 0  # torn tail
    for run in (cold, warm):
        assert run.gaps.rows() == plain.gaps.rows()
        assert run.calls.rows() == plain.calls.rows()


def test_strict_raises_naming_the_first_problem(
    capture_dir: Path, line_factory: CaptureLineFactory
) -> None:
    _damaged_dir(capture_dir, line_factory)
    with pytest.raises(DamagedSourceError) as raised:
        ngv.open_run(capture_dir, label="damaged", strict=True, index=False)
    message = str(raised.value)
    assert message.startswith("9 gap(s) in run 'damaged'; first: capture_line_damaged")
    assert message.endswith(f"at {capture_dir / '0-0.capture.jsonl'}:2")
    assert len(raised.value.gaps) == 9
    assert raised.value.gaps[0]["line_number"] == 2


def test_strict_passes_on_clean_data(capture_dir: Path, line_factory: CaptureLineFactory) -> None:
    write_capture(capture_dir, "0-0", line_factory.lines(2))
    run = ngv.open_run(capture_dir, strict=True, index=False)
    assert run.calls.height == 2 and run.gaps.height == 0


def test_missing_sources_raise_source_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="needs a capture directory"):
        ngv.open_run()
    with pytest.raises(SourceError, match="does not exist"):
        ngv.open_run(tmp_path / "nope")
    with pytest.raises(SourceError, match="does not exist"):
        ngv.open_run(rollouts=tmp_path / "nope.jsonl")
    (tmp_path / "file").write_text("x")
    with pytest.raises(SourceError, match="is not a directory"):
        ngv.open_run(tmp_path / "file")
    with pytest.raises(SourceError, match="is a directory"):
        ngv.open_run(rollouts=tmp_path)


def test_payload_reads_the_line_back_and_refuses_what_it_cannot(
    capture_dir: Path, line_factory: CaptureLineFactory
) -> None:
    lines = list(line_factory.lines(3))
    write_capture(capture_dir, "0-0", lines[:2])
    write_capture(capture_dir, "0-1", [lines[2], lines[0]])  # lines[0] twice
    run = ngv.open_run(capture_dir, index=False)
    record = run.payload(lines[1].model_call_id)
    assert record.request == lines[1].request and record.response == lines[1].response
    with pytest.raises(PayloadUnavailableError, match="pass rollout_id"):
        run.payload(lines[0].model_call_id)
    assert run.payload(lines[0].model_call_id, rollout_id="0-1").call_index == 1
    with pytest.raises(PayloadUnavailableError, match="no call with model_call_id 'nope'"):
        run.payload("nope")
    # Rewritten since the run was opened: refused, not a wrong payload.
    write_capture(capture_dir, "0-0", [lines[2], lines[2]])
    with pytest.raises(PayloadUnavailableError, match=r"open (the run|it) again"):
        run.payload(lines[1].model_call_id)


@pytest.mark.parametrize(
    ("function", "schema"),
    [
        (ngv.calls_df, CALLS),
        (ngv.rollouts_df, ROLLOUTS),
        (ngv.gaps_df, GAPS),
        (ngv.tool_calls_df, TOOL_CALLS),
    ],
)
def test_columns_selection(
    function: Any, schema: ngv.FrameSchema, capture_dir: Path, line_factory: CaptureLineFactory
) -> None:
    write_capture(capture_dir, "0-0", line_factory.lines(12))
    (capture_dir / "notes.txt").write_text("x")  # one gap row
    full = function(capture_dir, index=False)
    assert full.schema == schema.polars
    assert full.height > 0
    picked = function(capture_dir, columns=["rollout_id", "run"], index=False)
    assert picked.columns == ["rollout_id", "run"]
    assert picked.rows() == full.select("rollout_id", "run").rows()
    with pytest.raises(ValueError, match=r"unknown .* column") as raised:
        function(capture_dir, columns=["rollout_id", "nope"], index=False)
    assert "'nope'" in str(raised.value)
    assert "valid columns" in str(raised.value) and "'rollout_id'" in str(raised.value)


def test_open_runs_stacks_with_a_run_column(tmp_path: Path) -> None:
    dirs = {}
    for label, (seed, n) in {"ckpt-100": (1, 3), "ckpt-200": (2, 5)}.items():
        root = tmp_path / label / "model-calls"
        root.mkdir(parents=True)
        write_capture(root, "0-0", CaptureLineFactory(seed).lines(n))
        dirs[label] = root
    both = ngv.open_runs({"ckpt-100": (dirs["ckpt-100"], None), "ckpt-200": dirs["ckpt-200"]})
    assert both.label is None and both.labels == ["ckpt-100", "ckpt-200"]
    assert both.calls.schema == CALLS.polars
    assert both.rollouts.schema == ROLLOUTS.polars
    counts = both.calls.group_by("run").len().sort("run").rows()
    assert [(str(r), n) for r, n in counts] == [("ckpt-100", 3), ("ckpt-200", 5)]
    assert both.rollouts.select(pl.col("run").cast(pl.String), "num_calls").rows() == [
        ("ckpt-100", 3),
        ("ckpt-200", 5),
    ]
    assert both.runs["ckpt-200"].calls.height == 5
    # A payload of a stacked run is still found by its id.
    call_id = both.runs["ckpt-200"].calls["model_call_id"][0]
    assert both.payload(call_id).model_call_id == call_id


def test_stacked_runs_with_the_same_call_ids_take_a_run_label(tmp_path: Path) -> None:
    dirs = {}
    for label in ("ckpt-100", "ckpt-200"):
        root = tmp_path / label / "model-calls"
        root.mkdir(parents=True)
        write_capture(root, "0-0", CaptureLineFactory(7).lines(2))  # same ids in both runs
        dirs[label] = root
    # Lists work as well as tuples; anything else is refused with the expected shape.
    both = ngv.open_runs({label: [root, None] for label, root in dirs.items()})
    call_id = both.calls["model_call_id"][0]
    with pytest.raises(PayloadUnavailableError, match="pass run=") as raised:
        both.payload(call_id, rollout_id="0-0")
    assert "ckpt-100" in str(raised.value) and "ckpt-200" in str(raised.value)
    record = both.payload(call_id, run="ckpt-200")
    assert record.model_call_id == call_id
    assert record.request == both.runs["ckpt-200"].payload(call_id).request
    with pytest.raises(PayloadUnavailableError, match="no run 'ckpt-300'"):
        both.payload(call_id, run="ckpt-300")
    with pytest.raises(SourceError, match=r"run 'x' is .*expected a capture directory or a"):
        ngv.open_runs({"x": (dirs["ckpt-100"], None, None)})
    with pytest.raises(SourceError, match="run 'y' is 3"):
        ngv.open_runs({"y": 3})  # type: ignore[dict-item]


def test_duplicate_labels_raise(capture_dir: Path, line_factory: CaptureLineFactory) -> None:
    write_capture(capture_dir, "0-0", line_factory.lines(1))
    one = ngv.open_run(capture_dir, label="same", index=False)
    two = ngv.open_run(capture_dir, label="same", index=False)
    with pytest.raises(SourceError, match="two runs are labelled 'same'"):
        ngv.stack_runs([one, two])
    with pytest.raises(SourceError, match="at least one run"):
        ngv.open_runs({})
