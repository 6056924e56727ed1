"""The per-rollout timeline: lanes, bar extents, TTFT, colours, idle time, gaps, notes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import polars as pl
import pytest

import ngcapture_viz as ngv
from capture_core.testing import RunSpec, write_run
from ngcapture_viz import CaptureRun, open_run, stack_runs
from ngcapture_viz.figures.timeline import CAUSALITY_NOTE, assign_lanes, outcome_color, timeline


def _open(directory: Path, spec: RunSpec, *, label: str | None = None) -> CaptureRun:
    synthetic = write_run(directory, spec)
    return open_run(synthetic.capture_dir, synthetic.rollouts, label=label, index=False)


@pytest.fixture(scope="module")
def concurrent(tmp_path_factory: pytest.TempPathFactory) -> CaptureRun:
    spec = RunSpec(
        tasks=3, repeats=1, calls=(20, 40), concurrency=4, error_rate=0.2, truncation_rate=0.1
    )
    return _open(tmp_path_factory.mktemp("concurrent"), spec)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory) -> CaptureRun:
    spec = RunSpec(tasks=1, repeats=1, calls=(12, 12), concurrency=1, seed=4)
    return _open(tmp_path_factory.mktemp("sequential"), spec)


def _us(series: pl.Series) -> list[int]:
    return series.dt.epoch("us").to_list()


def _max_overlap(calls: pl.DataFrame) -> int:
    """Most calls in flight at once, by a sweep over [start, end) intervals."""
    events = [(s, 1) for s in _us(calls["started_at"])] + [
        (e, -1) for e in _us(calls["completed_at"])
    ]
    in_flight = best = 0
    for _, step in sorted(events):  # at equal times an end (-1) sorts before a start (+1)
        in_flight += step
        best = max(best, in_flight)
    return best


def _bars(fig: go.Figure) -> list[Any]:
    return [t for t in fig.data if t.type == "bar"]


def _trace(fig: go.Figure, kind: str) -> Any:
    (found,) = [t for t in fig.data if t.meta and t.meta.get("kind") == kind]
    return found


def _bar_by_call(fig: go.Figure) -> dict[str, tuple[float, float, int, str]]:
    """model_call_id → (base, x, lane, trace name) over every bar of the figure."""
    out: dict[str, tuple[float, float, int, str]] = {}
    for bar in _bars(fig):
        for (call_id, _), base, width, lane in zip(
            bar.customdata, bar.base, bar.x, bar.y, strict=True
        ):
            assert call_id not in out, "a call is drawn twice"
            out[call_id] = (base, width, lane, bar.name)
    return out


def _annotation(fig: go.Figure, name: str) -> str:
    (text,) = [a.text for a in fig.layout.annotations if a.name == name]
    return str(text)


# -- lanes ----------------------------------------------------------------------------------


def test_lanes_never_overlap_and_their_number_is_the_max_overlap(concurrent: CaptureRun) -> None:
    for rollout_id in concurrent.rollouts["rollout_id"]:
        calls = assign_lanes(concurrent.calls.filter(pl.col("rollout_id") == rollout_id))
        assert calls["lane"].dtype == pl.Int64
        assert calls["lane"].null_count() == 0
        rows = list(
            zip(calls["lane"], _us(calls["started_at"]), _us(calls["completed_at"]), strict=True)
        )
        for i, (lane_a, start_a, end_a) in enumerate(rows):
            for lane_b, start_b, end_b in rows[i + 1 :]:
                if lane_a == lane_b:
                    assert end_a <= start_b or end_b <= start_a
        overlap = _max_overlap(calls)
        assert overlap > 1  # the run really is concurrent, so the check means something
        assert calls["lane"].n_unique() == overlap
        assert max(lane for lane in calls["lane"] if lane is not None) == overlap - 1


def test_assign_lanes_reuses_a_lane_freed_at_the_start_and_keeps_row_order() -> None:
    t = [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=s) for s in range(5)]
    calls = pl.DataFrame(
        {
            "call_index": [0, 1, 2, 3],
            "started_at": [t[2], t[0], t[1], t[2]],
            "completed_at": [t[4], t[2], t[3], t[3]],
        }
    )
    # In start order: call 1 [0,2) lane 0; call 2 [1,3) lane 1; call 3 [2,3) starts when lane 0
    # frees and takes it (ties go to the earlier end); call 0 [2,4) needs a third lane.
    assert assign_lanes(calls)["lane"].to_list() == [2, 0, 1, 0]


def test_calls_without_usable_timestamps_get_no_lane_but_are_listed(concurrent: CaptureRun) -> None:
    rollout_id = concurrent.rollouts["rollout_id"][0]
    calls = concurrent.calls
    mine = calls.filter(pl.col("rollout_id") == rollout_id)
    broken = mine["model_call_id"].head(3).to_list()
    calls = calls.with_columns(
        started_at=pl.when(pl.col("model_call_id") == broken[0])
        .then(None)
        .otherwise(pl.col("started_at")),
        completed_at=pl.when(pl.col("model_call_id") == broken[1])
        .then(None)
        .when(pl.col("model_call_id") == broken[2])
        .then(pl.col("started_at") - pl.duration(seconds=1))
        .otherwise(pl.col("completed_at")),
    )
    laned = assign_lanes(calls.filter(pl.col("rollout_id") == rollout_id))
    assert laned.height == mine.height
    assert laned.filter(pl.col("lane").is_null())["model_call_id"].sort().to_list() == sorted(
        broken
    )

    run = CaptureRun(
        concurrent.label,
        calls=calls,
        rollouts=concurrent.rollouts,
        gaps=concurrent.gaps,
        tool_calls=concurrent.tool_calls,
    )
    fig = timeline(run, rollout_id)
    drawn = _bar_by_call(fig)
    assert len(drawn) == mine.height - 3
    assert not set(broken) & set(drawn)
    note = _annotation(fig, "unplaced")
    assert note.startswith("3 call(s) not drawn")
    assert all(call_id in note for call_id in broken)


# -- bars, TTFT, colours ---------------------------------------------------------------------


def test_bar_extents_are_the_call_timestamps(concurrent: CaptureRun) -> None:
    rollout_id = concurrent.rollouts["rollout_id"][1]
    calls = assign_lanes(concurrent.calls.filter(pl.col("rollout_id") == rollout_id))
    fig = timeline(concurrent, rollout_id)
    drawn = _bar_by_call(fig)
    assert len(drawn) == calls.height
    origin = min(_us(calls["started_at"]))
    for call_id, start, end, lane in zip(
        calls["model_call_id"],
        _us(calls["started_at"]),
        _us(calls["completed_at"]),
        calls["lane"],
        strict=True,
    ):
        base, width, bar_lane, _ = drawn[call_id]
        assert base == pytest.approx((start - origin) / 1000, abs=1e-6)  # 1 ns
        assert base + width == pytest.approx((end - origin) / 1000, abs=1e-6)
        assert bar_lane == lane
    assert fig.layout.barmode == "overlay"  # bars of different outcomes must not be offset


def test_ttft_marker_sits_at_start_plus_ttft(concurrent: CaptureRun) -> None:
    rollout_id = concurrent.rollouts["rollout_id"][0]
    calls = concurrent.calls.filter(pl.col("rollout_id") == rollout_id)
    fig = timeline(concurrent, rollout_id)
    drawn = _bar_by_call(fig)
    ttft = _trace(fig, "ttft")
    streamed = calls.filter(pl.col("stream") & pl.col("latency_ttft_ms").is_not_null())
    assert streamed.height > 0
    assert len(ttft.x) == streamed.height
    expected = dict(streamed.select("model_call_id", "latency_ttft_ms").rows())
    for (call_id, _), x, y in zip(ttft.customdata, ttft.x, ttft.y, strict=True):
        base, _, lane, _ = drawn[call_id]
        assert x == pytest.approx(base + expected[call_id])
        assert y == lane


def test_bars_are_coloured_and_grouped_by_outcome(concurrent: CaptureRun) -> None:
    rollout_id = concurrent.rollouts["rollout_id"][2]
    calls = concurrent.calls.filter(pl.col("rollout_id") == rollout_id)
    outcome_of = dict(calls.select("model_call_id", pl.col("outcome").cast(pl.String)).rows())
    fig = timeline(concurrent, rollout_id)
    bars = _bars(fig)
    assert {b.name for b in bars} == set(outcome_of.values())
    assert len({b.legendgroup for b in bars}) == len(bars)
    assert len(set(outcome_of.values())) > 1  # errors too, not only ok
    for bar in bars:
        assert bar.marker.color == outcome_color(bar.name)
        assert {outcome_of[call_id] for call_id, _ in bar.customdata} == {bar.name}
    assert outcome_color("ok") != outcome_color("upstream_error")
    assert outcome_color("some_new_category") == outcome_color("some_new_category")


def test_hover_says_not_reported_for_unknown_tokens(concurrent: CaptureRun) -> None:
    rollout_id = concurrent.rollouts["rollout_id"][0]
    calls = concurrent.calls.filter(pl.col("rollout_id") == rollout_id)
    fig = timeline(concurrent, rollout_id)
    hover = {
        cd[0]: text for b in _bars(fig) for cd, text in zip(b.customdata, b.hovertext, strict=True)
    }
    unknown = calls.filter(pl.col("tokens_in").is_null())
    known = calls.filter(pl.col("tokens_in").is_not_null())
    assert unknown.height and known.height
    for row in unknown.iter_rows(named=True):
        assert "tokens in: not reported" in hover[row["model_call_id"]]
    for row in known.iter_rows(named=True):
        text = hover[row["model_call_id"]]
        assert f"tokens in: {row['tokens_in']:,}" in text
        assert f"model_call_id: {row['model_call_id']}" in text
        assert f"call_index: {row['call_index']}" in text
        assert f"dialect: {row['dialect']}" in text


# -- idle time, gaps, notes -------------------------------------------------------------------


def test_idle_spans_are_the_times_no_call_is_in_flight(sequential: CaptureRun) -> None:
    calls = sequential.calls.sort("started_at")
    origin = min(_us(calls["started_at"]))
    expected: list[tuple[float, float]] = []
    reach: int | None = None
    for start, end in zip(_us(calls["started_at"]), _us(calls["completed_at"]), strict=True):
        if reach is not None and start > reach:
            expected.append(((reach - origin) / 1000, (start - origin) / 1000))
        reach = end if reach is None else max(reach, end)
    assert expected  # sequential calls leave idle time between them
    fig = timeline(sequential, "0-0")
    xs = [x for x in _trace(fig, "idle").x if x is not None]
    spans = [x for i in range(0, len(xs), 5) for x in (xs[i], xs[i + 1])]  # 5 points a box
    assert spans == pytest.approx([x for span in expected for x in span], abs=1e-6)
    total_ms = sum(end - start for start, end in expected)
    assert f"idle {total_ms:.0f} ms" in fig.layout.title.subtitle.text or (
        f"idle {total_ms / 1000:.2f} s" in fig.layout.title.subtitle.text
    )


def test_gaps_are_annotated_and_damaged_lines_marked(tmp_path: Path) -> None:
    synthetic = write_run(tmp_path, RunSpec(tasks=1, repeats=1, calls=(5, 5), seed=2))
    path = synthetic.capture_dir / "0-0.capture.jsonl"
    with path.open("ab") as fh:
        fh.write(b"\xff\xfe not json\n")
    run = open_run(synthetic.capture_dir, synthetic.rollouts, index=False)
    fig = timeline(run, "0-0")
    note = _annotation(fig, "gaps")
    assert note.startswith("<b>1 gap(s)")
    assert "capture_line_damaged (line 6)" in note
    damaged = _trace(fig, "damaged")
    last_end = max(b + w for bar in _bars(fig) for b, w in zip(bar.base, bar.x, strict=True))
    assert list(damaged.x) == [pytest.approx(last_end)]  # written after the fifth call
    assert "1 gap(s)" in fig.layout.title.subtitle.text


def test_causality_note_is_said_once_by_the_report_not_under_each_timeline(
    sequential: CaptureRun,
) -> None:
    fig = timeline(sequential, "0-0")
    assert all(a.name != "causality" for a in fig.layout.annotations)
    assert "do not prove causality" in CAUSALITY_NOTE
    html = ngv.render_report(sequential, timelines={"slowest": 2, "failing": 0, "sample": 0})
    assert html.count("do not prove causality") == 1  # the report's single note


# -- sizes ----------------------------------------------------------------------------------


def test_one_call_rollout(tmp_path: Path) -> None:
    run = _open(tmp_path, RunSpec(tasks=1, repeats=1, calls=(1, 1), error_rate=0.0))
    fig = timeline(run, "0-0")
    drawn = _bar_by_call(fig)
    ((base, width, lane, _),) = drawn.values()
    assert (base, lane) == (0.0, 0)
    assert width == pytest.approx(run.calls["latency_total_ms"][0], rel=0.05)
    assert [t for t in fig.data if t.meta and t.meta.get("kind") == "idle"] == []
    assert list(_bars(fig)[0].text) == ["#0"]


def test_five_hundred_calls_build_fast_without_bar_text(tmp_path: Path) -> None:
    run = _open(tmp_path, RunSpec(tasks=1, repeats=1, calls=(500, 500), concurrency=3))
    timeline(run, "0-0")  # plotly loads its trace validators once per process (~0.3-1 s)
    started = time.perf_counter()
    fig = timeline(run, "0-0")
    elapsed = time.perf_counter() - started
    assert len(_bar_by_call(fig)) == 500
    assert all(bar.text is None for bar in _bars(fig))
    # A bound against pathological (quadratic) layouts, not a benchmark: ~0.05 s measured.
    assert elapsed < 5, f"500-call timeline took {elapsed:.2f} s"


# -- selection ------------------------------------------------------------------------------


def test_unknown_rollout_names_the_id_and_valid_ones(sequential: CaptureRun) -> None:
    with pytest.raises(KeyError) as err:
        timeline(sequential, "no-such-rollout")
    assert "no-such-rollout" in str(err.value) and "'0-0'" in str(err.value)


def test_stacked_runs_need_a_label_when_ids_repeat(tmp_path: Path) -> None:
    spec = RunSpec(tasks=1, repeats=1, calls=(3, 3))
    a = _open(tmp_path / "a", spec, label="ckpt-a")
    b = _open(tmp_path / "b", RunSpec(tasks=1, repeats=1, calls=(4, 4), seed=1), label="ckpt-b")
    both = stack_runs([a, b])
    with pytest.raises(ValueError, match="ckpt-a"):
        timeline(both, "0-0")
    fig = timeline(both, "0-0", run_label="ckpt-b")
    assert len(_bar_by_call(fig)) == 4
    assert "ckpt-b" in fig.layout.title.text
    with pytest.raises(KeyError, match="ckpt-c"):
        timeline(both, "0-0", run_label="ckpt-c")


def test_rollout_with_only_damaged_lines_draws_no_bar_and_says_so(tmp_path: Path) -> None:
    store = tmp_path / "model-calls"
    store.mkdir()
    (store / "x-1.capture.jsonl").write_bytes(b"garbage\n")
    fig = timeline(open_run(store, index=False), "x-1")
    assert _bars(fig) == []
    assert _annotation(fig, "empty").startswith("No captured call")
    assert "capture_line_damaged (line 1)" in _annotation(fig, "gaps")
    assert list(_trace(fig, "damaged").x) == [0.0]
