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
import logging
import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import KW_ONLY, asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import orjson

from capture_core.collect.agent import Agent, Dialect, SimpleAgent
from capture_core.collect.attachment import DEFAULT_DRAIN_TIMEOUT_S, capture_attachment
from capture_core.collect.attempts import (
    CLEARED_DIR,
    DEFAULT_MAX_ATTEMPTS,
    AttemptPlan,
    BadLine,
    CollectError,
    clear_rollouts,
    expand_rows,
    failures_path,
    load_resume_state,
    plan_attempts,
    read_jsonl_rows,
    repair_torn_tail,
    rollout_ids,
)
from capture_core.collect.grader import grade
from capture_core.collect.preflight import (
    ARCHIVE_PREFIX,
    archive_files,
    archive_folder,
    capture_collisions,
    check_output,
    check_server,
    run_ids_in,
    stamp_run_id,
    utc_stamp,
    validate_run_id,
)
from capture_core.collect.token_delivery import (
    open_token_delivery,
    token_capture_on,
    token_delivery_summary,
)
from capture_core.collect.trajectory import attach_evidence
from capture_core.exceptions import MaskFractionExceededError
from capture_core.ids import ATTEMPT_INDEX_KEY
from capture_core.records import ATTACHMENT_KEY
from capture_core.tokens import TokenDelivery, TokenIdCaptureConfig

__all__ = ["EXAMPLE_TASKS", "CollectConfig", "CollectSummary", "Grader", "collect"]

logger = logging.getLogger(__name__)

EXAMPLE_TASKS: Final = Path(__file__).with_name("data") / "mcqa_example.jsonl"
FAILURE_KEY: Final = "ng_failure"
Grader = Callable[[Mapping[str, Any], Mapping[str, Any]], Mapping[str, Any]]


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


@dataclass
class CollectSummary:
    """What a collection did, with totals over the rollouts it ran (not earlier runs')."""

    output: Path
    failures: Path
    tasks: int = 0
    bad_input_lines: list[BadLine] = field(default_factory=list)
    dispatched: int = 0
    already_finished: int = 0
    exhausted: int = 0
    ok: int = 0
    failed: int = 0
    mean_reward: float | None = None
    num_calls: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_total: int | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    gaps: dict[str, int] = field(default_factory=dict)
    cleared_files: int = 0
    cleared_still_pending: int = 0
    run_id: str | None = None
    archived: list[Path] = field(default_factory=list)
    elapsed_s: float = 0.0
    token_capture: dict[str, Any] | None = None
    """Token delivery: finalized, masked, retired, kept, masked_fraction, reasons."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (paths as strings)."""
        data = asdict(self)
        data["output"], data["failures"] = str(self.output), str(self.failures)
        data["archived"] = [str(path) for path in self.archived]
        data["bad_input_lines"] = [
            {"line_number": b.line_number, "reason": b.reason} for b in self.bad_input_lines
        ]
        return data

    def format(self) -> str:
        """A few human lines, as the CLI prints them."""

        def num(value: float | None, unit: str = "") -> str:
            if value is None:
                return "unknown"
            return f"{value:,}{unit}" if isinstance(value, int) else f"{value:,.1f}{unit}"

        reward = "n/a" if self.mean_reward is None else f"{self.mean_reward:.3f}"
        gaps = ", ".join(f"{code} {n}" for code, n in sorted(self.gaps.items())) or "none"
        return "\n".join([
            f"rollouts: {self.ok} ok, {self.failed} failed (dispatched {self.dispatched}; "
            f"{self.already_finished} already finished, {self.exhausted} out of attempts)",
            f"mean reward: {reward}",
            f"model calls: {self.num_calls}; tokens in {num(self.tokens_in)}, "
            f"out {num(self.tokens_out)}, total {num(self.tokens_total)}",
            f"latency per call: p50 {num(self.latency_p50_ms, ' ms')}, "
            f"p95 {num(self.latency_p95_ms, ' ms')}",
            f"gaps: {gaps}",
            f"bad input lines skipped: {len(self.bad_input_lines)}; earlier capture archived: "
            f"{self.cleared_files} file(s), {self.cleared_still_pending} write(s) still pending",
            *_token_line(self.token_capture),
            f"run id: {self.run_id or 'none (bare <task>-<rollout> ids)'}",
            f"output: {self.output}",
            f"failures: {self.failures}",
            *(f"earlier data moved to: {folder}" for folder in self.archived),
        ])  # fmt: skip


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


