"""What every ``ngcapture`` command shares: the one-line user error, path and port checks.

A user's mistake is a :class:`UserError`: ``ngcapture`` prints it as one line on stderr and
exits with status 2. Commands check what they can before they change anything (a path that
is a file, a port in use), so a refused command leaves the disk as it found it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

import click

__all__ = [
    "CONTEXT_SETTINGS",
    "EXIT_BUG",
    "EXIT_USAGE",
    "UserError",
    "bind",
    "existing_dir",
    "listen_options",
    "user_errors",
    "writable_dir",
    "writable_file",
]

#: A user's mistake (bad option, path, port, URL): one line on stderr.
EXIT_USAGE: Final = 2
#: A bug in ngcapture: the traceback, then one line that says so (sysexits' EX_SOFTWARE).
EXIT_BUG: Final = 70

CONTEXT_SETTINGS: Final[dict[str, Any]] = {
    "show_default": True,
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
}

F = TypeVar("F", bound=Callable[..., Any])


class UserError(click.ClickException):
    """A mistake the user can fix: printed as one line, exit status 2.

    Example:
        >>> raise UserError("--capture-dir /tmp/x is a file, not a directory")  # doctest: +SKIP
    """

    exit_code = EXIT_USAGE


@contextlib.contextmanager
def user_errors(*types: type[BaseException]) -> Iterator[None]:
    """Turn the given exception types into :class:`UserError` (their message, one line).

    Example:
        >>> with user_errors(ValueError):  # doctest: +SKIP
        ...     int("x")
    """
    try:
        yield
    except types as exc:
        raise UserError(one_line(str(exc))) from exc


def one_line(text: str) -> str:
    """``text`` with its lines joined by ``"; "`` (messages are printed as one line)."""
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def listen_options(default_port: int) -> Callable[[F], F]:
    """``--host``, ``--port`` and ``--port-file`` of a command that listens."""

    def decorate(function: F) -> F:
        function = click.option(
            "--port-file",
            type=click.Path(path_type=Path),
            help="Write the bound port to this file once listening (for scripts and tests).",
        )(function)
        function = click.option(
            "--port",
            type=click.IntRange(0, 65535),
            default=default_port,
            help="Port to listen on; 0 picks any free port (the URL is printed).",
        )(function)
        return click.option(
            "--host",
            default="127.0.0.1",
            help="Address to listen on; 0.0.0.0 listens on every interface.",
        )(function)

    return decorate


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or a one-line :class:`UserError` saying why there is none."""
    from capture_core.server.listener import bind_socket

    try:
        return bind_socket(host, port)
    except OSError as exc:
        where = f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {port} on {host} is already in use: pick another with --port N, or "
                "--port 0 for any free port"
            ) from None
        if exc.errno == errno.EACCES:
            raise UserError(
                f"not allowed to listen on {where} (ports below 1024 need privileges): pick "
                "--port 1024 or higher"
            ) from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UserError(
                f"cannot listen on {where}: --host {host} is not an address of this machine"
            ) from None
        reason = exc.strerror or str(exc)
        raise UserError(f"cannot listen on {where}: {reason} (check --host)") from None


def existing_dir(path: Path, flag: str, *, hint: str = "") -> Path:
    """``path`` resolved; a :class:`UserError` unless it is an existing directory."""
    resolved = path.expanduser().resolve()
    if not resolved.exists():
        raise UserError(f"{flag} {resolved} does not exist{hint}")
    if not resolved.is_dir():
        raise UserError(f"{flag} {resolved} is a file, not a directory")
    return resolved


def writable_dir(path: Path, flag: str) -> Path:
    """``path`` resolved, if it is a directory or could be created as one; nothing is created."""
    resolved = path.expanduser().resolve()
    if resolved.exists() and not resolved.is_dir():
        raise UserError(f"{flag} {resolved} is a file, not a directory")
    _creatable(resolved, flag)
    return resolved


def writable_file(path: Path, flag: str) -> Path:
    """``path`` resolved, if it is a file or could be created as one; nothing is created."""
    resolved = path.expanduser().resolve()
    if resolved.is_dir():
        raise UserError(f"{flag} {resolved} is a directory, not a file")
    _creatable(resolved, flag)
    return resolved


def _creatable(resolved: Path, flag: str) -> None:
    """A :class:`UserError` when ``resolved`` could not be written (or created) by this user."""
    existing = resolved
    while not existing.exists():
        existing = existing.parent
    if existing != resolved and not existing.is_dir():
        raise UserError(f"{flag} {resolved} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK):
        raise UserError(f"{flag} {resolved} is not writable ({existing}: permission denied)")
