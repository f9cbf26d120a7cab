"""``shinglefs sim``: replay a recorded drive trace through the drive models; show the calibration.

The models live in ``shinglefs.sim``; this module parses, prints a table or
one JSON object, and raises ``UsageError`` for a bad file or model name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


@sim_app.command("plots")
def plots(
    result: Path = typer.Argument(..., help="JSON of `bench smr --json` (or `bench all --json`)"),
    out: Path = typer.Option(Path("docs/img"), "--out", help="folder for the PNG files"),
) -> None:
    """PNG plots of the SMR benchmark, each claim beside its baseline (the report: `bench report`)."""
    from shinglefs.sim.plots import write_plots

    try:
        doc = json.loads(result.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read benchmark JSON {result}: {exc}") from exc
    if not isinstance(doc, dict) or ("smr" not in doc and "ckpt_write_fraction_16" not in doc):
        raise UsageError(f"{result} holds no `bench smr` result",
                         hint="run `shinglefs bench smr --json > FILE` first")
    for p in write_plots(doc, out):
        typer.echo(str(p))


SEED_CLAIM_SMR_TB = 200
SEED_CLAIM_NVME_TB = 80


def _capacity(text: str, what: str) -> int:
    from shinglefs.sim.sizing import parse_capacity

    try:
        return parse_capacity(text)
    except ValueError as exc:
        raise UsageError(f"--{what}: {exc}", hint="decimal units as drives are sold: 200TB") from exc


def _prices(path: Path | None) -> Any:
    from dataclasses import fields, replace

    from shinglefs.sim.sizing import Prices

    prices = Prices()
    if path is None:
        return prices
    try:
        given = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read price file {path}: {exc}") from exc
    known = {f.name for f in fields(Prices)}
    unknown = set(given) - known if isinstance(given, dict) else {"(not an object)"}
    if unknown:
        raise UsageError(f"price file {path}: unknown keys {sorted(unknown)}",
                         hint=f"known keys: {', '.join(sorted(known))}")
    return replace(prices, **{k: float(v) for k, v in given.items()})


def size(
    dataset: str = typer.Option(..., "--dataset", help="corpus size, e.g. 200TB"),
    checkpoint: str = typer.Option(..., "--checkpoint", help="one checkpoint, e.g. 100GB"),
    every: int = typer.Option(1000, "--every", help="steps between checkpoints"),
    steps_per_hour: float = typer.Option(600, "--steps-per-hour"),
    keep: int = typer.Option(5, "--keep", help="checkpoints kept"),
    replicas: int = typer.Option(1, "--replicas"),
    drives_per_node: int = typer.Option(24, "--drives-per-node"),
    ranks: int = typer.Option(96, "--ranks", help="ranks writing a checkpoint at once"),
    price_file: Path | None = typer.Option(None, "--price-file",
                                           help="JSON object overriding any price"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Drives, nodes, zones, write amplification, checkpoint time and monthly cost vs managed NVMe."""
    import math
    import tempfile

    from shinglefs.sim import cluster
    from shinglefs.sim.sizing import SizingAssumptions, Workload, plan

    if min(every, keep + 1, replicas, drives_per_node, ranks) <= 0 or steps_per_hour <= 0:
        raise UsageError("--every, --steps-per-hour, --replicas, --drives-per-node and --ranks "
                         "must be positive, --keep not negative")
    w = Workload(_capacity(dataset, "dataset"), _capacity(checkpoint, "checkpoint"), every,
                 steps_per_hour, keep, replicas)
    prices = _prices(price_file)
    out: dict[str, Any] = plan(
        w, SizingAssumptions(replicas=replicas, drives_per_node=drives_per_node), prices)
    nodes, drives = int(out["nodes"]), int(out["drives"])
    spec = cluster.ClusterSpec(nodes=nodes, drives_per_node=math.ceil(drives / nodes),
                               clients=max(1, ranks // 8), ranks=ranks, replicas=replicas)
    with tempfile.TemporaryDirectory(prefix="shinglefs-size-") as tmp:
        est = cluster.estimate(spec, w.checkpoint_bytes,
                               cluster.NodeSampler(Path(tmp), 16 * 1024 * 1024))
    out["checkpoint_seconds"] = round(est.seconds, 1)
    out["checkpoint_bottleneck"] = est.bottleneck
    out["cluster"] = est.as_dict()["spec"]
    # the seed's claim: 200 TB on SMR costs about what 80 TB of managed NVMe costs
    claim: dict[str, Any] = plan(Workload(SEED_CLAIM_SMR_TB * 10**12, w.checkpoint_bytes, every, steps_per_hour,
                          keep, replicas),
                 SizingAssumptions(replicas=replicas, drives_per_node=drives_per_node), prices)
    out["seed_claim"] = {
        "claim": f"{SEED_CLAIM_SMR_TB} TB on SMR ~ {SEED_CLAIM_NVME_TB} TB of managed NVMe a month",
        "smr_monthly_usd": claim["monthly_usd"]["total"],
        "nvme_80tb_monthly_usd": SEED_CLAIM_NVME_TB * prices.nvme_usd_per_tb_month,
        "nvme_tb_for_the_same_money": claim["nvme_tb_for_the_same_money"],
    }
    if as_json:
        typer.echo(json.dumps(out))
        return
    _print_plan(out)


def _print_plan(out: dict[str, Any]) -> None:
    tb = 1e12
    typer.echo(f"usable       {out['usable_bytes'] / tb:,.1f} TB (dataset + kept checkpoints + 1)")
    typer.echo(f"drives       {out['drives']} x HC620 15 TB"
               f" in {out['nodes']} nodes; {out['zones']:,} zones")
    typer.echo(f"write ampl.  {out['expected_write_amplification']} (groups map to zones)")
    typer.echo(f"checkpoint   {out['checkpoint_seconds']} s (bottleneck: "
               f"{out['checkpoint_bottleneck']}); {out['checkpoints_per_hour']} per hour")
    typer.echo("monthly cost (USD): " + ", ".join(f"{k} {v:,.0f}"
                                               for k, v in out["monthly_usd"].items()))
    typer.echo(f"per usable TB-month ${out['usd_per_usable_tb_month']}; managed NVMe for the "
               f"same capacity ${out['nvme_monthly_usd_same_capacity']:,.0f}; the same money buys "
               f"{out['nvme_tb_for_the_same_money']} TB of managed NVMe")
    c = out["seed_claim"]
    typer.echo(f"seed claim   {c['claim']}: SMR ${c['smr_monthly_usd']:,.0f} vs NVMe 80 TB "
               f"${c['nvme_80tb_monthly_usd']:,.0f} (the SMR cost buys "
               f"{c['nvme_tb_for_the_same_money']} TB of NVMe)")
    typer.echo("prices:      " + json.dumps(out["prices"]))
    typer.echo("assumptions: " + json.dumps(out["assumptions"]) + " " + json.dumps(out["cluster"]))


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
    app.command("size")(size)
