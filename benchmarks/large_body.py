"""Does capturing one huge call stall the others? Small calls' latency while a 50 MiB body passes.

A client keeps 4 small non-streamed chat calls in flight through the capture server (capture
on) the whole time; in the middle window it also sends one call with a 50 MiB body (a long
base64 image, as multimodal agents send). Reported: p50/p99/max of the small calls in the quiet
windows and in the window of the big call, and the big call's own latency. Goal (issue 14):
serialising and fsyncing the big line does not stall the small calls: their p99 in the big
call's window with capture on stays close to the same window with capture off (× reference).
"""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from capture_core.testing import request_body
from capture_core.testing.processes import run_capture_server, run_worker

BIG_MIB = 50
SMALL = orjson.dumps(request_body("chat"))
HEADERS = {"content-type": "application/json"}


def big_body(mib: int) -> bytes:
    """An Anthropic Messages call with one huge image (the big call goes to its own worker)."""
    image = base64.b64encode(os.urandom(mib * 1024 * 1024 * 3 // 4)).decode()
    body = request_body("messages")
    body["messages"][0]["content"] = [
        {"type": "text", "text": "What is in this image?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image}},
    ]
    return orjson.dumps(body)


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _measure(url: str, big: bytes, *, window_s: float) -> dict[str, Any]:
    samples: list[tuple[float, float]] = []  # (start, latency)
    stop = time.perf_counter() + 3 * window_s
    async with aiohttp.ClientSession() as session:

        async def small(index: int) -> None:
            target = url.format(rollout=f"small-{index}")
            while time.perf_counter() < stop:
                started = time.perf_counter()
                async with session.post(target, data=SMALL, headers=HEADERS) as response:
                    await response.read()
                    assert response.status == 200
                samples.append((started, time.perf_counter() - started))

        async def one_big() -> tuple[float, float]:
            await asyncio.sleep(window_s)
            started = time.perf_counter()
            target = url.format(rollout="big").replace("/chat/completions", "/messages")
            async with session.post(target, data=big, headers=HEADERS) as r:
                await r.read()
                assert r.status == 200, r.status
            return started, time.perf_counter() - started

        results = await asyncio.gather(*(small(i) for i in range(4)), one_big())
    big_start, big_latency = results[-1]
    during = [lat for start, lat in samples if big_start <= start <= big_start + big_latency]
    quiet = [
        lat
        for start, lat in samples
        if not big_start - 0.2 <= start <= big_start + big_latency + 0.2
    ]
    return {"quiet": quiet, "during": during, "big_s": big_latency}


def run(*, quick: bool = False) -> list[dict[str, Any]]:
    mib = 10 if quick else BIG_MIB
    big = big_body(mib)
    window_s = 2.0 if quick else 4.0
    measured: dict[str, dict[str, Any]] = {}
    # The big call goes to a worker of its own (the messages upstream), so the small calls
    # share the capture server with it, not their worker. The same scenario with capture off
    # shows what the proxy alone (and the machine) costs; the difference is capture's.
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_worker(seed=1, ttft_ms=0, ms_per_token=0) as worker,
        run_worker(seed=1, ttft_ms=0, ms_per_token=0) as big_worker,
    ):
        env = {"NGCAPTURE_UPSTREAM_MESSAGES_URL": big_worker.url}
        for name, directory in (("capture off", None), ("capture on", Path(tmp) / "calls")):
            with run_capture_server(worker.url, directory, env=env) as server:
                url = server.url + "/ng-rollout/{rollout}/v1/chat/completions"
                measured[name] = asyncio.run(_measure(url, big, window_s=window_s))
        line = (Path(tmp) / "calls" / "big.capture.jsonl").stat().st_size
    reference = _quantile(measured["capture off"]["during"], 0.99)
    rows = []
    for name, result in measured.items():
        note = f", its line {line / 2**20:.1f} MiB" if name == "capture on" else ""
        for window in ("quiet", "during"):
            latencies = result[window]
            p50, p99 = statistics.median(latencies), _quantile(latencies, 0.99)
            rows.append({
                "benchmark": f"small calls while a {mib} MiB call passes",
                "variant": f"{name}, {window}",
                "n": len(latencies),
                "median_s": p50,
                "per_s": 4 / p50,
                "unit": "req/s",
                "ratio_vs_floor": p99 / reference,
                "detail": (f"p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, max "
                           f"{max(latencies) * 1000:.1f} ms; the big call took "
                           f"{result['big_s'] * 1000:.0f} ms"
                           + note),
            })  # fmt: skip
    return rows
