"""Rollout JSONL files: damaged records, rollout-only runs, and store vs attachment disagreements."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core import (
    ATTACHMENT_KEY,
    ModelCallCaptureAttachment,
    RawCaptureLine,
    aggregate_model_call_records,
    normalize_line,
)
from capture_core.testing import CaptureLineFactory, RunSpec, write_run
from ngcapture_viz import PayloadUnavailableError
from ngcapture_viz.frames import CALLS, GAPS, ROLLOUTS, TOOL_CALLS
from ngcapture_viz.load.rollouts import read_rollouts
from tests.ngcapture_viz.conftest import write_capture

GAP_COLUMNS = ["rollout_id", "model_call_id", "call_index", "code", "source", "line_number"]


def _attachment(rollout_id: str, lines: list[RawCaptureLine], **metrics: Any) -> dict[str, Any]:
    calls = [normalize_line(line.to_json_dict(), i) for i, line in enumerate(lines)]
    totals = aggregate_model_call_records(calls).model_copy(update=metrics)
    attached = ModelCallCaptureAttachment(rollout_id=rollout_id, metrics=totals, calls=calls)
    return attached.to_json_dict()


def _record(rollout_id: str, lines: list[RawCaptureLine], **extra: Any) -> bytes:
    body = {"task_id": f"task-{rollout_id}", "reward": 0.5, ATTACHMENT_KEY: None, **extra}
    body[ATTACHMENT_KEY] = _attachment(rollout_id, lines)
    return orjson.dumps(body) + b"\n"


def _gaps(run: ngv.CaptureRun) -> list[tuple[Any, ...]]:
    frame = run.gaps.select(GAP_COLUMNS).with_columns(pl.col("code", "source").cast(pl.String))
    return frame.rows()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "looks binary, not JSON lines): 3 of 3"),
        (b"[1, 2, 3]\n", "1 of 1 line(s) are not rollout records; first at line 1: a JSON list"),
        (b"", "is empty"),
        (b"\n \n", "is empty"),
        (b"id,reward\n0,1.0\n", "2 of 2 line(s) are not rollout records; first at line 1"),
        (b'{"_ng_task_index": 0, "_ng_rollout_index": 0}\n"text"\n', "1 of 2 line(s)"),
    ],
    ids=["binary", "array", "empty", "blank", "csv", "one-bad"],
)
def test_a_file_that_is_not_rollouts_warns_once_with_counts(
    tmp_path: Path, content: bytes, says: str
) -> None:
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(content)
    with pytest.warns(ngv.RolloutFileWarning) as caught:
        ngv.open_run(rollouts=rollouts)
    assert len(caught) == 1
    assert str(rollouts) in str(caught[0].message) and says in str(caught[0].message)
    assert issubclass(ngv.RolloutFileWarning, UserWarning)


def test_the_rollout_file_warning_can_be_filtered_or_raised(tmp_path: Path) -> None:
    import warnings

    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(b"[1]\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ngv.RolloutFileWarning)
        assert ngv.open_run(rollouts=rollouts).rollouts.height == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", ngv.RolloutFileWarning)
        with pytest.raises(ngv.RolloutFileWarning, match="not rollout records"):
            ngv.open_run(rollouts=rollouts)


def test_a_good_rollout_file_does_not_warn(tmp_path: Path) -> None:
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(b'{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1}\n\n')
    assert ngv.open_run(rollouts=rollouts).rollouts.height == 1  # warnings are errors here


def test_damaged_rollout_records_become_gap_rows(
    tmp_path: Path, line_factory: CaptureLineFactory
) -> None:
    lines = list(line_factory.lines(3))
    rollouts = tmp_path / "rollouts.jsonl"
    content = [
        _record("0-0", lines[:1]),  # 1
        b"{garbage\n",  # 2
        b"[1, 2]\n",  # 3
        b"\n",  # 4: blank, skipped silently
        b'{"reward": 1.0}\n',  # 5: no rollout id anywhere
        _record("0-1", lines[1:2]),  # 6
        _record("0-0", lines[:2], reward=1.0),  # 7: duplicate, supersedes line 1
        orjson.dumps(  # 8: unreadable attachment, id from the task indices
            {"_ng_task_index": 0, "_ng_rollout_index": 2, ATTACHMENT_KEY: {"metrics": 3}}
        )
        + b"\n",
        _record("0-0", lines[:3], reward=0.25),  # 9: a third record of 0-0, the one used
    ]
    rollouts.write_bytes(b"".join(content))
    said = re.escape("3 of 8 line(s) are not rollout records; first at line 2: not valid JSON")
    with pytest.warns(ngv.RolloutFileWarning, match=said):
        source = read_rollouts(rollouts)
    assert source.lines == 8
    assert [r.line_number for r in source.records] == [1, 6, 7, 8, 9]
    with pytest.warns(ngv.RolloutFileWarning, match=said):
        run = ngv.open_run(rollouts=rollouts)
    assert _gaps(run) == [
        ("0-0", None, None, "rollout_duplicated", "rollouts", 7),
        ("0-0", None, None, "rollout_duplicated", "rollouts", 9),
        ("0-2", None, None, "attachment_unreadable", "rollouts", 8),
        (None, None, None, "rollout_line_damaged", "rollouts", 2),
        (None, None, None, "rollout_line_damaged", "rollouts", 3),
        (None, None, None, "rollout_without_id", "rollouts", 5),
    ]
    offsets = [sum(len(c) for c in content[:n]) for n in range(len(content))]
    assert run.gaps["byte_offset"].to_list() == [
        offsets[6],
        offsets[8],
        offsets[7],
        offsets[1],
        offsets[2],
        offsets[4],
    ]
    assert set(run.gaps["path"].to_list()) == {str(rollouts)}
    details = dict(
        zip(run.gaps["line_number"].to_list(), run.gaps["detail"].to_list(), strict=True)
    )
    assert details[3] == "a JSON list, not an object"
    assert details[7] == "first seen on line 1; the last record of this id is used"
    assert details[9] == "first seen on line 1; the last record of this id is used"
    assert details[8].startswith(f"{ATTACHMENT_KEY}.")
    # The last duplicate wins: its reward and its three calls.
    rows = run.rollouts.select("rollout_id", "reward", "num_calls", "rollouts_line").rows()
    # 0-2's attachment is unreadable: its number of calls is unknown, not 0.
    assert rows == [("0-0", 0.25, 3, 9), ("0-1", 0.5, 1, 6), ("0-2", None, None, 8)]
    assert run.rollouts["in_store"].to_list() == [None, None, None]
    assert run.rollouts["in_rollouts"].to_list() == [True, True, True]


def test_a_rollout_only_run_takes_its_calls_from_the_attachments(tmp_path: Path) -> None:
    synthetic = write_run(tmp_path / "ckpt", RunSpec(tasks=4, repeats=2, calls=(1, 4), seed=3))
    both = ngv.open_run(synthetic.capture_dir, synthetic.rollouts, index=False)
    alone = ngv.open_run(rollouts=synthetic.rollouts)
    assert alone.label == "rollouts"
    assert alone.calls.schema == CALLS.polars and alone.rollouts.schema.get("run") is not None
    assert alone.gaps.height == 0
    assert alone.calls.height == synthetic.num_calls
    assert alone.calls["source"].cast(pl.String).unique().to_list() == ["attachment"]
    assert alone.calls["path"].null_count() == alone.calls.height
    # Every metric column agrees with the store's rows of the same calls.
    metrics = [c for c in CALLS.names if c not in {"run", "source", "path", "line_number"}]
    metrics = [c for c in metrics if c not in {"byte_offset", "line_bytes"}]
    assert alone.calls.select(metrics).rows() == both.calls.select(metrics).rows()
    assert (
        # choice_index comes from the stored response: an attachment alone cannot tell it.
        alone.tool_calls.drop("run", "source", "choice_index").rows()
        == both.tool_calls.drop("run", "source", "choice_index").rows()
    )
    assert alone.rollouts["reward"].to_list() == both.rollouts["reward"].to_list()
    assert alone.rollouts["tokens_total"].to_list() == both.rollouts["tokens_total"].to_list()
    call_id = alone.calls["model_call_id"][0]
    with pytest.raises(PayloadUnavailableError) as raised:
        alone.payload(call_id)
    assert str(raised.value) == (
        f"call {call_id!r} is known only from a rollout attachment, which keeps no payloads; "
        "open the run with its capture directory"
    )


def test_store_and_attachment_disagreements_are_gaps_and_nothing_is_dropped(
    capture_dir: Path, line_factory: CaptureLineFactory
) -> None:
    a, b, c, d, x = line_factory.lines(5)
    write_capture(capture_dir, "0-0", [a, b])
    write_capture(capture_dir, "0-1", [c])
    write_capture(capture_dir, "0-3", [d])  # no record in the rollout file
    rollouts = capture_dir.parent / "rollouts.jsonl"
    bad_totals = _attachment("0-1", [c], tokens_in=123456789)
    rollouts.write_bytes(
        _record("0-0", [a, x])  # x is not in the store, b is not in the attachment
        + orjson.dumps({"task_id": "t1", "reward": 1.0, ATTACHMENT_KEY: bad_totals})
        + b"\n"
        + _record("0-2", [d])  # no capture in the store
    )
    run = ngv.open_run(capture_dir, rollouts, index=False)
    assert _gaps(run) == [
        ("0-0", b.model_call_id, 1, "call_not_in_attachment", "comparison", 2),
        ("0-0", x.model_call_id, 1, "call_not_in_store", "comparison", 1),
        ("0-0", None, None, "attachment_totals_differ", "comparison", 1),
        ("0-1", None, None, "attachment_totals_differ", "comparison", 2),
        ("0-2", None, None, "rollout_not_in_store", "comparison", 3),
        ("0-3", None, None, "rollout_not_in_rollouts", "comparison", None),
    ]
    details = run.gaps["detail"].to_list()
    assert details[3] == f"tokens_in: store {c_tokens(run)} vs attachment 123456789"
    assert "num_calls: store 2 vs attachment 2" not in details[2]
    # Nothing dropped: the store's calls, plus the attachment-only calls marked as such.
    calls = run.calls.select("rollout_id", "model_call_id", pl.col("source").cast(pl.String))
    assert calls.rows() == [
        ("0-0", a.model_call_id, "store"),
        ("0-0", b.model_call_id, "store"),
        ("0-0", x.model_call_id, "attachment"),
        ("0-1", c.model_call_id, "store"),
        ("0-2", d.model_call_id, "attachment"),
        ("0-3", d.model_call_id, "store"),
    ]
    facts = run.rollouts.select("rollout_id", "in_store", "in_rollouts", "num_calls", "num_gaps")
    assert facts.rows() == [
        ("0-0", True, True, 3, 3),
        ("0-1", True, True, 1, 1),
        ("0-2", False, True, 1, 1),
        ("0-3", True, False, 1, 1),
    ]
    assert run.gaps.schema == GAPS.polars and run.tool_calls.schema == TOOL_CALLS.polars
    assert run.rollouts.select(ROLLOUTS.names).schema == ROLLOUTS.polars


def c_tokens(run: ngv.CaptureRun) -> int:
    """The store's prompt tokens of rollout 0-1."""
    value = run.calls.filter(pl.col("rollout_id") == "0-1")["tokens_in"].item()
    assert isinstance(value, int)
    return value


