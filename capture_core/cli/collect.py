"""``ngcapture collect``: run rollouts through a capture server and attach their capture."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from capture_core.cli._base import UserError, existing_dir, writable_file

__all__ = ["collect"]

COLLECT_EXAMPLE = """\b
Example (a capture server on 127.0.0.1:8000, see `ngcapture serve --help`):
  ngcapture collect --model-url http://127.0.0.1:8000 \\
      --capture-dir "$PWD/results/model-calls" --output results/rollouts.jsonl --limit 5
  ngcapture collect ... --resume      # after a crash: run only what is missing

Every output line is a task row plus the agent's answer, its reward and the rollout's
ng_model_call_capture (metrics, calls, gaps) and ng_trajectory. Each run gets a run id that
prefixes its rollout ids (<run-id>.<task>-<rollout>), so runs sharing a capture directory never
share a file. Existing data is never replaced: --resume continues a run, --overwrite moves the
earlier output and capture to a dated overwritten-<time>/ folder beside them (printed)."""


@click.command(epilog=COLLECT_EXAMPLE)
@click.option(
    "--input",
    "input_path",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="Task JSONL, one task per line.  [default: the bundled MCQA examples]",
)
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    metavar="FILE",
    help="Rollout JSONL to write; failed rollouts go to <stem>_failures.jsonl beside it.",
)
@click.option(
    "--model-url",
    required=True,
    metavar="URL",
    help="Root URL of the capture server (ngcapture serve), e.g. http://127.0.0.1:8000.",
)
@click.option(
    "--capture-dir",
    "capture_dirs",
    type=click.Path(path_type=Path),
    multiple=True,
    metavar="DIR",
    help="The server's capture directory, to read each rollout's "
    "capture from (repeatable). Omit it to collect without the capture "
    "attachment.",
)
@click.option(
    "--limit", type=click.IntRange(min=0), help="Use only the first N tasks.  [default: all]"
)
@click.option("--num-repeats", type=click.IntRange(min=1), default=1, help="Rollouts per task.")
@click.option("--concurrency", type=click.IntRange(min=1), default=4, help="Rollouts run at once.")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run recorded in --output: run only "
    "the rollouts it lacks, retrying failed ones under -a<n> ids.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Start afresh: move an existing --output and "
    "the capture of the rollouts about to run to a dated folder first.",
)
@click.option(
    "--run-id",
    metavar="ID",
    help="Prefix of this run's rollout ids (letters, "
    "digits, '.', '_', '-').  [default: the UTC start time and 4 random hex "
    "digits; on --resume, the id --output records]",
)
@click.option(
    "--no-run-id",
    is_flag=True,
    help="Bare <task>-<rollout> rollout ids (give each run its own capture directory then).",
)
@click.option(
    "--tools", is_flag=True, help="Offer the agent its built-in tools (calculator, lookup)."
)
@click.option(
    "--dialect",
    type=click.Choice(["responses", "chat", "messages"]),
    default="responses",
    help="API the agent calls: OpenAI Responses, Chat Completions or Anthropic Messages. "
    "responses_create_params are translated for chat and messages (max_tokens 4096 unless "
    "max_output_tokens is set); a row with no equivalent fails, the reason in the failures "
    "file.",
)
@click.option("--model", default="sim-model-1", help="Model name the agent sends.")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=3,
    help="A rollout that failed this many times is not run again by --resume.",
)
@click.option(
    "--max-turns", type=click.IntRange(min=1), default=4, help="Model calls per rollout, at most."
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    help="The agent's timeout per model request, in seconds.",
)
@click.option(
    "--drain-timeout-s",
    type=click.FloatRange(min=0),
    default=10.0,
    help="Wait this long for capture writes still in flight.",
)
@click.option(
    "--token-id-capture-config",
    "token_config",
    type=click.Path(path_type=Path, dir_okay=False),
    metavar="FILE",
    help="Token-id capture: the JSON file with the token_id_capture block the server was "
    "started with. Rollouts call the training-capture route; each one's response.output is "
    "rebuilt with token ids (or marked mask_sample) and its token capture retired.",
)
def collect(
    *,
    input_path: Path | None,
    output: Path,
    model_url: str,
    capture_dirs: tuple[Path, ...],
    run_id: str | None,
    no_run_id: bool,
    token_config: Path | None,
    **options: Any,
) -> int:
    """Run rollouts of a task file through a capture server; write one line per rollout with
    its capture attached."""
    from capture_core.collect import CollectConfig, collect
    from capture_core.collect.preflight import new_run_id
    from capture_core.server.settings import validate_upstream_url
    from capture_core.tokens import load_token_capture_config

    try:
        validate_upstream_url(model_url)
    except ValueError as exc:
        raise UserError("--model-url: " + str(exc).replace("upstream URL", "URL")) from None
    if run_id is not None and no_run_id:
        raise UserError("--run-id and --no-run-id exclude each other: choose one")
    if options["resume"] and options["overwrite"]:
        raise UserError("--resume and --overwrite exclude each other: choose one")
    tasks = input_path.expanduser().resolve() if input_path is not None else None
    if tasks is not None and not tasks.is_file():
        what = "is a directory" if tasks.is_dir() else "does not exist"
        raise UserError(f"--input {tasks} {what}")
    output = writable_file(output, "--output")
    hint = ": the capture server creates it when started with it (ngcapture serve --capture-dir)"
    dirs = [existing_dir(path, "--capture-dir", hint=hint) for path in capture_dirs]
    token_capture = None
    if token_config is not None:
        token_capture = load_token_capture_config(
            token_config, model_call_capture_dir=dirs[0] if dirs else None
        )
    if run_id is None and not no_run_id and not (options["resume"] and output.exists()):
        run_id = new_run_id()
    for noisy in ("httpx", "httpx2", "httpcore", "openai"):  # else an INFO line per call
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = CollectConfig(
        tasks, output, model_url, dirs, run_id=run_id, token_capture=token_capture, **options
    )
    summary = collect(config)
    print(summary.format(), flush=True)
    # Failed rollouts are recorded (and retried by --resume); only a run where none worked fails.
    return 1 if summary.dispatched and not summary.ok else 0