def _plan(
    config: CollectConfig, source: Path, summary: CollectSummary
) -> tuple[list[Path], AttemptPlan, list[str]]:
    """Check the directories, the server and earlier data; read the tasks and plan the run."""
    dirs = [_capture_dir(d) for d in config.capture_dirs]
    if config.check_server:
        check_server(config.model_url, dirs)
    output = summary.output
    check_output(output, summary.failures, resume=config.resume, overwrite=config.overwrite)
    read = read_jsonl_rows(source)
    for bad in read.bad:
        logger.warning("skipping input line %d of %s: %s", bad.line_number, source, bad.reason)
    tasks = read.rows[: config.limit] if config.limit is not None else read.rows
    summary.tasks, summary.bad_input_lines = len(tasks), read.bad
    summary.run_id = _run_id(config, output)
    rows = expand_rows(tasks, config.num_repeats)
    if summary.run_id is not None:
        rows = [stamp_run_id(row, summary.run_id) for row in rows]
    state = load_resume_state(output) if config.resume else None
    plan = plan_attempts(rows, state, max_attempts=config.max_attempts)
    ids = rollout_ids(plan.dispatch)
    collisions = capture_collisions(dirs, ids) if not config.resume else {}
    if collisions and not config.overwrite:
        root, clashing = next(iter(collisions.items()))
        more = ", ..." if len(clashing) > 3 else ""
        raise CollectError(
            f"capture directory {root} already holds the capture of {len(clashing)} "
            f"rollout(s) this run would write ({', '.join(clashing[:3])}{more}): --resume "
            "continues that run, --overwrite moves them to a dated folder first, --run-id "
            "gives this run ids of its own (nothing was changed)"
        )
    summary.dispatched = len(plan.dispatch)
    summary.already_finished, summary.exhausted = len(plan.finished), len(plan.exhausted)
    return dirs, plan, ids


def _make_room(
    config: CollectConfig, summary: CollectSummary, dirs: list[Path], ids: list[str]
) -> None:
    """Start (or reopen) the output files and archive the capture of the ids about to run.

    ``overwrite`` moves earlier data into a dated ``overwritten-<UTC time>`` folder beside it;
    a resumed run's leftovers (rollouts killed mid-run, rerun under the same id) go to
    ``.cleared/``.
    """
    output, failures = summary.output, summary.failures
    stamp = utc_stamp()
    output.parent.mkdir(parents=True, exist_ok=True)
    if config.resume:
        for path in (output, failures):
            repair_torn_tail(path)
    else:
        if config.overwrite and (output.exists() or failures.exists()):
            folder = archive_folder(output.parent, stamp)
            archive_files([output, failures], folder)
            summary.archived.append(folder)
        for path in (output, failures):
            path.write_bytes(b"")
    if not dirs:
        return
    into = f"{ARCHIVE_PREFIX}{stamp}" if config.overwrite else CLEARED_DIR
    cleared = clear_rollouts(dirs, ids, wait_s=config.drain_timeout_s, into=into)
    summary.cleared_files, summary.cleared_still_pending = len(cleared.moved), cleared.pending_count
    if config.overwrite:
        summary.archived += sorted({path.parent for path in cleared.moved})


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


def _capture_dir(directory: str | os.PathLike[str]) -> Path:
    """An existing capture directory: a collector reads, it never creates one."""
    path = Path(directory)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise CollectError(
            f"capture directory {path} {what}: the capture server creates it when it starts "
            "with --capture-dir; pass the same directory to both"
        )
    return path


