"""What writing ``ngcapture_facts`` and the facts journal costs the server per call (issue 19).

``Exchange.line()`` builds a call's capture line from its bytes; since issue 19 it also computes
the call's facts, from the response facts it already reads to classify the call. Measured in
one process over realistic exchanges (``CaptureLineFactory``: three dialects, streams, tool
calls, errors): the time of ``line()`` plus encoding the line, with the facts hook on and off
(interleaved rounds, best round of each), and the facts computation alone.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

import capture_core.server.exchange as exchange_module
from capture_core._appending import Appended
from capture_core.dialects import extract_response
from capture_core.facts import call_facts
from capture_core.facts_journal import FactsJournal
from capture_core.server.exchange import Exchange
from capture_core.testing import CaptureLineFactory

_ROUNDS = 7


def _exchanges(n: int) -> list[Exchange]:
    out = []
    for line in CaptureLineFactory(seed=5).lines(n):
        data = line.to_json_dict()
        streaming = data.get("response_raw") is not None
        body = (
            data["response_raw"].encode()
            if streaming
            else orjson.dumps(data["response"])
            if data["response"] is not None
            else b""
        )
        out.append(
            Exchange(
                data["model_call_id"],
                data["dialect"],
                data["model_ref"],
                data["started_at"],
                [orjson.dumps(data["request"])],
                [body],
                status_code=data["status_code"],
                streaming=streaming,
                completed_at=data["completed_at"],
                latency_ms=data["latency_ms"],
                ttft_ms=data["latency_ttft_ms"],
            )
        )
    return out


def _time_lines(exchanges: list[Exchange]) -> float:
    start = time.perf_counter()
    for exchange in exchanges:
        orjson.dumps(exchange.line())
    return (time.perf_counter() - start) / len(exchanges)


def _time_journal(exchanges: list[Exchange]) -> float:
    """Best round of ``FactsJournal.note`` per call (a real file; the append's result made up:
    the entry's size does not depend on it)."""
    lines = [exchange.line() for exchange in exchanges]
    best = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        journal = FactsJournal(Path(tmp), "bench")
        at = Appended(5000, False, 123_456, 128_456, time.time_ns(), 4_242_424)
        try:
            for _ in range(_ROUNDS):
                start = time.perf_counter()
                for line in lines:
                    journal.note("3-1.capture.jsonl", at, line)
                best = min(best, (time.perf_counter() - start) / len(lines))
        finally:
            journal.close()
    return best


def run(*, quick: bool = False) -> list[dict[str, Any]]:
    n = 300 if quick else 2000
    exchanges = _exchanges(n)
    real = exchange_module.line_facts
    on: list[float] = []
    off: list[float] = []
    for _ in range(_ROUNDS):
        exchange_module.line_facts = real  # type: ignore[attr-defined]
        on.append(_time_lines(exchanges))
        exchange_module.line_facts = lambda *args, **kwargs: None  # type: ignore[attr-defined]
        off.append(_time_lines(exchanges))
    exchange_module.line_facts = real  # type: ignore[attr-defined]
    bodies = [orjson.loads(orjson.dumps(e.line())) for e in exchanges]
    alone: list[float] = []
    for _ in range(_ROUNDS):
        start = time.perf_counter()
        for line in bodies:
            call_facts(line["dialect"], line["request"], line["response"])
        alone.append((time.perf_counter() - start) / n)
    found = [extract_response(line["dialect"], line["response"]) for line in bodies]
    shared: list[float] = []
    for _ in range(_ROUNDS):
        start = time.perf_counter()
        for line, facts in zip(bodies, found, strict=True):
            call_facts(line["dialect"], line["request"], line["response"], found=facts)
        shared.append((time.perf_counter() - start) / n)
    journal = _time_journal(exchanges)
    best_on, best_off = min(on), min(off)
    rows = []
    for variant, seconds, detail in (
        ("line() + encode, facts off", best_off, "the line as before issue 19"),
        (
            "line() + encode, facts on",
            best_on,
            f"adds {(best_on - best_off) * 1e6:.1f} µs per call "
            f"(median of rounds: {(statistics.median(on) - statistics.median(off)) * 1e6:.1f} µs)",
        ),
        (
            "call_facts alone (reads the response again)",
            min(alone),
            "what the hook would cost without sharing the read",
        ),
        (
            "call_facts from the facts already read",
            min(shared),
            "the work the hook adds to line(): facts built from the response facts it reads anyway",
        ),
        (
            "facts journal entry: encode + write",
            journal,
            "what FactsJournal.note adds per call after the line's fsync (one write, O_APPEND)",
        ),
    ):
        rows.append(
            {
                "benchmark": f"capture facts, {n} calls",
                "variant": variant,
                "n": n,
                "median_s": seconds,
                "per_s": 1 / seconds,
                "unit": "calls/s",
                "ratio_vs_floor": seconds / best_off,
                "detail": detail,
            }
        )
    return rows