def test_task_fields_stay_on_their_rollout(capture_dir: Path) -> None:
    """Task-field columns are attached by position: they must follow every rollout's row."""
    rollouts = capture_dir.parent / "rollouts.jsonl"
    records = []
    for task in range(40):
        for repeat in range(5):
            body: dict[str, Any] = {
                "_ng_task_index": task,
                "_ng_rollout_index": repeat,
                "reward": task / 100,
                "difficulty": f"d{task}-{repeat}",
                "level": task * 10 + repeat,
                "hard": task % 2 == 0,
                "mixed": task if task % 3 else "text",
            }
            records.append(orjson.dumps(body) + b"\n")
            if repeat < 2:  # some rollouts in the store too, in a different order
                write_capture(
                    capture_dir, f"{task}-{repeat}", [{"model_call_id": "c", "dialect": "chat"}]
                )
    rollouts.write_bytes(b"".join(reversed(records)))
    run = ngv.open_run(capture_dir, rollouts, index=False)
    frame = run.rollouts
    assert frame.height == 200
    assert frame.schema["difficulty"] == pl.String
    assert frame.schema["level"] == pl.Int64
    assert frame.schema["hard"] == pl.Boolean
    assert frame.schema["mixed"] == pl.String
    for row in frame.iter_rows(named=True):
        task, repeat = row["task_index"], row["rollout_index"]
        assert row["rollout_id"] == f"{task}-{repeat}"
        assert row["difficulty"] == f"d{task}-{repeat}"
        assert row["level"] == task * 10 + repeat
        assert row["hard"] is (task % 2 == 0)
        assert row["mixed"] == (str(task) if task % 3 else "text")
        assert row["reward"] == task / 100
        # No capture and no attachment: the number of calls is unknown, not 0.
        assert row["num_calls"] == (1 if repeat < 2 else None)
        assert row["in_store"] is (repeat < 2)


