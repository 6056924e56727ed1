"""A rollout rerun under the same id after its capture server died: the dead server's marks
belong to the attempt that was archived, not to the rerun.

Was: clearing kept them, so the rerun's attachment (and the analysis) reported
``model_call_capture_lost`` for a call of the earlier attempt although every call of the rerun
landed, and the clearing log counted them as writes still pending that "land in the new
attempt's file" (a dead server's writes never land).
"""

from __future__ import annotations

from pathlib import Path

from capture_core import CaptureStore
from capture_core.collect import clear_rollouts
from capture_core.collect.attachment import capture_attachment
from capture_core.pending import pending_calls
from capture_core.testing import Answer, capture_line
from capture_core.writers import CaptureWriter
from tests.capture_core.test_writers import dead_writer


def test_a_rerun_does_not_inherit_the_lost_calls_of_the_attempt_it_archives(tmp_path: Path) -> None:  # fmt: skip
    store = CaptureStore(tmp_path)
    store.record("0-0", capture_line("chat", Answer(), model_call_id="a" * 32))  # landed earlier
    dead_writer(tmp_path, "0-0", "b" * 32)  # the server died with this call in flight
    dead_writer(tmp_path, "0-1", "c" * 32)  # another rollout, not rerun: its loss stays
    live = CaptureWriter(tmp_path)
    try:
        live.mark("0-0", "d" * 32)  # a straggler of a running server: still pending
        report = clear_rollouts([tmp_path], ["0-0"], wait_s=0.2)
        assert report.lost == {"0-0": ["b" * 32]}
        assert report.still_pending == {"0-0": ["d" * 32]}
        assert [(c.rollout_id, c.model_call_id, c.state) for c in pending_calls(tmp_path)] == [
            ("0-0", "d" * 32, "live"),
            ("0-1", "c" * 32, "dead"),
        ]
        live.unmark("0-0", "d" * 32)
    finally:
        live.close()
    store.record("0-0", capture_line("chat", Answer(), model_call_id="e" * 32))  # the rerun
    rerun = capture_attachment([tmp_path], "0-0", drain_timeout_s=0.2)
    assert [call.model_call_id for call in rerun.calls] == ["e" * 32]
    assert rerun.gaps == []
    other = capture_attachment([tmp_path], "0-1", drain_timeout_s=0.2)
    assert [gap.code for gap in other.gaps] == ["model_call_capture_lost"]
