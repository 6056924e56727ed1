"""One rollout on a pool thread: run, grade, attach its capture, write its line.

A rollout whose agent or grader raised, or whose record JSON cannot hold, is written to the
failures sidecar under :data:`FAILURE_KEY` (with its attempt) instead of the output.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from capture_core.collect.agent import Agent
from capture_core.collect.appender import _Appender
from capture_core.collect.attachment import capture_attachment
from capture_core.collect.config import CollectConfig
from capture_core.collect.trajectory import attach_evidence
from capture_core.exceptions import MaskFractionExceededError
from capture_core.ids import ATTEMPT_INDEX_KEY
from capture_core.records import ATTACHMENT_KEY
from capture_core.tokens import TokenDelivery

__all__ = ["FAILURE_KEY", "Grader"]

logger = logging.getLogger(__name__)

FAILURE_KEY: Final = "ng_failure"
Grader = Callable[[Mapping[str, Any], Mapping[str, Any]], Mapping[str, Any]]


class _Run:
    """Runs single rollouts on pool threads; keeps what the summary needs."""

    def __init__(
        self,
        config: CollectConfig,
        dirs: list[Path],
        agent: Agent,
        grader: Grader,
        delivery: TokenDelivery | None = None,
    ) -> None:
        self.config, self.dirs, self.agent, self.grader = config, dirs, agent, grader
        self.delivery = delivery
        self.aborted = threading.Event()  # set when the run is aborted: dispatch nothing more
        self.records: list[dict[str, Any]] = []
        self.failed = 0
        self._lock = threading.Lock()

    def one(
        self, row: dict[str, Any], rollout_id: str, successes: _Appender, failures: _Appender
    ) -> bool:
        """Run, grade, attach, write. Returns whether the rollout succeeded."""
        if self.aborted.is_set():
            return False
        result: dict[str, Any] = {}
        started, ended = time.time(), None  # the rollout's window, for ng_perf
        try:
            result = dict(self.agent.run(row, rollout_id))
            ended = time.time()
            record = {**row, **result}
            for key, value in self.grader(row, result).items():
                record.setdefault(key, value)
        except Exception as exc:  # an agent or grader failure is this rollout's failure
            ended = ended or time.time()
            record = self._failure(row, rollout_id, exc)
        attachment = None
        if self.dirs:
            attachment = capture_attachment(
                self.dirs, rollout_id, drain_timeout_s=self.config.drain_timeout_s, since=started
            )
        record = attach_evidence(record, row, result, attachment, window=(started, ended))
        ok = FAILURE_KEY not in record
        delivery = self.delivery if ok else None  # failed rollouts are not training samples
        build = delivery.finalize(record, rollout_id) if delivery is not None else None
        try:
            (successes if ok else failures).write(record)
        except TypeError as exc:  # the agent returned something JSON cannot hold
            ok = False
            record = {**self._failure(row, rollout_id, exc), **_capture_only(record)}
            failures.write(record)
        kept: dict[str, Any] = {k: record[k] for k in ("reward", ATTACHMENT_KEY) if k in record}
        with self._lock:
            self.records.append({**kept, FAILURE_KEY: True} if not ok else kept)
            self.failed += not ok
        if ok and delivery is not None:
            delivery.retire(rollout_id, build)  # the line is fsynced: drop exactly its snapshot
            try:
                delivery.check_mask_fraction()
            except MaskFractionExceededError:  # too many masked rollouts: abort the run
                self.aborted.set()
                raise
        return ok

    def _failure(self, row: dict[str, Any], rollout_id: str, exc: BaseException) -> dict[str, Any]:
        logger.warning("rollout %s failed: %s: %s", rollout_id, type(exc).__name__, exc)
        failure = {
            "rollout_id": rollout_id,
            "attempt": row.get(ATTEMPT_INDEX_KEY, 0),
            "error_type": type(exc).__name__,
            "error": str(exc)[:2000],
        }
        return {**row, FAILURE_KEY: failure}


def _capture_only(record: Mapping[str, Any]) -> dict[str, Any]:
    return {key: record[key] for key in (ATTACHMENT_KEY,) if key in record}
