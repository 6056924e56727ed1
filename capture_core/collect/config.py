"""What a collection is told: :class:`CollectConfig`, and the check of its options."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass

from capture_core.collect.agent import Dialect
from capture_core.collect.attachment import DEFAULT_DRAIN_TIMEOUT_S
from capture_core.collect.attempts import DEFAULT_MAX_ATTEMPTS, CollectError
from capture_core.collect.preflight import validate_run_id
from capture_core.tokens import TokenIdCaptureConfig

__all__ = ["CollectConfig"]


@dataclass(frozen=True)
class CollectConfig:
    """What to collect and where.

    Attributes:
        input: the task JSONL (``None``: the bundled example tasks).
        output: the rollout JSONL; failures go to ``<stem>_failures.jsonl`` beside it.
        model_url: the capture server's root URL.
        capture_dirs: the capture directories to clear and read (empty: capture off).
        limit: use only the first ``limit`` tasks.
        num_repeats: rollouts per task.
        concurrency: rollouts run at once.
        resume: keep the output and run only what is missing (under the run id it records).
        overwrite: move an existing output (and failures) file, and the capture files of the
            rollouts about to run, into a dated ``overwritten-<UTC time>/`` folder beside them.
            Without ``resume`` or ``overwrite``, existing data is refused, never replaced.
        run_id: prefix every rollout id as ``<run_id>.<task>-<rollout>`` (and record
            ``_ng_run_id``), so runs sharing a capture directory never share a file; ``None``
            keeps the bare ``<task>-<rollout>`` ids (``ngcapture collect`` makes one per run).
        check_server: before anything else, check that ``model_url`` answers and captures
            into one of ``capture_dirs`` (see :func:`~capture_core.collect.check_server`).
        drain_timeout_s: bound on waiting for in-flight capture writes (before clearing, in
            all; after each rollout, per rollout).
        tools: let the simple agent use its built-in tools.
        dialect: ``responses``, ``chat`` or ``messages`` (Anthropic Messages).
        model: the model name the agent sends.
        max_attempts: a row that failed this many times is not run again.
        max_turns: model calls per rollout, at most.
        timeout_s: the agent's request timeout.
        token_capture: token-id capture (the ``token_id_capture`` block): the default agent
            calls the training-capture route, and each successful rollout's
            ``response.output`` is rebuilt with token ids (or masked), its snapshot dropped
            once the line is durable; the run aborts past ``max_mask_fraction``
            (:mod:`capture_core.collect.token_delivery`).
    """

    input: str | os.PathLike[str] | None
    output: str | os.PathLike[str]
    model_url: str
    capture_dirs: Sequence[str | os.PathLike[str]] = ()
    _: KW_ONLY
    limit: int | None = None
    num_repeats: int = 1
    concurrency: int = 4
    resume: bool = False
    overwrite: bool = False
    run_id: str | None = None
    check_server: bool = True
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    tools: bool = False
    dialect: Dialect = "responses"
    model: str = "sim-model-1"
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_turns: int = 4
    timeout_s: float = 60.0
    token_capture: TokenIdCaptureConfig | None = None


def _check(config: CollectConfig) -> None:
    if config.concurrency < 1:
        raise CollectError(f"concurrency must be at least 1, got {config.concurrency}")
    if config.num_repeats < 1:
        raise CollectError(f"num_repeats must be at least 1, got {config.num_repeats}")
    if config.limit is not None and config.limit < 0:
        raise CollectError(f"limit must be >= 0, got {config.limit}")
    if config.max_attempts < 1:
        raise CollectError(f"max_attempts must be at least 1, got {config.max_attempts}")
    if not math.isfinite(config.drain_timeout_s) or config.drain_timeout_s < 0:
        raise CollectError(f"drain_timeout_s must be >= 0, got {config.drain_timeout_s}")
    if config.resume and config.overwrite:
        raise CollectError("resume and overwrite exclude each other: choose one")
    if config.run_id is not None:
        validate_run_id(config.run_id)
