"""The collection loop: read tasks, plan attempts, clear, dispatch, attach capture, write lines.

For each finished rollout the collector writes ONE line, appended with flush and fsync under a
lock, so a kill leaves only whole lines: the input row plus what the agent returned, the
grader's ``reward`` and ``parsed_answer`` (never overwriting the agent's own fields) and, when
capture directories are given, ``ng_model_call_capture`` and ``ng_trajectory``. A rollout whose
agent raised goes to the failures sidecar instead, with its attempt, so a resumed run retries it
under the next ``-a<n>`` id.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Final

from capture_core.collect.agent import Agent, SimpleAgent
from capture_core.collect.appender import _Appender
from capture_core.collect.attempts import CollectError, failures_path
from capture_core.collect.config import CollectConfig, _check
from capture_core.collect.grader import grade
from capture_core.collect.plan import _make_room, _plan
from capture_core.collect.progress import _Progress
from capture_core.collect.rollout import FAILURE_KEY, Grader, _Run
from capture_core.collect.summary import CollectSummary, _totals
from capture_core.collect.token_delivery import (
    open_token_delivery,
    token_capture_on,
    token_delivery_summary,
)

__all__ = [
    "EXAMPLE_TASKS",
    "FAILURE_KEY",
    "CollectConfig",
    "CollectSummary",
    "Grader",
    "collect",
]

EXAMPLE_TASKS: Final = Path(__file__).with_name("data") / "mcqa_example.jsonl"


def collect(
    config: CollectConfig, *, agent: Agent | None = None, grader: Grader = grade
) -> CollectSummary:
    """Run every missing rollout of the input tasks and write one output line per rollout.

    Args:
        config: what to collect and where.
        agent: runs one rollout (default: a :class:`SimpleAgent` from the config).
        grader: adds ``reward`` and ``parsed_answer`` (fields the agent set are kept).

    Everything that can refuse the run is checked before any file is touched: the options,
    the task file, the capture directories (they must exist: the capture server creates
    them), the server (:func:`check_server`), an output holding data, capture files of the
    rollouts about to run.

    Raises:
        CollectError: the configuration is unusable, the server is unreachable or captures
            elsewhere, earlier data would be replaced, or two rows would share a rollout id.
        CaptureStoreError: an earlier capture or output could not be moved aside.
        MaskFractionExceededError: with token-id capture, more than ``max_mask_fraction`` of
            the finalized rollouts were masked; nothing more is dispatched (rollouts already
            running finish and are written).

    Example:
        >>> summary = collect(CollectConfig(None, "out/rollouts.jsonl", "http://127.0.0.1:8000",
        ...                                 ["/abs/model-calls"], limit=5))  # doctest: +SKIP
        >>> summary.ok
        5
    """
    started = time.monotonic()
    _check(config)
    agent = agent or _default_agent(config)  # a bad option fails here, before any file changes
    output = Path(config.output)
    summary = CollectSummary(output=output, failures=failures_path(output))
    source = Path(config.input) if config.input is not None else EXAMPLE_TASKS
    if not source.is_file():
        raise CollectError("the input task file does not exist", path=source)
    dirs, plan, ids = _plan(config, source, summary)  # every check; nothing touched yet
    delivery = open_token_delivery(config.token_capture)  # refuses before anything changes
    _make_room(config, summary, dirs, ids)
    run = _Run(config, dirs, agent, grader, delivery)
    with (
        delivery if delivery is not None else contextlib.nullcontext(),
        _Appender(output) as successes,
        _Appender(summary.failures) as failures,
        _Progress(len(ids)) as progress,
        ThreadPoolExecutor(config.concurrency, thread_name_prefix="collect") as pool,
    ):
        if delivery is not None:
            delivery.prepare(ids)  # earlier token captures (and fences) of these ids go
        futures = [
            pool.submit(run.one, row, rid, successes, failures)
            for row, rid in zip(plan.dispatch, ids, strict=True)
        ]
        try:
            for future in as_completed(futures):
                progress.advance(ok=future.result())
        except BaseException:  # e.g. too many masked rollouts: dispatch nothing more
            for future in futures:
                future.cancel()
            raise
    _totals(summary, run.records, run.failed)
    summary.token_capture = token_delivery_summary(delivery)
    summary.elapsed_s = round(time.monotonic() - started, 3)
    return summary


def _default_agent(config: CollectConfig) -> Agent:
    return SimpleAgent(config.model_url, model=config.model, dialect=config.dialect,
                       tools=config.tools, max_turns=config.max_turns,
                       timeout_s=config.timeout_s,
                       token_capture=token_capture_on(config.token_capture))  # fmt: skip
