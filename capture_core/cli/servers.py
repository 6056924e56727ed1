"""``ngcapture worker`` and ``ngcapture serve``: the two services, on loopback by default.

Both print the URL they listen on (``--port 0`` picks a free port) and stop cleanly on
SIGINT/SIGTERM. Every check that can fail (paths, settings, the port) runs before anything is
created, so a refused start leaves the disk untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from capture_core.cli._base import UserError, bind, listen_options, writable_dir, writable_file
from capture_core.server.settings import CaptureSettings

__all__ = ["serve", "worker"]

F = TypeVar("F", bound=Callable[..., Any])

_LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
#: Loggers that write one INFO line per request; quiet unless --access-log.
_REQUEST_LOGGERS = ("httpx", "httpx2", "httpcore", "uvicorn.access")


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


def _logging(*, access_log: bool) -> None:
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
    for name in _REQUEST_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if access_log else logging.WARNING)


WORKER_EXAMPLE = """\b
Example:
  ngcapture worker --port 8001 --seed 3
  ngcapture worker --port 0 --port-file worker.port   # any free port, written to a file

Ask for a fault per request with the header x-ngcapture-fault: 429, 500, 503, 401, timeout,
drop, truncate, inband_error, malformed or slow."""


@click.command(epilog=WORKER_EXAMPLE)
@listen_options(8001)
@click.option(
    "--seed",
    type=int,
    default=0,
    help="Answers are a pure function of the seed, the API dialect and the request body.",
)
@click.option(
    "--ttft-ms",
    type=click.FloatRange(min=0),
    default=15.0,
    help="Delay before the first byte of every response, in milliseconds.",
)
@click.option(
    "--ms-per-token",
    type=click.FloatRange(min=0),
    default=0.2,
    help="Delay per generated token, in milliseconds.",
)
@click.option(
    "--staging-dir",
    type=click.Path(path_type=Path),
    help="Training mode: stage the tokens of requests that ask for it in this "
    "directory (created if missing). Without it such requests are refused.",
)
@click.option(
    "--weight-version",
    type=click.IntRange(min=0),
    default=1,
    help="Training mode: the policy weight version stamped on staged calls.",
)
@click.option(
    "--routed-experts",
    is_flag=True,
    help="Training mode: also return and stage per-token routed experts.",
)
def worker(
    *,
    host: str,
    port: int,
    port_file: Path | None,
    seed: int,
    ttft_ms: float,
    ms_per_token: float,
    staging_dir: Path | None,
    weight_version: int,
    routed_experts: bool,
) -> int:
    """Run a simulated inference worker: OpenAI Responses, Chat Completions and Anthropic
    Messages, streaming or not, with realistic usage and latency, and no keys or network."""
    from capture_core.server.listener import run_server
    from capture_core.testing.worker import SimulatedWorker, WorkerConfig

    staging = writable_dir(staging_dir, "--staging-dir") if staging_dir else None
    port_file = writable_file(port_file, "--port-file") if port_file else None
    sock = bind(host, port)
    _logging(access_log=False)
    logging.getLogger("uvicorn.error").addFilter(_QuietSimulatedDrops())
    config = WorkerConfig(
        seed=seed,
        ttft_ms=ttft_ms,
        ms_per_token=ms_per_token,
        staging_dir=str(staging) if staging else None,
        weight_version=weight_version,
        routed_experts=routed_experts,
    )
    return run_server(SimulatedWorker(config), sock, name="worker", port_file=port_file)


def _setting(flag: str, field: str, help: str | None = None, **extra: Any) -> Callable[[F], F]:
    """An option for one ``CaptureSettings`` field: its default, description and variable."""
    info = CaptureSettings.model_fields[field]
    text = help or info.description or ""
    if not text.endswith("."):
        text += "."
    return click.option(
        flag,
        field,
        default=info.default,
        help=text[0].upper() + text[1:],
        envvar=f"NGCAPTURE_{field.upper()}",
        show_envvar=True,
        **extra,
    )


SERVE_EXAMPLE = """\b
Example:
  ngcapture worker --port 8001 &
  ngcapture serve --upstream http://127.0.0.1:8001 --capture-dir "$PWD/results/model-calls"

