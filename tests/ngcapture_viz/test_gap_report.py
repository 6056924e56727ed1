"""The gap report: coverage counts, gaps by code, damaged/missing/pending tables, figure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from capture_core.testing import RunSpec, write_run
from ngcapture_viz import CaptureRun, gap_meaning, open_run, stack_runs
from ngcapture_viz.figures.gap_report import COVERAGE_METRICS, GapReport, gap_report


@dataclass(frozen=True)
class Damaged:
    run: CaptureRun
    capture_dir: Path
    lines_before: int  # readable lines of 0-0.capture.jsonl before the damage


def _damage(directory: Path, *, label: str | None = None, seed: int = 0) -> Damaged:
    """A run with every kind of store damage the report must count, once each.

    0-0: garbage bytes and a torn line appended · 1-0: incomplete marker · 2-0: empty capture
    file · 3-0: a pending write · 4-0: capture file deleted (not in store) · zz-9: a capture
    file with no rollout record (not in rollouts) · notes.txt: a foreign file.
    """
    synthetic = write_run(directory, RunSpec(tasks=5, repeats=1, calls=(2, 4), seed=seed))
    store = synthetic.capture_dir
    first = store / "0-0.capture.jsonl"
    lines_before = first.read_bytes().count(b"\n")
    with first.open("ab") as fh:
        fh.write(b"\xff\xfegarbage\n" + b'{"model_call_id": "torn')
    (store / "1-0.capture.incomplete").touch()
    (store / "2-0.capture.jsonl").write_bytes(b"")
    (store / ".pending").mkdir(exist_ok=True)
    (store / ".pending" / "3-0@abc123").touch()
    (store / "zz-9.capture.jsonl").write_bytes((store / "3-0.capture.jsonl").read_bytes())
    (store / "4-0.capture.jsonl").unlink()
    (store / "notes.txt").write_text("not a capture file")
    run = open_run(store, synthetic.rollouts, label=label, index=False)
    return Damaged(run, store, lines_before)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Damaged:
    return _damage(tmp_path_factory.mktemp("damaged"))


@pytest.fixture(scope="module")
def report(damaged: Damaged) -> GapReport:
    return gap_report(damaged.run)


def _counts(frame: pl.DataFrame) -> dict[str, int]:
    return dict(frame.select("code", "count").rows())


def _summary(report: GapReport, run: str | None = None) -> dict[str, tuple[int | None, int]]:
    rows = report.summary
    if run is not None:
        rows = rows.filter(pl.col("run").cast(pl.String) == run)
    return {m: (c, t) for m, c, t in rows.select("metric", "count", "total").rows()}


def test_gap_counts_by_code(report: GapReport) -> None:
    counts = _counts(report.by_code)
    assert counts["capture_line_damaged"] == 2
    assert counts["model_call_capture_incomplete"] == 1
    assert counts["capture_file_empty"] == 1
    assert counts["capture_dir_foreign_file"] == 1
    assert counts["model_call_capture_pending"] == 1
    assert counts["rollout_not_in_store"] == 1
    assert counts["rollout_not_in_rollouts"] == 1
    for code, rollouts, meaning in report.by_code.select("code", "rollouts", "meaning").rows():
        assert meaning == gap_meaning(code)
        if code == "capture_dir_foreign_file":
            assert rollouts == 0  # a directory-level gap concerns no rollout
        elif code == "capture_line_damaged":
            assert rollouts == 1  # two damaged lines, one rollout
    assert report.by_code["count"].to_list() == sorted(report.by_code["count"], reverse=True)


def test_by_code_counts_equal_the_gaps_frame(damaged: Damaged, report: GapReport) -> None:
    expected = dict(damaged.run.gaps.group_by(pl.col("code").cast(pl.String)).len().rows())
    assert _counts(report.by_code) == expected


def test_damaged_lines_have_file_line_and_call_index(damaged: Damaged, report: GapReport) -> None:
    rows = report.damaged
    n = damaged.lines_before
    assert rows["path"].to_list() == [str(damaged.capture_dir / "0-0.capture.jsonl")] * 2
    assert rows["line_number"].to_list() == [n + 1, n + 2]
    assert rows["call_index"].to_list() == [n, n + 1]
    assert "torn" in rows["detail"][1]


def test_missing_and_pending(report: GapReport) -> None:
    missing = dict(report.missing.select("rollout_id", "code").rows())
    assert missing == {"4-0": "rollout_not_in_store", "zz-9": "rollout_not_in_rollouts"}
    assert report.pending.select("rollout_id", "model_call_id").rows() == [("3-0", "abc123")]


def test_coverage_counts_equal_hand_counts(damaged: Damaged, report: GapReport) -> None:
    calls, rollouts = damaged.run.calls, damaged.run.rollouts
    summary = _summary(report)
    n_calls, n_rollouts = calls.height, rollouts.height
    for metric in COVERAGE_METRICS:
        assert summary[metric] == (calls[metric].is_not_null().sum(), n_calls)
    streamed = calls.filter(pl.col("stream"))
    assert summary["latency_ttft_ms"] == (
        streamed["latency_ttft_ms"].is_not_null().sum(),
        streamed.height,
    )
    assert (
        summary["tokens_reasoning"][0] or 0
    ) < n_calls  # not every call reports it: a real check
    assert summary["rollouts"] == (n_rollouts, n_rollouts) == (6, 6)
    assert summary["rollouts_with_capture_file"] == (rollouts["path"].is_not_null().sum(), 6)
    assert summary["rollouts_with_capture_file"][0] == 5  # 4-0 lost its file
    assert summary["rollouts_in_rollout_file"] == (5, 6)  # zz-9 has no record
    assert summary["rollouts_with_calls"] == ((rollouts["num_calls"] > 0).sum(), 6)
    from_store = int((calls["source"] == "store").sum())
    from_attachment = int((calls["source"] == "attachment").sum())
    assert from_attachment > 0  # 2-0 and 4-0 are known from their attachments only
    assert summary["calls"] == (n_calls, n_calls)
    assert summary["calls_from_store"] == (from_store, n_calls)
    assert summary["calls_from_attachment_only"] == (from_attachment, n_calls)
    shares = report.summary.filter(pl.col("total") > 0)
    assert shares["share"].to_list() == pytest.approx((shares["count"] / shares["total"]).to_list())


def test_a_missing_source_is_unknown_not_zero(tmp_path: Path) -> None:
    synthetic = write_run(tmp_path, RunSpec(tasks=3, repeats=1, calls=(1, 2)))
    summary = _summary(gap_report(open_run(None, synthetic.rollouts)))
    assert summary["rollouts_with_capture_file"] == (None, 3)
    assert summary["rollouts_in_rollout_file"] == (3, 3)
    summary = _summary(gap_report(open_run(synthetic.capture_dir, None, index=False)))
    assert summary["rollouts_in_rollout_file"] == (None, 3)


def test_stacked_runs_are_grouped_by_run(tmp_path: Path, report: GapReport) -> None:
    a = _damage(tmp_path / "a", label="ckpt-a")
    clean = write_run(tmp_path / "b", RunSpec(tasks=2, repeats=1, calls=(1, 3), seed=1))
    b = open_run(clean.capture_dir, clean.rollouts, label="ckpt-b", index=False)
    both = gap_report(stack_runs([a.run, b]))
    assert set(both.by_code["run"].cast(pl.String)) == {"ckpt-a"}  # ckpt-b has no gap
    assert _counts(both.by_code) == _counts(report.by_code)
    assert _summary(both, "ckpt-b")["calls"] == (b.calls.height, b.calls.height)
    assert _summary(both, "ckpt-a")["calls"] == (a.run.calls.height, a.run.calls.height)
    assert set(both.damaged["run"].cast(pl.String)) == {"ckpt-a"}
    fig = both.figure()
    gap_traces = [t for t in fig.data if t.meta["kind"] == "gaps"]
    assert [t.name for t in gap_traces] == ["ckpt-a", "ckpt-b"]
    assert list(gap_traces[1].x) == []
    cover = [t for t in fig.data if t.meta["kind"] == "coverage"]
    assert [t.name for t in cover] == ["ckpt-a", "ckpt-b"]
    assert cover[0].marker.color == gap_traces[0].marker.color


def test_figure_bars_are_the_report_data(report: GapReport) -> None:
    fig = report.figure()
    (gaps,) = [t for t in fig.data if t.meta["kind"] == "gaps"]
    assert dict(zip(gaps.y, gaps.x, strict=True)) == _counts(report.by_code)
    (cover,) = [t for t in fig.data if t.meta["kind"] == "coverage"]
    assert list(cover.y) == report.summary["description"].to_list()
    assert list(cover.x) == pytest.approx([100 * s for s in report.summary["share"]])
    assert list(cover.text) == [
        f"{c}/{t}" for c, t in report.summary.select("count", "total").rows()
    ]


def test_a_clean_run_says_so(tmp_path: Path) -> None:
    synthetic = write_run(tmp_path, RunSpec(tasks=2, repeats=1, calls=(1, 2)))
    clean = gap_report(open_run(synthetic.capture_dir, synthetic.rollouts, index=False))
    assert clean.by_code.height == clean.damaged.height == clean.missing.height == 0
    assert clean.pending.height == 0
    texts = [a.text for a in clean.figure().layout.annotations]
    assert any(t.startswith("no gaps") for t in texts)