def _run_id(config: CollectConfig, output: Path) -> str | None:
    """The run id: the one a resumed output records, else the configured one."""
    if not config.resume or not output.exists():
        return config.run_id
    recorded = run_ids_in(output)
    if len(recorded) > 1:
        raise CollectError(
            f"{output} mixes several runs ({', '.join(sorted(map(str, recorded)))}); resume "
            "one run per output file"
        )
    found = next(iter(recorded), config.run_id)
    if recorded and config.run_id is not None and found != config.run_id:
        what = f"run id {found!r}" if found else "no run id"
        raise CollectError(
            f"{output} records {what}, not {config.run_id!r}: drop --run-id to resume it"
        )
    return found


def _default_agent(config: CollectConfig) -> Agent:
    return SimpleAgent(config.model_url, model=config.model, dialect=config.dialect,
                       tools=config.tools, max_turns=config.max_turns,
                       timeout_s=config.timeout_s,
                       token_capture=token_capture_on(config.token_capture))  # fmt: skip


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


class _Appender:
    """One JSON line per record, appended whole under a lock, flushed and fsynced."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None

    def __enter__(self) -> _Appender:
        self._file = self._path.open("ab")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def write(self, record: Mapping[str, Any]) -> None:
        """Raises TypeError (nothing written) if the record cannot be encoded as JSON."""
        line = orjson.dumps(
            record, default=str, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS
        )
        with self._lock:
            if self._file is None:
                raise CollectError("the output file is closed", path=self._path)
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())


class _Progress:
    """``\\r``-updated progress line on stderr, only when stderr is a terminal."""

    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        self._stream = stream or sys.stderr
        self._enabled = self._stream.isatty()
        self._total, self._ok, self._failed = total, 0, 0
        self._started = time.monotonic()

    def __enter__(self) -> _Progress:
        self._draw()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._enabled:
            self._stream.write("\n")
            self._stream.flush()

    def advance(self, *, ok: bool) -> None:
        self._ok += ok
        self._failed += not ok
        self._draw()

    def _draw(self) -> None:
        if not self._enabled:
            return
        done = self._ok + self._failed
        width = 30
        filled = width * done // self._total if self._total else width
        bar = "#" * filled + "." * (width - filled)
        elapsed = time.monotonic() - self._started
        self._stream.write(f"\rcollect [{bar}] {done}/{self._total} ok {self._ok} "
                           f"failed {self._failed} {elapsed:.0f}s")  # fmt: skip
        self._stream.flush()


def _token_line(token_capture: Mapping[str, Any] | None) -> list[str]:
    if token_capture is None:
        return []
    reasons = ", ".join(f"{reason} {n}" for reason, n in token_capture["reasons"].items())
    return [
        f"token capture: {token_capture['finalized']} finalized, {token_capture['masked']} "
        f"masked ({reasons or 'none'}), {token_capture['retired']} retired, "
        f"{token_capture['kept']} kept"
    ]


def _totals(summary: CollectSummary, records: list[dict[str, Any]], failed: int) -> None:
    summary.failed, summary.ok = failed, len(records) - failed
    rewards = [
        float(r["reward"])
        for r in records
        if FAILURE_KEY not in r and isinstance(r.get("reward"), int | float)
    ]
    summary.mean_reward = round(sum(rewards) / len(rewards), 6) if rewards else None
    latencies: list[float] = []
    gaps: Counter[str] = Counter()
    for record in records:
        capture = record.get(ATTACHMENT_KEY)
        if not isinstance(capture, dict):
            continue
        metrics = capture["metrics"]
        summary.num_calls += metrics["num_calls"]
        for name in ("tokens_in", "tokens_out", "tokens_total"):
            if metrics[name] is not None:
                setattr(summary, name, (getattr(summary, name) or 0) + metrics[name])
        latencies += [c["latency_total_ms"] for c in capture["calls"]
                      if c.get("latency_total_ms") is not None]  # fmt: skip
        gaps.update(gap["code"] for gap in capture.get("gaps", ()))
    summary.gaps = dict(sorted(gaps.items()))
    summary.latency_p50_ms = _percentile(latencies, 0.50)
    summary.latency_p95_ms = _percentile(latencies, 0.95)


def _percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]
