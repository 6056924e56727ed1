"""What capture costs a client: direct to the worker vs the proxy without and with capture.

The simulated worker answers with no artificial delay (``ttft_ms=0``, ``ms_per_token=0``), so
what is measured is the proxy and capture work. Each variant is run non-streaming and
streaming (chat completions), at concurrency 1 and 64; each concurrent client is its own
rollout, as in RL collection. Latency is time to the full body.
Goal (issue 4): capture adds ≤ 1 ms at p50 and ≤ 5 ms at p99 over the uncaptured proxy at
concurrency 1, and keeps ≥ 80% of its throughput at concurrency 64.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from capture_core.testing import request_body
from capture_core.testing.processes import run_capture_server, run_worker

JSON = {"content-type": "application/json"}


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _load(
    url: str, body: bytes, *, requests: int, concurrency: int
) -> tuple[list[float], float, int]:
    """``concurrency`` clients, each its own rollout (``{url}`` has a ``{rollout}`` slot)."""
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    transport = httpx.AsyncHTTPTransport(
        limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    )
    async with httpx.AsyncClient(timeout=60, transport=transport) as client:
        queue = iter(range(requests))

        async def worker(index: int) -> None:
            target = url.format(rollout=f"bench-{index}")
            nonlocal errors
            for _ in queue:
                start = time.perf_counter()
                try:
                    response = await client.post(target, content=body, headers=JSON)
                    await response.aread()
                except httpx.TransportError:
                    errors += 1  # reported beside the numbers, never hidden
                    continue
                latencies.append(time.perf_counter() - start)
                if response.status_code != 200:
                    errors += 1

        for _ in range(min(20, requests)):  # warm the connection pool
            await client.post(url.format(rollout="warm-0"), content=body, headers=JSON)
        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    return latencies, elapsed, errors


def run(*, quick: bool = False) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    plan = [(1, 100 if quick else 400), (64, 400 if quick else 2000)]
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_worker(seed=1, ttft_ms=0, ms_per_token=0) as worker,
        run_capture_server(worker.url, None) as off,
        run_capture_server(worker.url, Path(tmp) / "calls") as on,
    ):
        targets = {
            "direct to worker": worker.url + "/v1/chat/completions",
            "proxy, capture off": off.url + "/ng-rollout/{rollout}/v1/chat/completions",
            "proxy, capture on": on.url + "/ng-rollout/{rollout}/v1/chat/completions",
        }
        for stream in (False, True):
            body = orjson.dumps(request_body("chat", stream=stream))
            for concurrency, requests in plan:
                label = f"chat {'stream' if stream else 'json'}, c={concurrency}"
                measured = {
                    name: asyncio.run(_load(url, body, requests=requests, concurrency=concurrency))
                    for name, url in targets.items()
                }
                rows += _rows(label, requests, measured)
    return rows


def _rows(
    label: str, requests: int, measured: dict[str, tuple[list[float], float, int]]
) -> list[dict[str, Any]]:
    base_p50 = statistics.median(measured["proxy, capture off"][0])
    base_throughput = requests / measured["proxy, capture off"][1]
    rows = []
    for name, (latencies, elapsed, errors) in measured.items():
        p50, p99 = statistics.median(latencies), _quantile(latencies, 0.99)
        throughput = requests / elapsed
        rows.append({
            "benchmark": label,
            "variant": name,
            "n": requests,
            "median_s": p50,
            "per_s": throughput,
            "unit": "req/s",
            "ratio_vs_floor": p50 / base_p50,
            "detail": (f"p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
                       f"Δp50 vs capture off {(p50 - base_p50) * 1000:+.2f} ms, "
                       f"throughput {throughput / base_throughput:.0%} of capture off"
                       + (f", {errors} failed requests" if errors else "")),
        })  # fmt: skip
    return rows
