"""The tokens frame (``open_run(..., tokens_dir=...)``), its per-run summary in the dashboard
and the report, and the masked rate in a checkpoint diff.

Runs are made the way the collector makes them: entries in a real token store, each rollout
finalized by :class:`TokenDelivery` (rebuilt or masked) and retired when it may be, and the
records written as a rollout JSONL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core.tokens import TokenCaptureStore, TokenDelivery, TokenIdCaptureConfig
from ngcapture_viz.exceptions import SourceError
from ngcapture_viz.figures.dashboard import dashboard
from ngcapture_viz.frames.tokens import TOKENS, mask_reasons, token_capture_summary
from ngcapture_viz.report import render_report
from tests.capture_core.tokens.entries import entry, three_turns


def make_run(root: Path, masked_tasks: set[int], tasks: int = 6) -> tuple[Path, Path]:
    """``tasks`` rollouts ``r.<t>-0``: a three-turn chain each, or, for ``masked_tasks``, two
    unrelated roots (masked: multiple roots). Returns (rollout file, token store)."""
    store = TokenCaptureStore(root / "tokens", create=True)
    config = TokenIdCaptureConfig.from_global_config(
        {"token_id_capture": {"enabled": True, "dir": str(store.root)}}
    )
    lines = []
    with TokenDelivery(config) as delivery:
        for task in range(tasks):
            rollout_id = f"r.{task}-0"
            if task in masked_tasks:
                entries = [entry("a", [1, 2], [3], rollout=rollout_id),
                           entry("b", [7, 8, 9], [4], rollout=rollout_id, created_at=1.0)]  # fmt: skip
            else:
                entries = three_turns(rollout_id)
            for one in entries:
                store.append(one)
            result: dict[str, Any] = {
                "_ng_task_index": task, "_ng_rollout_index": 0, "task_id": f"t{task}",
                "reward": 1.0, "response": {"id": f"resp-{task}", "model": "m", "output": []},
            }  # fmt: skip
            build = delivery.finalize(result, rollout_id)
            lines.append(orjson.dumps({**result, "rollout_id": rollout_id}))
            delivery.retire(rollout_id, build)
    rollouts = root / "rollouts.jsonl"
    rollouts.write_bytes(b"\n".join(lines) + b"\n")
    return rollouts, store.root


def test_frame_from_records_and_store(tmp_path: Path) -> None:
    rollouts, tokens_dir = make_run(tmp_path, masked_tasks={1})
    store = TokenCaptureStore(tokens_dir)
    # a rollout still being written: one entry, and a call announced but never recorded
    store.begin_call_now("live.0-0", "lost")
    store.append(entry("kept", [5, 6], [7, 8], rollout="live.0-0"))
    store.begin_call_now("live.0-0", "kept")
    run = ngv.open_run(rollouts=rollouts, tokens_dir=tokens_dir, label="a")
    frame = run.tokens
    assert frame.schema == TOKENS.polars
    rows = {row["rollout_id"]: row for row in frame.iter_rows(named=True)}
    assert set(rows) == {f"r.{t}-0" for t in range(6)} | {"live.0-0"}
    delivered = rows["r.0-0"]
    assert delivered["source"] == "both" and delivered["state"] == "retired"
    assert delivered["masked"] is False and delivered["mask_reasons"] is None
    assert (delivered["calls"], delivered["chains"], delivered["delivered_fraction"]) == (3, 1, 1.0)
    # the root prompt, the generated tokens and the delivered sequence (three_turns)
    assert (delivered["prompt_tokens"], delivered["generated_tokens"]) == (3, 5)
    assert delivered["delivered_tokens"] == 5 and delivered["sequence_tokens"] == 11
    assert delivered["lost_calls"] == 0 and delivered["incomplete"] is False
    masked = rows["r.1-0"]
    assert masked["masked"] is True and masked["mask_reasons"] == "multiple_roots"
    assert masked["state"] == "frozen"  # kept as evidence, not retired
    # calls from the store's entries; lengths as delivered (the main chain: call "a")
    assert (masked["calls"], masked["generated_tokens"], masked["sequence_tokens"]) == (2, 2, 3)
    live = rows["live.0-0"]
    assert live["source"] == "store" and live["state"] == "live" and live["masked"] is None
    assert (live["calls"], live["lost_calls"], live["sequence_tokens"]) == (1, 1, 4)


def test_frame_from_records_only_and_empty_without_token_capture(tmp_path: Path) -> None:
    rollouts, _ = make_run(tmp_path, masked_tasks={0, 2})
    run = ngv.open_run(rollouts=rollouts)
    assert run.tokens.height == 6
    assert run.tokens["state"].null_count() == 6  # no store given: unknown, not "absent"
    assert run.tokens.filter(pl.col("masked"))["rollout_id"].to_list() == ["r.0-0", "r.2-0"]
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(orjson.dumps({"_ng_task_index": 0, "_ng_rollout_index": 0}) + b"\n")
    empty = ngv.open_run(rollouts=plain)
    assert empty.tokens.height == 0 and empty.tokens.schema == TOKENS.polars
    assert "token_capture" not in dashboard(empty).tables


def test_record_without_a_store_entry_is_absent(tmp_path: Path) -> None:
    rollouts, _ = make_run(tmp_path, masked_tasks=set(), tasks=2)
    other = TokenCaptureStore(tmp_path / "elsewhere", create=True)
    run = ngv.open_run(rollouts=rollouts, tokens_dir=other.root)
    assert run.tokens["state"].to_list() == ["absent", "absent"]
    with pytest.raises(SourceError, match="does not exist"):
        ngv.open_run(rollouts=rollouts, tokens_dir=tmp_path / "nowhere")


def test_damaged_store_rollout_is_reported_on_its_row(tmp_path: Path) -> None:
    rollouts, tokens_dir = make_run(tmp_path, masked_tasks={0}, tasks=2)
    (tokens_dir / "r.0-0.tokens.jsonl").write_bytes(b"not json\n{}\n")
    run = ngv.open_run(rollouts=rollouts, tokens_dir=tokens_dir)
    row = run.tokens.filter(pl.col("rollout_id") == "r.0-0").row(0, named=True)
    assert row["store_error"] and row["state"] is None
    assert row["masked"] is True  # the record's verdict still stands


def test_mask_reasons_follow_the_consumer() -> None:
    assert mask_reasons({"n_calls": 1, "roots": 1, "chains": 1}, False) == []
    assert mask_reasons({"capture_incomplete": True, "roots": 1, "chains": 1}, True) == [
        "capture_incomplete"
    ]
    assert mask_reasons({"n_calls": 0, "error": "capture contains no token records"}, True) == [
        "capture contains no token records"
    ]
    assert mask_reasons({"roots": 1, "chains": 1}, True) == ["unresolved_parent_calls"]


def test_summary_dashboard_and_report_show_the_masked_fraction(tmp_path: Path) -> None:
    rollouts, tokens_dir = make_run(tmp_path, masked_tasks={1, 4})
    run = ngv.open_run(rollouts=rollouts, tokens_dir=tokens_dir, label="ckpt")
    summary = token_capture_summary(run.tokens, run.labels)
    row = summary.row(0, named=True)
    assert (row["delivered"], row["masked"]) == (6, 2)
    assert row["masked_fraction"] == pytest.approx(2 / 6)
    assert row["mask_reasons"] == "multiple_roots 2"
    assert (row["retired"], row["frozen"], row["live"], row["absent"]) == (4, 2, 0, 0)
    board = dashboard(run)
    assert board.tables["token_capture"].equals(summary)
    assert "Token-id capture" in board._repr_html_()
    page = render_report(run, timelines={"slowest": 0, "failing": 0, "sample": 0})
    assert "Token capture" in page and "Masked rollouts" in page
    assert "multiple_roots 2" in page and "r.4-0" in page


def test_diff_compares_the_masked_rate(tmp_path: Path) -> None:
    a_rollouts, a_tokens = make_run(tmp_path / "a", masked_tasks=set())
    b_rollouts, b_tokens = make_run(tmp_path / "b", masked_tasks={0, 1, 2})
    both = ngv.open_runs({"a": (None, a_rollouts), "b": (None, b_rollouts)},
                         tokens_dirs={"a": a_tokens, "b": b_tokens})  # fmt: skip
    assert both.tokens.height == 12
    result = ngv.diff(both, metrics=["masked_rate"], n_boot=200)
    (row,) = result.frame.iter_rows(named=True)
    assert row["metric"] == "masked_rate"
    assert row["value_a"] == 0.0 and row["value_b"] == pytest.approx(0.5)
    assert row["diff"] == pytest.approx(0.5)


def test_docs_list_every_tokens_column_with_its_dtype() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "frames.md").read_text()
    section = text.split("### `tokens`", 1)[1].split("##", 1)[0]
    for column in TOKENS.columns:
        assert f"| `{column.name}` | {column.dtype} | {column.doc} |" in section, column.name


def test_report_command_reads_the_token_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from capture_core.cli import main

    rollouts, tokens_dir = make_run(tmp_path, masked_tasks={3})
    out = tmp_path / "report.html"
    args = ["report", "--rollouts", str(rollouts), "--out", str(out), "--quiet"]
    assert main([*args, "--tokens-dir", str(tokens_dir)]) == 0
    page = out.read_text()
    assert "Token capture" in page and "r.3-0" in page and "frozen" in page
    assert main([*args, "--tokens-dir", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