Then point an SDK at http://127.0.0.1:8000/ng-rollout/<rollout_id>/v1: the server strips the
prefix, forwards the call unchanged and appends one line per call to
<capture-dir>/<rollout_id>.capture.jsonl. GET /ngcapture/health names the capture directory;
GET /ngcapture/metrics counts calls, bytes and failures."""


@click.command(epilog=SERVE_EXAMPLE)
@listen_options(8000)
@click.option(
    "--upstream",
    required=True,
    metavar="URL",
    help="Base URL of the inference worker: http(s)://host[:port][/path].",
)
@click.option(
    "--capture-dir",
    type=click.Path(path_type=Path),
    help="Capture directory (created if missing; a relative path resolves against the "
    "working directory). Omit it to forward without capturing.",
)
@_setting("--model-server-name", "model_server_name", "Name recorded in each call's model_ref.")
@click.option(
    "--lineage-dir",
    type=click.Path(path_type=Path),
    help="Training capture: keep per-rollout ledgers here (needs the control token "
    "in NGCAPTURE_CONTROL_TOKEN).",
)
@_setting(
    "--connect-timeout-s", "connect_timeout_s", "Seconds to connect to the upstream.", type=float
)
@_setting(
    "--read-timeout-s",
    "read_timeout_s",
    "Seconds to wait for the upstream's next bytes (a slow model needs more).",
    type=float,
)
@_setting("--max-request-body-bytes", "max_request_body_bytes", type=int)
@_setting("--max-header-bytes", "max_header_bytes", type=int)
@_setting("--header-timeout-s", "header_timeout_s", type=float)
@_setting("--idle-timeout-s", "idle_timeout_s", type=float)
@_setting("--max-client-connections", "max_client_connections", type=int)
@_setting(
    "--access-log/--no-access-log",
    "access_log",
    "Log one line per request (off: the per-minute summary only).",
)
@_setting("--summary-interval-s", "summary_interval_s", type=float)
@_setting("--journal-segment-bytes", "journal_segment_bytes", type=int)
@_setting(
    "--token-id-capture-config",
    "token_id_capture_config",
    "Token-id capture: a JSON file holding the token_id_capture block (needs --lineage-dir); "
    "see docs/token-store.md",
    type=click.Path(path_type=Path, dir_okay=False),
    metavar="FILE",
)
def serve(
    *,
    host: str,
    port: int,
    port_file: Path | None,
    upstream: str,
    capture_dir: Path | None,
    lineage_dir: Path | None,
    access_log: bool,
    **limits: Any,
) -> int:
    """Run the capture model server: forward every call to the upstream worker unchanged and
    record it, one fsynced JSON line per call, in the capture directory."""
    from capture_core.server.control import load_control_token
    from capture_core.server.listener import serve_capture

    directory = writable_dir(capture_dir, "--capture-dir") if capture_dir else None
    lineage = writable_dir(lineage_dir, "--lineage-dir") if lineage_dir else None
    port_file = writable_file(port_file, "--port-file") if port_file else None
    settings = _settings(
        observability_enabled=directory is not None,
        model_call_capture_dir=directory,
        upstream_url=upstream,
        lineage_dir=lineage,
        access_log=access_log,
        **limits,
    )
    if lineage is not None:
        load_control_token(settings)  # refuse now, not after the port is taken
    sock = bind(host, port)
    _logging(access_log=access_log)
    if directory is not None:
        print(f"capturing model calls into {directory}", flush=True)
    else:
        print("capture is off (no --capture-dir): calls are forwarded, not recorded", flush=True)
    return serve_capture(settings, sock, port_file=port_file)


#: Settings field -> the option that sets it, for error messages.
_FLAGS = {"upstream_url": "--upstream", "model_call_capture_dir": "--capture-dir"}


def _settings(**values: Any) -> CaptureSettings:
    """The server's settings, or a one-line :class:`UserError` naming the option at fault."""
    try:
        return CaptureSettings(**values)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        flag = _FLAGS.get(field, "--" + field.replace("_", "-"))
        message = str(first["msg"]).removeprefix("Value error, ")
        if field and field not in _FLAGS:
            message = f"{message}, got {first.get('input')!r}"
        raise UserError(f"{flag}: {message}" if field else message) from None
