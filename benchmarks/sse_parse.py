"""SSE parser throughput on a ~10 MB chat-completions stream, fed whole and in 1 KiB chunks.

Run with ``python benchmarks/sse_parse.py``; prints MB/s (best of a few rounds) for each mode.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from capture_core.sse import SSEParser, parse_sse
except ModuleNotFoundError:  # run as a script from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from capture_core.sse import SSEParser, parse_sse

TARGET_BYTES = 10 * 1024 * 1024
CHUNK = 1024
ROUNDS = 5
WORDS = ("the", "model", "streams", "tokens,", "one", "déjà", "vu", "🙂", "at", "a", "time.")


def chat_completions_body(target: int = TARGET_BYTES) -> bytes:
    """A realistic data-only chat-completions stream of about ``target`` bytes."""
    head = (
        'data: {"id":"chatcmpl-9f2c1a7b","object":"chat.completion.chunk","created":1718000000,'
        '"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":'
        '[{"index":0,"delta":{"content":"'
    )
    tail = '"},"logprobs":null,"finish_reason":null}]}\n\n'
    parts = [
        'data: {"id":"chatcmpl-9f2c1a7b","object":"chat.completion.chunk","choices":'
        '[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    ]
    size, i = 0, 0
    while size < target:
        event = f"{head} {WORDS[i % len(WORDS)]}{tail}"
        parts.append(event)
        size += len(event.encode())
        i += 1
    usage = f'{{"prompt_tokens":31,"completion_tokens":{i},"total_tokens":{i + 31}}}'
    parts.append(
        'data: {"id":"chatcmpl-9f2c1a7b","object":"chat.completion.chunk","choices":[],'
        f'"usage":{usage}}}\n\ndata: [DONE]\n\n'
    )
    return "".join(parts).encode()


def _best_seconds(run: Callable[[], int], expected: int) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        count = run()
        best = min(best, time.perf_counter() - start)
        if count != expected:
            raise SystemExit(f"parsed {count} events, expected {expected}")
    return best


_BLOCKS = re.compile(rb"\r?\n\r?\n")


def regex_blocks(body: bytes) -> int:
    """The usual ad-hoc approach: split on blank lines, keep ``data:`` lines (LF/CRLF only)."""
    count = 0
    for block in _BLOCKS.split(body.decode("utf-8", "replace").encode()):
        lines = [line for line in block.splitlines() if line.startswith(b"data:")]
        if lines:
            count += 1
    return count


def run(*, quick: bool = False) -> list[dict[str, Any]]:
    """Rows for the benchmark table: MB/s of each way of parsing the same stream."""
    body = chat_completions_body(TARGET_BYTES // 5 if quick else TARGET_BYTES)
    chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]
    expected = len(parse_sse(body))

    def whole() -> int:
        return len(parse_sse(body))

    def chunked() -> int:
        parser = SSEParser()
        count = 0
        for chunk in chunks:
            count += len(parser.feed(chunk))
        return count + len(parser.close())

    mb = len(body) / 1e6
    timings = {
        "SSEParser, 1 KiB chunks": _best_seconds(chunked, expected),
        "parse_sse, whole body": _best_seconds(whole, expected),
        "regex blank-line split (no CR, no comments)": _best_seconds(
            lambda: regex_blocks(body), expected
        ),
    }
    floor = timings["regex blank-line split (no CR, no comments)"]
    return [
        {
            "benchmark": f"sse parse {mb:.1f} MB chat stream",
            "variant": name,
            "n": expected,
            "median_s": seconds,
            "per_s": mb / seconds,
            "unit": "MB/s (best of 5)",
            "ratio_vs_floor": seconds / floor,
        }
        for name, seconds in timings.items()
    ]


def main() -> None:
    for row in run():
        print(f"{row['variant']:>45}: {row['per_s']:7.1f} MB/s ({row['median_s'] * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
