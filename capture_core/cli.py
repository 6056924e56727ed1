"""The ``ngcapture`` command.

``ngcapture worker`` runs the simulated inference worker; ``ngcapture serve`` runs the capture
model server in front of an upstream worker. Both listen on loopback by default, print the URL
they listen on (``--port 0`` picks a free port) and stop cleanly on SIGINT/SIGTERM.
``ngcapture collect`` runs rollouts of a task file through a capture server and writes one
record per rollout with its ``ng_model_call_capture`` attachment. The analysis commands
(``index``, ``report``, ``diff``, ``export-wandb``) are handed to ``ngcapture_viz.cli``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ANALYSIS_COMMANDS", "main"]

logger = logging.getLogger("ngcapture")


def _run(
    app: Any, *, name: str, host: str, port: int, port_file: Path | None, proxy: bool = False
) -> int:
    from capture_core.server.listener import bind_socket, run_server

    return run_server(app, bind_socket(host, port), name=name, port_file=port_file, proxy=proxy)


class _QuietSimulatedDrops(logging.Filter):
    """An injected connection drop is intended: log one line, not a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from capture_core.testing import SimulatedDrop

        if record.exc_info and isinstance(record.exc_info[1], SimulatedDrop):
            record.msg, record.args, record.exc_info = (
                "simulated drop: %s",
                (record.exc_info[1],),
                None,
            )
        return True


def _worker(args: argparse.Namespace) -> int:
    from capture_core.testing.worker import SimulatedWorker, WorkerConfig

    logging.getLogger("uvicorn.error").addFilter(_QuietSimulatedDrops())
    staging = str(args.staging_dir.resolve()) if args.staging_dir else None
    config = WorkerConfig(seed=args.seed, ttft_ms=args.ttft_ms, ms_per_token=args.ms_per_token,
                          staging_dir=staging, weight_version=args.weight_version,
                          routed_experts=args.routed_experts)  # fmt: skip
    return _run(SimulatedWorker(config), name="worker", host=args.host, port=args.port,
                port_file=args.port_file)  # fmt: skip


def _serve(args: argparse.Namespace) -> int:
    from capture_core.server import CaptureSettings

    directory = args.capture_dir.resolve() if args.capture_dir else None
    settings = CaptureSettings(
        observability_enabled=directory is not None,
        model_call_capture_dir=directory,
        upstream_url=args.upstream,
        model_server_name=args.model_server_name,
        lineage_dir=args.lineage_dir.resolve() if args.lineage_dir else None,
    )
    if directory is not None:
        print(f"capturing model calls into {directory}", flush=True)
    from capture_core.server.listener import bind_socket, serve_capture

    return serve_capture(settings, bind_socket(args.host, args.port), port_file=args.port_file)


def _collect(args: argparse.Namespace) -> int:
    from capture_core.collect import CollectConfig, CollectError, collect
    from capture_core.exceptions import CaptureStoreError

    config = CollectConfig(
        args.input,
        args.output,
        args.model_url,
        [path.resolve() for path in args.capture_dir],
        limit=args.limit,
        num_repeats=args.num_repeats,
        concurrency=args.concurrency,
        resume=args.resume,
        drain_timeout_s=args.drain_timeout_s,
        tools=args.tools,
        dialect=args.dialect,
        model=args.model,
        max_attempts=args.max_attempts,
    )
    for noisy in ("httpx", "httpx2", "openai"):  # one INFO line per model call otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        summary = collect(config)
    except (CollectError, CaptureStoreError) as exc:
        print(f"ngcapture collect: {exc}", file=sys.stderr)
        return 2
    print(summary.format(), flush=True)
    # Failed rollouts are recorded (and retried by --resume); only a run where none worked fails.
    return 1 if summary.dispatched and not summary.ok else 0


#: Commands handed to ``ngcapture_viz.cli`` (which reads this set too).
ANALYSIS_COMMANDS = frozenset({"index", "report", "diff", "export-wandb"})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ngcapture",
        description=__doc__.splitlines()[0],
        epilog="Analysis commands (see `ngcapture <command> --help`): index, report, diff, "
        "export-wandb.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def listen(command: argparse.ArgumentParser, default_port: int) -> None:
        command.add_argument("--host", default="127.0.0.1")
        command.add_argument("--port", type=int, default=default_port, help="0 = any free port")
        command.add_argument("--port-file", type=Path, help="write the bound port here")

    worker = sub.add_parser("worker", help="run the simulated inference worker")
    listen(worker, 8001)
    worker.add_argument("--seed", type=int, default=0)
    worker.add_argument("--ttft-ms", type=float, default=15.0)
    worker.add_argument("--ms-per-token", type=float, default=0.2)
    worker.add_argument("--staging-dir", type=Path, help="training mode: stage tokens here")
    worker.add_argument("--weight-version", type=int, default=1)
    worker.add_argument("--routed-experts", action="store_true",
                        help="training mode: also return and stage routed experts")  # fmt: skip
    worker.set_defaults(handler=_worker)

    serve = sub.add_parser("serve", help="run the capture model server")
    listen(serve, 8000)
    serve.add_argument("--upstream", required=True, help="base URL of the inference worker")
    serve.add_argument("--capture-dir", type=Path, help="capture directory (omit: no capture)")
    serve.add_argument("--model-server-name", default="policy_model")
    serve.add_argument(
        "--lineage-dir",
        type=Path,
        help="training capture: rollout ledgers here (needs the control token)",
    )
    serve.set_defaults(handler=_serve)

    collect = sub.add_parser("collect", help="collect rollouts through a capture server")
    collect.add_argument("--input", type=Path, help="task JSONL (default: bundled MCQA examples)")
    collect.add_argument("--output", type=Path, required=True, help="rollout JSONL to write")
    collect.add_argument("--model-url", required=True, help="root URL of the capture server")
    collect.add_argument("--capture-dir", type=Path, action="append", default=[],
                         help="capture directory to clear and read (repeatable; omit: no "
                              "capture attachment)")  # fmt: skip
    collect.add_argument("--limit", type=int, help="use only the first N tasks")
    collect.add_argument("--num-repeats", type=int, default=1, help="rollouts per task")
    collect.add_argument("--concurrency", type=int, default=4, help="rollouts run at once")
    collect.add_argument("--resume", action="store_true", help="run only what is missing")
    collect.add_argument("--tools", action="store_true", help="offer the built-in tools")
    collect.add_argument("--dialect", choices=("responses", "chat"), default="responses")
    collect.add_argument("--model", default="sim-model-1")
    collect.add_argument("--max-attempts", type=int, default=3)
    collect.add_argument("--drain-timeout-s", type=float, default=10.0,
                         help="wait this long for capture writes still in flight")  # fmt: skip
    collect.set_defaults(handler=_collect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ngcapture`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ANALYSIS_COMMANDS:
        # The analysis commands live with the analysis package (Polars, Plotly...).
        from ngcapture_viz.cli import main as analysis_main

        return analysis_main(argv)
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
