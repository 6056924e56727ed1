"""``make demo``: collect the example tasks for two simulated checkpoints, with capture.

For each checkpoint it starts the simulated inference worker (its own latency and token
profile) and the capture server on free loopback ports (no keys, no network), collects the
bundled multiple-choice tasks with the simple agent through the official ``openai`` SDK (a few
injected faults; the second checkpoint uses tools), writes
``<out>/<checkpoint>/{model-calls/, rollouts.jsonl}``, prints a summary per checkpoint, stops
every process, reads the captures back through the public readers and says where they are.
``--calls`` instead makes a handful of SDK calls of all three dialects and prints a per-rollout
table; ``--offline`` writes a store directly, including a damaged line.
Run: ``python -m capture_core.demo --out results/demo``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from capture_core.metrics import aggregate_model_call_records
from capture_core.records import CaptureRecords, RawCaptureLine
from capture_core.store import CaptureStore
from capture_core.testing import Answer, ToolCallSpec, capture_line, torn

__all__ = ["main", "write_demo_store"]

_CLOCK = 1786032154.0


def _calls() -> dict[str, list[RawCaptureLine]]:
    think = "Option (A) ignores friction; (B) accounts for it."
    lookup = ToolCallSpec("lookup", {"query": "coefficient of friction", "k": 2}, "call_lookup")
    plan: dict[str, list[tuple[str, Answer, bool, int]]] = {
        "0-0": [
            ("responses", Answer(reasoning=think, reasoning_tokens=12), False, 200),
            ("responses", Answer(text="", tool_calls=(lookup,), response_id="resp_124"), True, 200),
        ],
        "1-0": [
            (
                "chat",
                Answer(response_id="chatcmpl-1", cached_tokens=64, input_tokens=512),
                False,
                200,
            ),
            (
                "chat",
                Answer(response_id="chatcmpl-2", reasoning=think, reasoning_tokens=9),
                True,
                200,
            ),
        ],
        "2-0": [
            (
                "messages",
                Answer(
                    response_id="msg_1",
                    reasoning=think,
                    cached_tokens=80,
                    cache_creation_tokens=20,
                    input_tokens=300,
                ),
                True,
                200,
            ),
            ("messages", Answer(response_id="msg_2"), False, 429),
        ],
    }
    lines: dict[str, list[RawCaptureLine]] = {}
    clock = _CLOCK
    for rollout_id, calls in plan.items():
        for index, (dialect, answer, stream, status) in enumerate(calls):
            latency = 420.0 + 310.5 * index + 97.25 * len(lines)
            lines.setdefault(rollout_id, []).append(
                capture_line(
                    dialect,
                    answer,
                    stream=stream,
                    status_code=status,
                    started_at=clock,
                    latency_ms=latency,
                    ttft_ms=round(latency / 4, 2) if status == 200 else None,
                )
            )
            clock += latency / 1000 + 0.5
    return lines


def write_demo_store(root: Path) -> CaptureStore:
    """Write the demo rollouts (replacing earlier demo files) and return the store."""
    store = CaptureStore(root, create=True)
    for rollout_id, lines in _calls().items():
        store.clear(rollout_id)
        for number, line in enumerate(lines):
            store.record(rollout_id, line)
            if rollout_id == "1-0" and number == 0:
                # A writer killed mid-line leaves a torn tail; the next append closes it.
                with store.path_for(rollout_id).open("ab") as handle:
                    handle.write(torn(line, 0.4))
    return store


def _cell(value: object) -> str:
    if value is None:
        return "—"  # unknown: the provider did not report it
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def format_table(results: Sequence[CaptureRecords]) -> str:
    """A plain-text table: one row per rollout."""
    header = (
        "rollout",
        "dialects",
        "calls",
        "damaged",
        "errors",
        "tok in",
        "tok out",
        "reasoning",
        "cached",
        "latency ms",
        "ttft p50 ms",
    )
    rows = [header]
    for result in results:
        metrics = aggregate_model_call_records(result.records)
        ttfts = sorted(r.latency_ttft_ms for r in result.records if r.latency_ttft_ms is not None)
        rows.append(
            (
                result.rollout_id,
                ",".join(sorted({r.dialect or "?" for r in result.records})),
                _cell(metrics.num_calls),
                _cell(len(result.damaged)),
                _cell(sum(r.error_category is not None for r in result.records)),
                _cell(metrics.tokens_in),
                _cell(metrics.tokens_out),
                _cell(metrics.tokens_reasoning),
                _cell(metrics.cached_tokens),
                _cell(metrics.latency_total_ms),
                _cell(ttfts[(len(ttfts) - 1) // 2] if ttfts else None),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.rjust(width) if i else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _live_calls(server_url: str) -> list[str]:
    """A handful of SDK calls per dialect through the capture server; returns what happened."""
    import anthropic
    import openai

    prompt = "Which option is correct? (A) 1 (B) 2"
    tools = [
        {
            "type": "function",
            "name": "lookup",
            "description": "Look a fact up.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        }
    ]
    chat_tools = [{"type": "function", "function": {k: v for k, v in tools[0].items()
                                                     if k != "type"}}]  # fmt: skip
    notes: list[str] = []

    clients = contextlib.ExitStack()

    def oai(rollout_id: str) -> openai.OpenAI:
        return clients.enter_context(openai.OpenAI(
            base_url=f"{server_url}/ng-rollout/{rollout_id}/v1", api_key="demo", max_retries=0,
            timeout=60))  # fmt: skip

    def claude(rollout_id: str) -> anthropic.Anthropic:
        return clients.enter_context(anthropic.Anthropic(
            base_url=f"{server_url}/ng-rollout/{rollout_id}", api_key="demo", max_retries=0,
            timeout=60))  # fmt: skip

    client = oai("0-0")
    client.responses.create(model="sim-model-1", input=prompt)
    with client.responses.stream(model="sim-model-1", input=prompt,
                                 reasoning={"effort": "low"}) as stream:  # fmt: skip
        stream.get_final_response()
    client = oai("1-0")
    done = client.chat.completions.create(
        model="sim-model-1",
        tools=chat_tools,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": prompt}],
    )
    calls = done.choices[0].message.tool_calls or []
    names = [c.function.name if c.type == "function" else c.custom.name for c in calls]
    notes.append(f"1-0: chat asked for tool(s) {names}")
    chunks = client.chat.completions.create(
        model="sim-model-1", messages=[{"role": "user", "content": prompt}], stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    for _ in chunks:
        pass
    messages = claude("2-0")
    messages.messages.create(model="sim-model-2", max_tokens=256,
                             messages=[{"role": "user", "content": prompt}])  # fmt: skip
    with messages.messages.stream(
        model="sim-model-2", max_tokens=2048, messages=[{"role": "user", "content": prompt}],
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as message_stream:  # fmt: skip
        message_stream.get_final_message()
    try:
        oai("3-0").chat.completions.create(
            model="sim-model-1", messages=[{"role": "user", "content": prompt}],
            extra_headers={"x-ngcapture-fault": "429"},
        )  # fmt: skip
    except openai.RateLimitError as exc:
        notes.append(f"3-0: the injected 429 reached the client unchanged ({exc.status_code})")
    clients.close()
    return notes


def run_live(out: Path) -> CaptureStore:
    """Start worker and capture server, make the calls, stop both; return the store."""
    from capture_core.testing.processes import run_capture_server, run_worker

    store = CaptureStore(out, create=True)
    for rollout_id in ("0-0", "1-0", "2-0", "3-0"):
        store.clear(rollout_id)
    with run_worker(seed=0) as worker, run_capture_server(worker.url, out) as server:
        print(f"worker on {worker.url}, capture server on {server.url}\n")
        for note in _live_calls(server.url):
            print(note)
    print("(both processes stopped)\n")
    return store


# Two simulated checkpoints: a slower, wordier one and a faster one with tools.
CHECKPOINTS: tuple[tuple[str, int, float, float, bool], ...] = (
    # name, seed, ttft ms, ms per token, tools
    ("ckpt-100", 100, 30.0, 0.4, False),
    ("ckpt-200", 200, 12.0, 0.15, True),
)
FAULTY_TASKS = {3: "429", 11: "500"}  # task index -> injected fault (first repeat only)


def run_checkpoints(out: Path, *, tasks: int = 20, repeats: int = 2) -> list[Path]:
    """Collect the example tasks for each simulated checkpoint; returns their folders."""
    from capture_core.collect import CollectConfig, SimpleAgent, collect
    from capture_core.testing.processes import run_capture_server, run_worker

    def faults(row: Mapping[str, Any], rollout_id: str) -> dict[str, str]:
        fault = FAULTY_TASKS.get(row.get("_ng_task_index", -1))
        if fault and row.get("_ng_rollout_index") == 0:
            return {"x-ngcapture-fault": fault}
        return {}

    folders = []
    for name, seed, ttft_ms, ms_per_token, tools in CHECKPOINTS:
        folder = out / name
        capture_dir = folder / "model-calls"
        with (
            run_worker(seed=seed, ttft_ms=ttft_ms, ms_per_token=ms_per_token) as worker,
            run_capture_server(worker.url, capture_dir) as server,
        ):
            agent = SimpleAgent(server.url, tools=tools, headers=faults)
            # A rerun replaces the demo's results; the earlier ones move to a dated folder.
            config = CollectConfig(
                None, folder / "rollouts.jsonl", server.url, [capture_dir],
                limit=tasks, num_repeats=repeats, concurrency=4, tools=tools, overwrite=True,
            )  # fmt: skip
            summary = collect(config, agent=agent)
        print(f"== {name} (worker seed {seed}, ttft {ttft_ms:g} ms, {ms_per_token:g} ms/token)")
        injected = ", ".join(f"task {t}: HTTP {code}" for t, code in sorted(FAULTY_TASKS.items()))
        print(f"faults injected on purpose (first repeat only): {injected}; those rollouts fail")
        print(summary.format())
        print()
        folders.append(folder)
    return folders


def _reload_check(folders: Sequence[Path]) -> None:
    """Read every capture back through the public readers, as a user would."""
    from capture_core.metrics import read_model_call_records

    for folder in folders:
        store = CaptureStore(folder / "model-calls")
        ids = store.rollout_ids()
        calls = sum(len(read_model_call_records(store, rollout_id)) for rollout_id in ids)
        print(f"{folder.name}: {len(ids)} rollouts and {calls} calls read back from {store.root}")


def _analyse(folders: Sequence[Path]) -> list[Path]:
    """Open the checkpoints with the analysis package: print their diff, write the reports."""
    from ngcapture_viz.diff import diff
    from ngcapture_viz.report import write_report
    from ngcapture_viz.run import open_run

    runs = [
        open_run(folder / "model-calls", folder / "rollouts.jsonl", label=folder.name)
        for folder in folders
    ]
    written: list[Path] = []
    comparison = None
    if len(runs) >= 2:
        comparison = diff(runs[0], runs[1])
        print(f"\n== {runs[1].label} vs {runs[0].label}\n{comparison}\n")
        table = folders[-1].parent / f"diff-{runs[0].label}-{runs[1].label}.csv"
        comparison.frame.write_csv(table)
        written.append(table)
    for n, (folder, run) in enumerate(zip(folders, runs, strict=True)):
        last = n == len(runs) - 1
        written.append(write_report(run, folder / "report.html", diff=comparison if last else None))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("results/demo"))
    parser.add_argument("--offline", action="store_true",
                        help="write the store directly, without worker and server")  # fmt: skip
    parser.add_argument(
        "--calls", action="store_true",
        help="a handful of SDK calls per dialect instead of two checkpoints",
    )  # fmt: skip
    parser.add_argument("--tasks", type=int, default=20)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if not args.offline and not args.calls:
        folders = run_checkpoints(out, tasks=args.tasks)
        _reload_check(folders)
        reports = _analyse(folders)
        print(f"\nResults are in {out}:")
        for folder in folders:
            print(f"  {folder / 'rollouts.jsonl'}\n  {folder / 'model-calls'}")
        for report in reports:
            print(f"  {report}")
        return 0
    root = out / "model-calls"
    store = write_demo_store(root) if args.offline else run_live(root)
    results = [store.read_records(rollout_id) for rollout_id in store.rollout_ids()]
    print("Captured model calls per rollout ('—' = not reported by the provider):\n")
    print(format_table(results))
    for result in results:
        for damaged in result.damaged:
            print(f"\ndamaged: {damaged.path}:{damaged.line_number} "
                  f"(call_index {damaged.call_index}): {damaged.reason}")  # fmt: skip
    print(f"\nCapture files are in {store.root}")
    for rollout_id in store.rollout_ids():
        print(f"  {store.path_for(rollout_id).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
