"""Entry point of the ``shinglefs`` command.

Subcommands live in modules of this package, each exposing ``register(app)``;
this module wires them and owns the single error boundary: a
``ShingleError`` becomes one line on stderr (plus its hint) and its exit code.
Exit codes: 0 ok, 1 failure, 2 usage error, further codes documented in
docs/cli.md by the commands that raise them.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

import typer

from shinglefs import __version__
from shinglefs.errors import ShingleError, UsageError

app = typer.Typer(
    name="shinglefs",
    help="ShingleFS: AI training storage on host-managed SMR drives.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Modules of shinglefs.cli that add commands; a missing one is skipped so the
# layers can land one at a time.
COMMAND_MODULES = ["bench", "demo", "filesystem", "status", "recovery", "server", "policy",
                   "snapshot", "sim"]


_registered: list[bool] = []


def _register_all() -> None:
    """Add every command module's commands to ``app``, once per process: each
    ``main()`` call added them all again, and every call then built every
    copy (a test session of in-process calls ran its later CLI tests 10-20
    times slower than alone)."""
    if _registered:
        return
    _registered.append(True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"shinglefs.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"shinglefs.cli.{name}":
                continue
            raise
        module.register(app)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"shinglefs {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                 help="print the version and exit"),
) -> None:
    """ShingleFS: AI training storage on host-managed SMR drives."""


def _configure_logging() -> None:
    """Logging at ``SHINGLEFS_LOG`` (default WARNING); UsageError for an unknown level."""
    level = os.environ.get("SHINGLEFS_LOG", "WARNING").strip().upper() or "WARNING"
    if level not in LOG_LEVELS:
        raise UsageError(f"SHINGLEFS_LOG={os.environ['SHINGLEFS_LOG']!r} is not a log level",
                         hint=f"use one of {', '.join(LOG_LEVELS)}, or unset it")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns (and exits with) the process exit code."""
    _register_all()
    try:
        _configure_logging()
        # Standalone mode: click itself reports usage errors (exit 2) and
        # Ctrl-C; our typed errors pass through it to the boundary below.
        app(args=argv, standalone_mode=True)
    except ShingleError as exc:
        print(f"shinglefs: error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"shinglefs: hint: {exc.hint}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("shinglefs: interrupted", file=sys.stderr)
        sys.exit(130)
    return 0
