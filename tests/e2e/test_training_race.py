"""Retire racing live training calls: 4 capture-server processes, one shared lineage dir.

Each round sends calls of 50 fresh rollouts, spread over the 4 servers, while the test thread
retires half of those rollouts through :class:`RolloutControlClient` once about half the calls
are done. Afterwards no retired rollout has a ledger, and every other rollout's ledger holds
exactly one committed row per call it was served.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from capture_core.control_client import RolloutControlClient
from capture_core.lineage import LineageStore
from capture_core.testing.processes import ServiceProcess, run_capture_server, run_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SERVERS = 4
ROLLOUTS = 50
ROUNDS = 20
CALLS_PER_ROLLOUT = SERVERS  # one call per server: every rollout touches all four
CONCURRENCY = 16
BUDGET_S = 60.0
TOKEN = "race-token"
QUESTION = "Which is larger? (A) 2 (B) 3"


@dataclass
class Race:
    servers: list[ServiceProcess]
    lineage: LineageStore


@pytest.fixture(scope="module")
def race(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Race]:
    root = tmp_path_factory.mktemp("race")
    env = {"NGCAPTURE_CONTROL_TOKEN": TOKEN}
    with ExitStack() as stack:
        worker = stack.enter_context(
            run_worker(seed=3, staging_dir=root / "staging", ttft_ms=0, ms_per_token=0)
        )
        servers = [
            stack.enter_context(
                run_capture_server(worker.url, None, lineage_dir=root / "lineage", env=env)
            )
            for _ in range(SERVERS)
        ]
        yield Race(servers, LineageStore(root / "lineage"))


@dataclass(frozen=True)
class Served:
    rollout_id: str
    status: int
    model_call_id: str


def call(client: httpx.Client, server: ServiceProcess, rollout_id: str, index: int) -> Served:
    base = f"{server.url}/ng-rollout/{rollout_id}/training-token-capture/v1"
    if index % 2:
        response = client.post(f"{base}/responses", json={"model": "m", "input": QUESTION})
    else:
        body = {"model": "m", "messages": [{"role": "user", "content": QUESTION}]}
        response = client.post(f"{base}/chat/completions", json=body)
    return Served(rollout_id, response.status_code, response.headers["x-ng-model-call-id"])


def ledger_lines_parse(path: Path) -> int:
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), f"{path.name} ends in a torn line"
    lines = raw.splitlines()
    for line in lines:
        assert isinstance(orjson.loads(line), dict), line
    return len(lines)


def test_retire_races_four_servers(race: Race) -> None:
    started = time.monotonic()
    served: list[Served] = []
    retired: set[str] = set()
    # One client per worker thread: a sync httpx pool shared by many threads can close a
    # connection under another thread's read (seen as EBADF under load).
    local = threading.local()
    clients: list[httpx.Client] = []
    clients_lock = threading.Lock()

    def thread_client() -> httpx.Client:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=30.0)
            with clients_lock:
                clients.append(local.client)
        return local.client

    with (
        ThreadPoolExecutor(CONCURRENCY) as pool,
        ExitStack() as stack,
    ):
        stack.callback(lambda: [c.close() for c in clients])
        controls = [
            stack.enter_context(RolloutControlClient(server.url, TOKEN)) for server in race.servers
        ]
        for round_index in range(ROUNDS):
            rollouts = [f"race-{round_index:02d}-{i:02d}" for i in range(ROLLOUTS)]
            to_retire = rollouts[1::2]
            jobs = [
                (rollout_id, n)
                for n in range(CALLS_PER_ROLLOUT)
                for rollout_id in rollouts  # every rollout is in flight early and late
            ]
            done = threading.Semaphore(0)

            def run(
                job: tuple[str, int], position: int, done: threading.Semaphore = done
            ) -> Served:
                rollout_id, n = job
                try:
                    server = race.servers[(position + n) % SERVERS]  # n-th call, n-th server
                    return call(thread_client(), server, rollout_id, position)
                finally:
                    done.release()

            futures = [pool.submit(run, job, i) for i, job in enumerate(jobs)]
            for _ in range(len(jobs) // 2):
                done.acquire()
            reply = controls[round_index % SERVERS].retire(to_retire)  # mid-round
            assert sorted(reply.removed + reply.absent) == sorted(to_retire)
            retired.update(to_retire)
            served.extend(f.result() for f in futures)
    elapsed = time.monotonic() - started
    assert elapsed < BUDGET_S, f"{elapsed:.1f} s"

    assert len(served) == ROUNDS * ROLLOUTS * CALLS_PER_ROLLOUT
    assert {s.status for s in served} == {200}
    by_rollout: dict[str, list[str]] = defaultdict(list)
    for s in served:
        by_rollout[s.rollout_id].append(s.model_call_id)
    for rollout_id, call_ids in by_rollout.items():
        path = race.lineage.ledger_path(rollout_id)
        if rollout_id in retired:
            assert not path.exists(), rollout_id
            assert race.lineage.is_retired(rollout_id)
            continue
        manifest = race.lineage.manifest(rollout_id)
        assert manifest.failures == [], rollout_id
        assert sorted(r.model_call_id for r in manifest.records) == sorted(call_ids)
        assert ledger_lines_parse(path) == len(call_ids)
    # The race is real: completions landed after their rollout was retired and were discarded.
    logs = "".join(server.log() for server in race.servers)
    assert "discarded a lineage row for retired rollout" in logs