def test_a_superseded_record_leaves_no_gaps_of_its_own(tmp_path: Path) -> None:
    written = write_run(tmp_path / "run", RunSpec(tasks=2, repeats=1, error_rate=0.0))
    lines = written.rollouts.read_bytes().splitlines()
    stale = orjson.loads(lines[0])
    attachment = dict(
        stale[ATTACHMENT_KEY], calls=[], gaps=[{"code": "model_call_capture_no_records"}]
    )
    attachment["metrics"] = {"num_calls": 0}
    stale |= {ATTACHMENT_KEY: attachment, "reward": 0.0}
    written.rollouts.write_bytes(b"\n".join([orjson.dumps(stale), *lines]) + b"\n")
    run = ngv.open_run(rollouts=written.rollouts)
    rollout_id = stale[ATTACHMENT_KEY]["rollout_id"]
    codes = run.gaps.filter(pl.col("rollout_id") == rollout_id)["code"].cast(pl.String)
    assert "model_call_capture_no_records" not in codes.to_list()
    assert codes.to_list() == ["rollout_duplicated"]  # the supersession itself is reported
    row = run.rollouts.filter(pl.col("rollout_id") == rollout_id).row(0, named=True)
    assert row["num_calls"] > 0 and row["reward"] != 0.0 and row["num_gaps"] == 1
