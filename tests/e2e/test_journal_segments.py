"""A capture server compacts its facts journal into columnar segments, end to end: a real
server process (``ngcapture serve``) and the simulated worker, calls over HTTP, and the store
opened afterwards by ``open_run`` from the segments with the rows its lines give (issue 19)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
from polars.testing import assert_frame_equal

import ngcapture_viz as ngv
from capture_core.facts_journal import JOURNAL_DIR
from capture_core.testing import request_body
from capture_core.testing.processes import run_capture_server, run_worker
from ngcapture_viz.load._file_state import RACY_NS
from ngcapture_viz.load.index import INDEX_DIR_NAME
from ngcapture_viz.load.journal_segments import SEGMENT_SUFFIX, segment_chain

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


def test_a_server_told_never_to_compact_writes_no_segment(tmp_path: Path) -> None:
    root = tmp_path / "calls"
    env = {"NGCAPTURE_JOURNAL_SEGMENT_BYTES": "0"}
    with run_worker(seed=6) as worker, run_capture_server(worker.url, root, env=env) as server:
        with httpx.Client(timeout=30) as client:
            for _ in range(12):
                answer = client.post(
                    f"{server.url}/ng-rollout/r-1/v1/chat/completions", json=request_body("chat")
                )
                assert answer.status_code == 200
        assert server.stop() == 0
    time.sleep(0.5)
    assert list((root / JOURNAL_DIR).glob("*.jsonl"))
    assert not list((root / JOURNAL_DIR).glob(f"*{SEGMENT_SUFFIX}"))
