"""A typer app with only the ``sim`` commands registered (the CLI without the other layers)."""

from __future__ import annotations

import typer

from shinglefs.cli import sim as sim_cli


def sim_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    sim_cli.register(app)
    return app
