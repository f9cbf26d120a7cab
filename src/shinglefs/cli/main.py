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

from shinglefs.errors import ShingleError

app = typer.Typer(
    name="shinglefs",
    help="ShingleFS: AI training storage on host-managed SMR drives.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Modules of shinglefs.cli that add commands; a missing one is skipped so the
# layers can land one at a time.
COMMAND_MODULES = ["bench", "demo", "filesystem"]


def _register_all() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"shinglefs.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"shinglefs.cli.{name}":
                continue
            raise
        module.register(app)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns (and exits with) the process exit code."""
    level = os.environ.get("SHINGLEFS_LOG", "WARNING").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _register_all()
    try:
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
