"""Rollout ids, resume attempts, clearing before dispatch; and the helpers agents use."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from capture_core import CaptureStore, InvalidRolloutIdError
from capture_core._locking import locked_fd
from capture_core.collect import (
    CLEARED_DIR,
    CollectError,
    ResumeState,
    clear_rollouts,
    clearing,
    expand_rows,
    failures_path,
    load_resume_state,
    parse_answer,
    plan_attempts,
    read_jsonl_rows,
    rollout_base_url,
    rollout_ids,
    run_tool,
    task_prompt,
)
from capture_core.collect.attempts import repair_torn_tail
from capture_core.collect.grader import grade
from capture_core.pending import mark_pending, pending_writes, unmark_pending, wait_for_pending
from capture_core.testing import Answer, capture_line

WAIT = 30.0  # failure timeout for what should happen promptly; generous for a busy machine


def write_jsonl(path: Path, rows: list[object]) -> None:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))


def row(task: int, rollout: int, **extra: object) -> dict[str, object]:
    return {"id": f"q{task}", "_ng_task_index": task, "_ng_rollout_index": rollout, **extra}


# --- ids -----------------------------------------------------------------------------------------


def test_rows_take_their_input_line_and_repeat(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b'{"id": "a"}\n\n{"id": \n[1]\n{"id": "b"}\n')
    read = read_jsonl_rows(tasks)
    assert [(i, r["id"]) for i, r in read.rows] == [(0, "a"), (4, "b")]
    assert [(b.line_number, b.reason.split(":")[0]) for b in read.bad] == [
        (3, "not valid JSON"),
        (4, "not a JSON object"),
    ]
    rows = expand_rows(read.rows, 2)
    assert rollout_ids(rows) == ["0-0", "0-1", "4-0", "4-1"]
    assert rows[3] == {"id": "b", "_ng_task_index": 4, "_ng_rollout_index": 1}


def test_an_explicit_id_wins_and_must_be_unique() -> None:
    rows = expand_rows([(0, {"_ng_rollout_id": "s7-3"}), (1, {})], 1)
    assert rollout_ids(rows) == ["s7-3", "1-0"]
    with pytest.raises(CollectError, match="two rows would run as rollout 's7-3'"):
        rollout_ids(expand_rows([(0, {"_ng_rollout_id": "s7-3"})], 2))
    with pytest.raises(InvalidRolloutIdError):
        rollout_ids([{"_ng_rollout_id": "../x"}])
    with pytest.raises(CollectError, match="num_repeats"):
        expand_rows([(0, {})], 0)


# --- resume ----------------------------------------------------------------------------------------


def test_resume_assigns_attempts_from_the_failures_sidecar(tmp_path: Path) -> None:
    output = tmp_path / "rollouts.jsonl"
    write_jsonl(output, [row(0, 0, reward=1.0), row(1, 0, reward=0.0)])
    with output.open("ab") as handle:
        handle.write(b"not json\n")
    sidecar = failures_path(output)
    assert sidecar == tmp_path / "rollouts_failures.jsonl"
    failed = [row(2, 0), row(2, 0, _ng_attempt_index=1), row(3, 0)]
    write_jsonl(sidecar, [*failed, row(4, 0), row(4, 0), row(4, 0), {"no": "indices"}])
    state = load_resume_state(output)
    assert state.successes == {(0, 0), (1, 0)}
    assert state.failures == Counter({(2, 0): 2, (3, 0): 1, (4, 0): 3})
    assert [(b.path.name, b.line_number) for b in state.bad] == [
        ("rollouts.jsonl", 3),
        ("rollouts_failures.jsonl", 7),
    ]
    rows = expand_rows([(i, {"id": f"q{i}"}) for i in range(6)], 1)
    plan = plan_attempts(rows, state, max_attempts=3)
    assert plan.finished == [(0, 0), (1, 0)]
    assert plan.exhausted == [(4, 0)]
    assert rollout_ids(plan.dispatch) == ["2-0-a2", "3-0-a1", "5-0"]
    assert plan.dispatch[0]["_ng_attempt_index"] == 2
    assert "_ng_attempt_index" not in plan.dispatch[2]  # a first attempt keeps the bare id
    assert rows[2] == {"id": "q2", "_ng_task_index": 2, "_ng_rollout_index": 0}  # not mutated
    assert rollout_ids(plan_attempts(rows, state, max_attempts=5).dispatch)[2] == "4-0-a3"


def test_a_torn_last_line_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    output = tmp_path / "rollouts.jsonl"
    write_jsonl(output, [row(0, 0), row(1, 0)])
    whole = output.read_bytes()
    with output.open("ab") as handle:
        handle.write(b'{"id": "q2", "_ng_task_ind')  # killed mid-write
    repair_torn_tail(output)
    assert output.read_bytes() == whole
    repair_torn_tail(output)  # idempotent; a missing file is fine too
    repair_torn_tail(tmp_path / "missing.jsonl")
    assert output.read_bytes() == whole
    assert load_resume_state(output).successes == {(0, 0), (1, 0)}


def test_without_resume_every_row_is_a_first_attempt() -> None:
    rows = [row(0, 0, _ng_attempt_index=4), row(0, 1)]
    plan = plan_attempts(rows)
    assert rollout_ids(plan.dispatch) == ["0-0", "0-1"]
    assert plan.finished == plan.exhausted == []
    with pytest.raises(CollectError, match="no task and rollout indices"):
        plan_attempts([{"id": "x"}], ResumeState())


# --- clearing ----------------------------------------------------------------------------------------


def fill(store: CaptureStore, rollout_id: str, calls: int = 1, *, marker: bool = False) -> bytes:
    for n in range(calls):
        store.record(rollout_id, capture_line("chat", Answer(), model_call_id=f"{n:032x}"))
    if marker:
        store.mark_incomplete(rollout_id)
    return store.path_for(rollout_id).read_bytes()


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and CLEARED_DIR not in p.parts
    }


def test_clearing_archives_exactly_the_listed_ids(tmp_path: Path) -> None:
    first, second = (
        CaptureStore(tmp_path / "a", create=True),
        CaptureStore(tmp_path / "b", create=True),
    )
    old = fill(first, "0-0", 2, marker=True)
    fill(first, "0-1")
    fill(first, "0-0-a1")
    fill(first, "10-0")
    old_b = fill(second, "0-1-a1", 3)
    cleared = {"a/0-0.capture.jsonl", "a/0-0.capture.incomplete", "b/0-1-a1.capture.jsonl"}
    before = snapshot(tmp_path)
    assert cleared < set(before)
    report = clear_rollouts([first.root, second.root, tmp_path / "missing"], ["0-0", "0-1-a1"],
                            wait_s=1)  # fmt: skip
    assert snapshot(tmp_path) == {k: v for k, v in before.items() if k not in cleared}
    archived = {}
    for path in report.moved:
        rollout_id, stamp, *suffix = path.name.split(".")
        assert stamp.isdigit() and abs(int(stamp) - time.time_ns()) < 60e9  # <id>.<unix-ns>...
        archived[f"{rollout_id}.{suffix[-1]}"] = path
    assert sorted(archived) == ["0-0.incomplete", "0-0.jsonl", "0-1-a1.jsonl"]
    assert archived["0-0.jsonl"].read_bytes() == old  # moved, never deleted
    assert archived["0-1-a1.jsonl"].read_bytes() == old_b
    assert archived["0-0.jsonl"].parent == first.root / CLEARED_DIR
    assert not first.exists("0-0") and not second.exists("0-1-a1")
    assert first.rollout_ids() == ["0-0-a1", "0-1", "10-0"]  # .cleared/ is not a rollout
    assert not (tmp_path / "missing").exists()
    assert report.still_pending == {}
    again = clear_rollouts([first.root], ["0-0"], wait_s=0)
    assert again.moved == []


def test_clearing_rejects_an_invalid_id_before_touching_anything(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    fill(store, "0-0")
    with pytest.raises(InvalidRolloutIdError):
        clear_rollouts([tmp_path], ["0-0", "../etc"], wait_s=0)
    assert store.exists("0-0")


def test_clearing_waits_for_writes_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    fill(store, "1-0")
    mark_pending(tmp_path, "1-0", "c" * 32)
    waiting = threading.Event()

    def spy(root: Path, rollout_id: str, *, timeout_s: float) -> list[str]:
        waiting.set()  # the clear is about to wait: the write lands while it does
        return wait_for_pending(root, rollout_id, timeout_s=timeout_s)

    def land() -> None:
        assert waiting.wait(WAIT)
        time.sleep(0.3)  # a clear that did not wait would have moved the file by now
        store.record("1-0", capture_line("chat", Answer(), model_call_id="c" * 32))
        unmark_pending(tmp_path, "1-0", "c" * 32)

    monkeypatch.setattr(clearing, "wait_for_pending", spy)
    writer = threading.Thread(target=land)
    writer.start()
    report = clear_rollouts([tmp_path], ["1-0"], wait_s=WAIT)
    writer.join()
    assert report.still_pending == {}
    (archived,) = report.moved
    assert archived.read_bytes().count(b"\n") == 2  # the straggler's line was archived too
    assert not store.exists("1-0")


def test_a_stuck_write_is_reported_and_its_marker_kept(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    fill(store, "2-0")
    stuck = {f"2-{n}": [f"{n:x}" * 32] for n in range(10)}
    for rollout_id, (call_id,) in stuck.items():
        mark_pending(tmp_path, rollout_id, call_id)
    started = time.monotonic()
    report = clear_rollouts([tmp_path], [*stuck, "2-10"], wait_s=0.5)
    elapsed = time.monotonic() - started
    # One bound for all ids: a bound per id would take 10 x 0.5 s; the rest is slack for load.
    assert 0.5 <= elapsed < 4, elapsed
    assert report.still_pending == stuck
    assert report.pending_count == 10
    assert len(report.moved) == 1
    assert pending_writes(tmp_path, "2-0") == ["0" * 32]


def test_a_writer_holding_the_lock_lands_before_the_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    fill(store, "3-0")
    path = store.path_for("3-0")
    held, moving = threading.Event(), threading.Event()

    def spy(*args: Any, **kwargs: Any) -> Any:
        moving.set()  # the clear is about to lock the file the straggler holds
        return locked_fd(*args, **kwargs)

    def straggler() -> None:
        with locked_fd(path, os.O_WRONLY | os.O_APPEND, exclusive=True, create=False) as lock:
            assert lock is not None
            held.set()
            assert moving.wait(WAIT)
            os.write(lock.fd, b'{"model_call_id": "late", "dialect": "chat"}\n')

    monkeypatch.setattr(clearing, "locked_fd", spy)
    thread = threading.Thread(target=straggler)
    thread.start()
    assert held.wait(WAIT)
    report = clear_rollouts([tmp_path], ["3-0"], wait_s=0)
    thread.join()
    (archived,) = report.moved
    assert archived.read_bytes().endswith(b'"late", "dialect": "chat"}\n')
    store.record("3-0", capture_line("chat", Answer()))  # a later write starts a new file
    assert store.path_for("3-0").read_bytes().count(b"\n") == 1


# --- helpers for agents, and grading ------------------------------------------------------------------


def test_rollout_base_url() -> None:
    assert rollout_base_url("http://h:1", "3-2-a1") == "http://h:1/ng-rollout/3-2-a1/v1"
    assert rollout_base_url("http://h:1/", "r1") == "http://h:1/ng-rollout/r1/v1"
    with pytest.raises(InvalidRolloutIdError):
        rollout_base_url("http://h:1", "a/../b")


def test_builtin_tools_never_raise() -> None:
    assert run_tool("calculator", '{"expression": "(2 + 3) * 4 ** 2"}') == "80"
    assert run_tool("calculator", '{"expression": "__import__(\'os\')"}').startswith("error:")
    assert (
        run_tool("calculator", '{"expression": "9 ** 999999"}') == "error: the power is too large"
    )
    assert run_tool("calculator", '{"expression": "1 / 0"}').startswith("error:")
    assert run_tool("lookup", '{"query": "the largest planet?"}').startswith("Jupiter")
    assert run_tool("lookup", '{"query": "nothing"}').startswith("No entry")
    assert run_tool("lookup", "{not json").startswith("error: the arguments are not valid JSON")
    assert run_tool("lookup", '{"wrong": 1}').startswith("error:")
    assert run_tool("rm", "{}") == "error: unknown tool 'rm'"


def test_prompt_and_grading() -> None:
    task = {"question": "2+2?", "options": {"A": "3", "B": "4"}, "answer": "B"}
    assert "(A) 3\n(B) 4" in task_prompt(task)
    assert task_prompt({"prompt": "hi"}) == "hi"
    with pytest.raises(CollectError):
        task_prompt({"question": "no options"})
    assert parse_answer("The answer is (C).") == "C"
    assert parse_answer("Answer: d") is None  # letters are upper case
    assert parse_answer("(A) looks wrong; the answer is B") == "B"
    assert parse_answer("B") == "B"
    assert parse_answer("The answer is (E).", "ABCD") is None
    assert grade(task, {"output_text": "The answer is (B)."}) == {"reward": 1.0,
                                                                  "parsed_answer": "B"}  # fmt: skip
    assert grade(task, {"output_text": "no idea"}) == {"reward": 0.0, "parsed_answer": None}
    assert grade({"prompt": "x"}, {"output_text": "(A)"}) == {"reward": None, "parsed_answer": "A"}
