"""The appender process from the server's side: a real process over a real socketpair.

Lines sent from many tasks at once all land and are journaled; a killed appender fails exactly
the calls it had not answered and a new one takes over; a file another process holds locked
holds up only its own calls; closing waits for the process to finish and exit.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import time
from pathlib import Path

import orjson
import pytest

from capture_core import AppenderError, CaptureStore
from capture_core.appender import Appender
from capture_core.facts import FACTS_KEY, FACTS_VERSION
from capture_core.facts_journal import JOURNAL_DIR, FactsJournalEntry, journal_fields
from tests.capture_core.appender.test_batch import held_by_another_process

TOKEN = "0123456789abcdef0123456789abcdef"


def _line(rollout: str, index: int) -> tuple[bytes, bytes]:
    line = {"model_call_id": f"{rollout}-c{index}", "dialect": "chat", "status_code": 200,
            FACTS_KEY: {"v": FACTS_VERSION, "input_tokens": index}}  # fmt: skip
    fields = journal_fields(line)
    assert fields is not None
    return orjson.dumps(line) + b"\n", fields


def _journal(root: Path) -> list[FactsJournalEntry]:
    path = root / JOURNAL_DIR / f"{TOKEN}.jsonl"
    return [FactsJournalEntry.model_validate_json(x) for x in path.read_bytes().splitlines()]


def test_lines_sent_at_once_from_many_tasks_all_land_and_are_journaled(tmp_path: Path) -> None:
    async def main() -> list[int]:
        appender = Appender(tmp_path, TOKEN)
        try:
            jobs = []
            for index in range(200):  # 20 rollouts, 10 calls each, all in flight together
                rollout = f"r{index % 20}"
                line, fields = _line(rollout, index)
                jobs.append(appender.append(f"{rollout}.capture.jsonl", line, fields))
            return list(await asyncio.gather(*jobs))
        finally:
            await appender.aclose()

    written = asyncio.run(main())
    assert all(count > 0 for count in written)
    store = CaptureStore(tmp_path)
    landed = {e.data["model_call_id"] for r in range(20) for e in store.read(f"r{r}").entries}
    assert landed == {f"r{i % 20}-c{i}" for i in range(200)}
    entries = _journal(tmp_path)
    assert {e.model_call_id for e in entries} == landed
    for rollout in range(20):  # each file's entries chain, and the last is the file as it is
        mine = sorted((e for e in entries if e.file == f"r{rollout}.capture.jsonl"),
                      key=lambda e: e.offset)  # fmt: skip
        assert [e.size_before for e in mine] == [0] + [e.size for e in mine[:-1]]
        assert [e.mtime_before_ns for e in mine[1:]] == [e.mtime_ns for e in mine[:-1]]
        stat = os.stat(tmp_path / f"r{rollout}.capture.jsonl")
        assert (mine[-1].size, mine[-1].mtime_ns, mine[-1].inode) == (
            stat.st_size, stat.st_mtime_ns, stat.st_ino)  # fmt: skip
    # Sent in one go, they were appended in batches: lines of one file under one lock.
    assert any(e.mtime_before_ns == e.mtime_ns and e.size_before > 0 for e in entries)


def test_a_killed_appender_fails_what_it_had_not_answered_and_a_new_one_takes_over(
    tmp_path: Path,
) -> None:
    busy = tmp_path / "busy.capture.jsonl"
    busy.write_bytes(b"")

    async def main() -> tuple[BaseException | int, int, int, int | None]:
        appender = Appender(tmp_path, TOKEN)
        try:
            line, fields = _line("busy", 0)
            first_pid = (await appender.start()).process.pid
            with held_by_another_process(busy):  # its line waits for the lock: unanswered
                waiting = asyncio.ensure_future(appender.append(busy.name, line, fields))
                await asyncio.sleep(0.3)
                assert not waiting.done()
                os.kill(first_pid, signal.SIGKILL)
                outcome = (await asyncio.gather(waiting, return_exceptions=True))[0]
            again = await appender.append("after.capture.jsonl", *_line("after", 1))
            return outcome, again, appender.starts, appender.pid
        finally:
            await appender.aclose()

    outcome, again, starts, pid = asyncio.run(main())
    assert isinstance(outcome, AppenderError)
    assert "exited with code -9 before confirming the line; it may have landed" in str(outcome)
    assert again > 0 and starts == 2 and pid is not None
    assert [e.data["model_call_id"] for e in CaptureStore(tmp_path).read("after").entries] == [
        "after-c1"
    ]


def test_a_file_another_process_holds_holds_up_only_its_own_calls(tmp_path: Path) -> None:
    busy = tmp_path / "busy.capture.jsonl"
    busy.write_bytes(b"")

    async def main() -> tuple[float, float]:
        appender = Appender(tmp_path, TOKEN)
        try:
            await appender.start()
            with held_by_another_process(busy):
                waiting = asyncio.ensure_future(appender.append(busy.name, *_line("busy", 0)))
                started = time.monotonic()
                for index in range(20):  # answered while the busy file's call still waits
                    await appender.append("free.capture.jsonl", *_line("free", index))
                free_s = time.monotonic() - started
                assert not waiting.done()
                released = time.monotonic()
            await waiting
            return free_s, time.monotonic() - released
        finally:
            await appender.aclose()

    free_s, after_release_s = asyncio.run(main())
    assert free_s < 10 and after_release_s < 10  # bounds, not timings: neither waited forever
    store = CaptureStore(tmp_path)
    assert len(store.read("free").entries) == 20 and len(store.read("busy").entries) == 1


def test_a_name_outside_the_directory_is_refused_with_its_reason(tmp_path: Path) -> None:
    root = tmp_path / "calls"
    root.mkdir()

    async def main() -> BaseException:
        appender = Appender(root, TOKEN)
        try:
            with pytest.raises(AppenderError) as caught:
                await appender.append("../out.capture.jsonl", *_line("x", 0))
            return caught.value
        finally:
            await appender.aclose()

    error = asyncio.run(main())
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.EINVAL
    assert "not a capture file name" in str(error)
    assert not (tmp_path / "out.capture.jsonl").exists()


def test_it_ignores_the_terminals_signals_and_exits_once_closed(tmp_path: Path) -> None:
    async def main() -> tuple[int, int | None]:
        appender = Appender(tmp_path, TOKEN)
        link = await appender.start()
        await appender.append("a.capture.jsonl", *_line("a", 0))  # it runs
        for sig in (signal.SIGINT, signal.SIGTERM):  # what Ctrl-C sends the process group
            os.kill(link.process.pid, sig)
        await asyncio.sleep(0.2)
        written = await appender.append("a.capture.jsonl", *_line("a", 1))
        await appender.aclose()
        return written, link.process.returncode

    written, code = asyncio.run(main())
    assert written > 0 and code == 0


def test_closing_waits_for_the_answers_of_lines_sent_and_then_refuses_more(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[list[int], BaseException | None, int | None]:
        appender = Appender(tmp_path, TOKEN)
        link = await appender.start()
        sent = [asyncio.ensure_future(appender.append("c.capture.jsonl", *_line("c", index)))
                for index in range(50)]  # fmt: skip
        await asyncio.sleep(0)  # all 50 are on the socket when the server stops
        await appender.aclose()
        written = [await future for future in sent]  # answered, not failed
        try:
            await appender.append("c.capture.jsonl", *_line("c", 99))
        except AppenderError as exc:
            return written, exc, link.process.returncode
        return written, None, link.process.returncode

    written, refused, code = asyncio.run(main())
    assert all(count > 0 for count in written) and code == 0
    assert refused is not None and "stopping" in str(refused)
    assert len(CaptureStore(tmp_path).read("c").entries) == 50


def test_a_batch_that_raises_is_answered_as_failed_not_left_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from capture_core._spare import Spare
    from capture_core.appender import process
    from capture_core.appender.frames import Request

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug")

    monkeypatch.setattr(process, "append_batch", broken)
    requests = [Request(job, "a.capture.jsonl", b"", b"{}\n") for job in range(3)]
    outcomes, blocked = process._append_or_fail(str(tmp_path), requests, wait=False,
                                                spare=Spare(), synced=set())  # fmt: skip
    assert blocked == [] and [o.request.job for o in outcomes] == [0, 1, 2]
    assert all(o.appended is None for o in outcomes)
    assert process._reason(outcomes[0].error) == (
        "appender error (RuntimeError: a bug); the line may have landed"
    )
