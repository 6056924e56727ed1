"""A capture server compacts its facts journal into columnar segments, end to end: a real
server process (``ngcapture serve``) and the simulated worker, calls over HTTP, and the store
opened afterwards by ``open_run`` from the segments with the rows its lines give (issue 19)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
from polars.testing import assert_frame_equal

import ngcapture_viz as ngv
from capture_core import CaptureStore, facts_journal, journal_file
from capture_core._appending import Appended
from capture_core.facts import FACTS_KEY, FACTS_VERSION
from capture_core.facts_journal import JOURNAL_DIR
from capture_core.testing import request_body
from capture_core.testing.processes import run_capture_server, run_worker
from capture_core.writers import CaptureWriter
from ngcapture_viz.load._file_state import RACY_NS
from ngcapture_viz.load.index import INDEX_DIR_NAME
from ngcapture_viz.load.journal_segments import SEGMENT_SUFFIX, segment_chain
from tests.ngcapture_viz.test_facts_journal import _append, _lines

CALLS = 60
WAIT_S = 60.0


def _covered(journal: Path) -> int:
    """Bytes of ``journal`` its segments hold, from its start."""
    fd = os.open(journal, os.O_RDONLY)
    try:
        chain = segment_chain(str(journal), fd)
    finally:
        os.close(fd)
    return chain[-1].end if chain else 0


def _open(root: Path) -> ngv.Run:
    shutil.rmtree(root / INDEX_DIR_NAME, ignore_errors=True)
    return ngv.open_run(root)


def _segments(root: Path) -> list[str]:
    return sorted(path.name for path in (root / JOURNAL_DIR).glob(f"*{SEGMENT_SUFFIX}"))


def _calls(client: httpx.Client, url: str, first: int, count: int) -> None:
    for number in range(first, first + count):
        body = request_body("chat", stream=number % 3 == 0)
        answer = client.post(f"{url}/ng-rollout/r-{number % 7}/v1/chat/completions", json=body)
        assert answer.status_code == 200


def test_the_server_compacts_its_journal_as_it_grows_and_when_it_stops(tmp_path: Path) -> None:
    root = tmp_path / "calls"
    # Small enough that the journal passes it during the calls (entries are ~700 bytes).
    env = {"NGCAPTURE_JOURNAL_SEGMENT_BYTES": "20000"}
    with run_worker(seed=5) as worker, run_capture_server(worker.url, root, env=env) as server:
        with httpx.Client(timeout=30) as client:
            _calls(client, server.url, 0, CALLS - 10)
            # The compaction started on the way runs while the server serves (a process of
            # its own: Python and Polars start first).
            deadline = time.monotonic() + WAIT_S
            while not _segments(root) and time.monotonic() < deadline:
                time.sleep(0.1)
            during = _segments(root)
            assert during, server.log()
            _calls(client, server.url, CALLS - 10, 10)  # entries no run has seen yet
        journal = next((root / JOURNAL_DIR).glob("*.jsonl"))
        assert server.stop() == 0, server.log()
    # The server does not wait for its last compaction: it ends on its own, soon.
    size = journal.stat().st_size
    deadline = time.monotonic() + WAIT_S
    while _covered(journal) < size and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _covered(journal) == size
    segments = _segments(root)
    assert len(segments) > len(during), (during, segments)
    assert set(during) <= set(segments)  # a later run adds segments, never rewrites one

    # A file modified within the racy window is read from its lines whatever the journal says.
    newest = max(path.stat().st_mtime_ns for path in root.glob("*.capture.jsonl"))
    time.sleep(max(0.0, (newest + RACY_NS) / 1e9 + 0.2 - time.time()))
    from_segments = _open(root)
    assert from_segments.calls.height == CALLS
    assert from_segments.index_stats.decoded.get("segments") == CALLS, (
        from_segments.index_stats.decoded
    )
    for path in (root / JOURNAL_DIR).glob(f"*{SEGMENT_SUFFIX}"):
        path.unlink()
    from_lines = _open(root)
    assert "segments" not in from_lines.index_stats.decoded
    for name in ("calls", "tool_calls", "rollouts", "gaps"):
        assert_frame_equal(getattr(from_segments, name), getattr(from_lines, name))


def test_the_compactor_imports_nothing_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server started from a folder others can write to: a module planted there must not run
    # in the compaction process (python -m would put the working directory first on its path).
    planted = tmp_path / "cwd"
    planted.mkdir()
    marker = tmp_path / "planted-module-ran"
    for module in ("polars", "numpy", "msgspec", "click"):
        (planted / f"{module}.py").write_text(f"open({str(marker)!r}, 'a').write('{module}')\n")
    monkeypatch.chdir(planted)
    root = tmp_path / "calls"
    store = CaptureStore(root, create=True)
    writer = CaptureWriter(root, segment_bytes=4000)
    for number, line in enumerate(_lines(seed=4, n=30)):
        _append(store, writer, f"r-{number % 4}", line)
    journal = writer.journal
    writer.close()  # the last run, started regardless of one still running
    assert journal.compactions >= 2
    assert journal._compactor is not None
    journal._compactor.wait(WAIT_S)
    assert journal._compactor.returncode == 0
    assert not marker.exists(), marker.read_text()
    size = journal.path.stat().st_size
    deadline = time.monotonic() + WAIT_S  # an earlier run may still be writing
    while _covered(journal.path) < size and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _covered(journal.path) == size


class _Running:
    """A compaction process that never ends (it counts how often it is asked)."""

    polls = 0

    def poll(self) -> int | None:
        _Running.polls += 1
        return None


def _journal_of(root: Path, *, segment_bytes: int, entries: int) -> facts_journal.FactsJournal:
    """A journal of ``entries`` entries of ~750 bytes, noted then closed, its compaction
    processes replaced by ``_Running`` (``journal.compactions`` counts the starts)."""
    journal = facts_journal.FactsJournal(root, "t", segment_bytes=segment_bytes)
    line = {"model_call_id": "c" * 32, "dialect": "chat",
            FACTS_KEY: {"v": FACTS_VERSION, "reasoning_content": "r" * 600}}  # fmt: skip
    at = Appended(11, False, 0, 11, 5, 7, 10, 0, 4)
    for _ in range(entries):
        journal.note("a.capture.jsonl", at, line)
    journal.close()
    return journal


@pytest.fixture
def running(monkeypatch: pytest.MonkeyPatch) -> type[_Running]:
    _Running.polls = 0
    monkeypatch.setattr(journal_file, "_start_compactor", lambda path: _Running())
    return _Running


def test_a_running_compaction_is_not_polled_at_every_call(
    tmp_path: Path, running: type[_Running]
) -> None:
    # ~300 KB: one run started at 80 KB, then one running.
    journal = _journal_of(tmp_path, segment_bytes=80_000, entries=400)
    assert journal.path.stat().st_size > 250_000
    # Looked at every tenth of the interval (10 KB), not at each of the ~290 later entries;
    # and the last run, when the journal closes, started although one runs.
    assert journal.compactions == 2
    assert 10 <= running.polls <= 40


@pytest.mark.parametrize(
    ("segment_bytes", "started"),
    [(0, 0), (facts_journal.SEGMENT_BYTES, 1)],
    ids=["never", "the server's default"],
)
def test_a_journal_past_1_mib_is_compacted_when_it_closes_unless_told_never(
    tmp_path: Path, running: type[_Running], segment_bytes: int, started: int
) -> None:
    # ~1.1 MiB: under the default interval (no run while the server serves), over the 1 MiB
    # that makes a stopping server compact; 0 means never, at close too.
    journal = _journal_of(tmp_path, segment_bytes=segment_bytes, entries=1_500)
    assert journal.path.stat().st_size > facts_journal.CLOSE_SEGMENT_BYTES
    assert journal.compactions == started
