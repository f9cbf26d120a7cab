"""``shinglefs sim``: replay a recorded drive trace through the drive models; show the calibration.

The models live in ``shinglefs.sim``; this module parses, prints a table or
one JSON object, and raises ``UsageError`` for a bad file or model name.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from shinglefs.errors import UsageError

sim_app = typer.Typer(help="SMR drive timing models: replay traces, show the calibration.",
                      no_args_is_help=True)


def _models(names: str) -> list[str]:
    from shinglefs.sim import PROFILES

    chosen = list(PROFILES) if names == "all" else [n.strip() for n in names.split(",")]
    for name in chosen:
        if name not in PROFILES:
            raise UsageError(f"unknown drive model {name!r}",
                             hint=f"choose from: {', '.join(PROFILES)}, all")
    return chosen


@sim_app.command("replay")
def replay(
    trace: Path = typer.Argument(..., help="trace file (JSON lines, see docs/sim.md)"),
    model: str = typer.Option("hc620", "--model", help="hc620, dmsmr, cmr, flash, or all"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Modeled seconds, throughput, seeks and zone switches of a recorded trace."""
    from shinglefs.sim import profile
    from shinglefs.sim.tracefile import read_trace

    names = _models(model)
    t = read_trace(trace)
    results = {}
    for name in names:
        m = profile(name)
        results[name] = m.replay(t.records, zone_size=t.zone_size).as_dict()
    if as_json:
        typer.echo(json.dumps({"trace": str(trace), "records": len(t.records),
                               "zone_size": t.zone_size, "models": results}))
        return
    typer.echo(f"{trace}: {len(t.records)} records, zone size {t.zone_size}")
    keys = ("seconds", "mib_s", "bytes_written", "bytes_read", "seeks", "zone_switches",
            "implicit_closes", "bands_cleaned")
    typer.echo(f"{'model':16s}" + "".join(f"{k:>16s}" for k in keys))
    for name, r in results.items():
        typer.echo(f"{name:16s}" + "".join(f"{r[k]!s:>16s}" for k in keys))


@sim_app.command("calibrate")
def calibrate(as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Each published figure beside what the model gives for the same workload."""
    from shinglefs.sim.calibration import calibration_points

    points = calibration_points()
    if as_json:
        typer.echo(json.dumps([p.as_dict() for p in points]))
        return
    for p in points:
        mark = "ok " if p.ok else "OFF"
        typer.echo(f"{mark} {p.name:40s} published {p.published:>10s} {p.unit:6s}"
                   f" model {p.modeled:8.1f}")


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
