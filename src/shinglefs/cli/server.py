"""The ``server`` command: a storage server serving its drives over the slice
protocol and registered in the metadata database.

Thin: parse the flags, then ``shinglefs.server.process.run_server`` does the
work (docs/cli.md; what it does at start and stop: that module's docstring).
Its failures are typed errors, printed by the boundary in ``cli.main``:
metadata unreachable (exit 3), a drive in use (exit 3), the listen address
in use (exit 23).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from shinglefs.errors import UsageError
from shinglefs.meta.api import REPAIR_AFTER_S, SERVER_HEARTBEAT_S


def server_command(
    meta_url: str = typer.Argument(..., help="metadata URL of a formatted file system"),
    drive: list[str] = typer.Option(..., "--drive", "-d",
                                    help="KIND:PATH[:SIZE], repeat for each drive; a drive "
                                    "that does not exist yet is created (SIZE needed)"),
    listen: str = typer.Option("0.0.0.0:7070", "--listen", metavar="HOST:PORT",
                               help="address to serve slices on (port 0: any free port)"),
    advertise: str | None = typer.Option(
        None, "--advertise", metavar="HOST:PORT",
        help="address clients connect to (default: --listen, this host's name for 0.0.0.0)"),
    label: list[str] = typer.Option([], "--label", metavar="KEY=VALUE",
                                    help="a label for placement, e.g. rack=a (repeat)"),
    heartbeat: float = typer.Option(SERVER_HEARTBEAT_S, "--heartbeat", metavar="SECONDS",
                                    help="seconds between heartbeats in meta"),
    repair_after: float = typer.Option(
        REPAIR_AFTER_S, "--repair-after", metavar="SECONDS",
        help="re-replicate slices whose other replica's server has been gone this long"),
    repair_interval: float = typer.Option(
        30.0, "--repair-interval", metavar="SECONDS",
        help="seconds between re-replication passes (0: none)"),
    orphan_grace: float = typer.Option(
        3600.0, "--orphan-grace", metavar="SECONDS",
        help="delete a copy no slice record names once seen so this long"),
    sweep_interval: float = typer.Option(
        300.0, "--sweep-interval", metavar="SECONDS",
        help="seconds between orphan sweep passes (0: none)"),
    deletion_interval: float = typer.Option(
        2.0, "--deletion-interval", metavar="SECONDS",
        help="seconds between passes freeing this server's copies of deleted slices (0: none)"),
    zone_size: str | None = typer.Option(None, "--zone-size", metavar="SIZE",
                                         help="zone size of emulated drives created here "
                                         "(default 256M)"),
    config: Path | None = typer.Option(None, "--config", metavar="FILE",
                                       help="configuration file (its [store] section applies)"),
) -> None:
    """Serve drives to clients over the network, registered in the metadata database."""
    from shinglefs.cli.configfile import load_settings, size_flag
    from shinglefs.client.filesystem import absolute_meta_url, require_metadata_file
    from shinglefs.server.process import (
        ServerConfig,
        StorageServer,
        parse_address,
        parse_labels,
        run_server,
    )

    if not heartbeat > 0:
        raise UsageError(f"--heartbeat {heartbeat} is not a positive number of seconds")
    if not repair_after > 0 or not repair_interval >= 0:
        raise UsageError("--repair-after must be positive and --repair-interval not negative")
    if not orphan_grace >= 0 or not sweep_interval >= 0 or not deletion_interval >= 0:
        raise UsageError("--orphan-grace, --sweep-interval and --deletion-interval must not "
                         "be negative")
    if advertise is not None:
        parse_address(advertise, "--advertise")
    settings = load_settings(config, {"format": {"zone_size": size_flag("--zone-size",
                                                                        zone_size)}})
    meta_url = absolute_meta_url(meta_url)
    require_metadata_file(meta_url)
    server_config = ServerConfig(
        meta_url=meta_url, drives=tuple(drive), listen=parse_address(listen),
        advertise=advertise, labels=parse_labels(label), heartbeat_s=heartbeat,
        zone_size=settings.format.zone_size, store_config=settings.store,
        repair_after_s=repair_after, repair_interval_s=repair_interval,
        orphan_grace_s=orphan_grace, sweep_interval_s=sweep_interval,
        deletion_interval_s=deletion_interval)

    def ready(server: StorageServer) -> None:
        print(f"server {server.server_id} serving {len(drive)} drive(s) at {server.address}",
              flush=True)

    run_server(server_config, ready)
    print(f"server stopped and unregistered from {meta_url}", file=sys.stderr, flush=True)


def register(app: typer.Typer) -> None:
    app.command("server")(server_command)
