"""The ``ngcapture`` command.

Every subcommand is registered by name in :data:`COMMANDS` as ``"module:attribute"`` with its
one-line summary, and its module is imported only when the command runs (or shows its help):
``ngcapture --help`` imports neither the server nor the analysis side, and the analysis
commands, which live in ``ngcapture_viz.cli``, are reached by name, so ``capture_core`` never
imports ``ngcapture_viz``. Adding a command is one entry here and a Click command in its
module.

Exit status: 0 success; 1 the command ran and reports failure (no rollout worked, a regression
gate failed); 2 a user's mistake, printed as one line on stderr; 70 a bug in ngcapture, printed
as its traceback and a line that says so; 130 interrupted.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, Final

import click

from capture_core import __version__
from capture_core.cli._base import CONTEXT_SETTINGS, EXIT_BUG, EXIT_USAGE, UserError, one_line
from capture_core.exceptions import CaptureError

__all__ = ["COMMANDS", "EXIT_BUG", "EXIT_USAGE", "UserError", "cli", "main"]

#: name -> (``module:attribute`` of the Click command, one-line summary for ``ngcapture --help``)
COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "worker": (
        "capture_core.cli.servers:worker",
        "Run a simulated inference worker (no keys, no network).",
    ),
    "serve": (
        "capture_core.cli.servers:serve",
        "Run the capture server in front of an inference worker.",
    ),
    "collect": (
        "capture_core.cli.collect:collect",
        "Run rollouts through a capture server; attach their capture.",
    ),
    "sweep": (
        "capture_core.cli.sweep:sweep",
        "Clear pending marks of dead servers; name the calls they lost.",
    ),
    "index": (
        "ngcapture_viz.cli:index",
        "Build or refresh the sidecar index of a capture directory.",
    ),
    "compact": (
        "ngcapture_viz.cli_compact:compact",
        "Compact facts journals into columns for a faster first open.",
    ),
    "report": (
        "ngcapture_viz.cli:report",
        "Write the self-contained HTML report of a run.",
    ),
    "diff": (
        "ngcapture_viz.cli:diff",
        "Compare two runs with bootstrap intervals; gate regressions.",
    ),
    "export-wandb": (
        "ngcapture_viz.cli:export_wandb",
        "Log payload-free tables of a run to Weights & Biases.",
    ),
    "watch": (
        "ngcapture_viz.cli_watch:watch",
        "Follow a training run; log its new calls and rollouts to W&B.",
    ),
}


class _Commands(click.Group):
    """A group whose commands are imported by name, only when one is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, _, attribute = COMMANDS[cmd_name][0].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{COMMANDS[cmd_name][0]} is not a Click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The summaries come from the table: listing them imports no command module.
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, summary) in COMMANDS.items()])


@click.group(
    cls=_Commands,
    context_settings=CONTEXT_SETTINGS,
    epilog="Run `ngcapture COMMAND --help` for a command's options and an example.",
)
@click.version_option(__version__, "-V", "--version", prog_name="ngcapture",
                      message="%(prog)s %(version)s")  # fmt: skip
def cli() -> None:
    """Record every model call of an LLM evaluation or RL rollout, and analyse the captures."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ngcapture`` console script; returns the exit status.

    Example:
        >>> main(["--version"])  # doctest: +SKIP
        ngcapture 0.1.0
        0
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(args)
    except BrokenPipeError:  # `ngcapture --help | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _run(args: list[str]) -> int:
    name = "ngcapture" + (f" {args[0]}" if args and args[0] in COMMANDS else "")
    try:
        result: Any = cli.main(args, prog_name="ngcapture", standalone_mode=False)
    except click.UsageError as exc:
        if not args and exc.ctx is not None:  # bare `ngcapture`: the help, not an error
            print(exc.ctx.get_help())
            return 0
        where = exc.ctx.command_path if exc.ctx is not None else name
        hint = f" (see `{where} --help`)" if exc.ctx is not None else ""
        return _fail(where, one_line(exc.format_message()) + hint, exc.exit_code)
    except click.ClickException as exc:
        return _fail(name, one_line(exc.format_message()), exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except CaptureError as exc:
        return _fail(name, one_line(str(exc)), EXIT_USAGE)
    except BrokenPipeError:
        raise
    except OSError as exc:  # the machine refused (permissions, disk full): not a bug
        return _fail(name, one_line(str(exc)), EXIT_USAGE)
    except Exception:
        traceback.print_exc()
        print(f"{name}: internal error: this is a bug in ngcapture {__version__}; please report "
              "it with the traceback above", file=sys.stderr)  # fmt: skip
        return EXIT_BUG
    return result if isinstance(result, int) else 0


def _fail(name: str, message: str, code: int) -> int:
    print(f"{name}: error: {message}", file=sys.stderr)
    return code
