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


def _assumptions(path: Path | None, flags: dict[str, Any]) -> tuple[Any, Any, Any, set[str]]:
    """(Prices, SizingAssumptions, ClusterSpec, keys given): defaults, then ``path``'s keys,
    then the flags that were given.

    ``path`` is a JSON object whose keys are any fields of the three (one flat
    namespace; every key ``size`` prints). Raises UsageError for an unreadable
    file, an unknown key or a value of the wrong kind.
    """
    from dataclasses import fields, replace

    from shinglefs.sim.cluster import ClusterSpec
    from shinglefs.sim.sizing import Prices, SizingAssumptions

    given: dict[str, Any] = {}
    if path is not None:
        try:
            given = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read price file {path}: {exc}") from exc
        if not isinstance(given, dict):
            raise UsageError(f"price file {path}: not a JSON object")
    given.update({k: v for k, v in flags.items() if v is not None})
    out = []
    known: set[str] = set()
    kinds: tuple[Any, ...] = (Prices, SizingAssumptions, ClusterSpec)
    for kind in kinds:
        names = {f.name: f for f in fields(kind)} if kind is not ClusterSpec else {
            f.name: f for f in fields(kind) if f.name not in {"nodes", "drives_per_node"}}
        known |= set(names)
        mine = {}
        for key in set(given) & set(names):
            cast = int if names[key].type in ("int", int) else float
            try:
                mine[key] = cast(given[key])
            except (TypeError, ValueError):
                raise UsageError(f"{key}: {given[key]!r} is not a number") from None
        out.append(replace(kind(), **mine))
    unknown = set(given) - known
    if unknown:
        raise UsageError(f"price file {path}: unknown keys {sorted(unknown)}",
                         hint=f"known keys: {', '.join(sorted(known))}")
    return out[0], out[1], out[2], set(given)


def size(
    dataset: str = typer.Option(..., "--dataset", help="corpus size, e.g. 200TB"),
    checkpoint: str = typer.Option(..., "--checkpoint", help="one checkpoint, e.g. 100GB"),
    every: int = typer.Option(1000, "--every", help="steps between checkpoints"),
    steps_per_hour: float = typer.Option(600, "--steps-per-hour"),
    keep: int = typer.Option(5, "--keep", help="checkpoints kept"),
    replicas: int | None = typer.Option(None, "--replicas", help="copies of every byte [1]"),
    drives_per_node: int | None = typer.Option(None, "--drives-per-node", help="[24]"),
    ranks: int | None = typer.Option(None, "--ranks", help="ranks writing a checkpoint [96]"),
    node_gbit: float | None = typer.Option(None, "--node-gbit", help="a node's NIC [25]"),
    drive_usd: float | None = typer.Option(None, "--drive-usd", help="an HM-SMR drive [300]"),
    nvme_usd: float | None = typer.Option(
        None, "--nvme-usd-per-tb-month", help="managed NVMe's price [100]"),
    price_file: Path | None = typer.Option(
        None, "--price-file", help="JSON object overriding any printed price or assumption"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Drives, nodes, zones, write amplification, checkpoint time and monthly cost vs managed NVMe."""
    import math
    import tempfile
    from dataclasses import asdict, replace

    from shinglefs.sim import cluster
    from shinglefs.sim.sizing import Workload, plan, tier_costs

    prices, a, spec, given = _assumptions(price_file, {
        "replicas": replicas, "drives_per_node": drives_per_node, "ranks": ranks,
        "node_gbit": node_gbit, "drive_usd": drive_usd, "nvme_usd_per_tb_month": nvme_usd})
    spec = replace(spec, replicas=a.replicas)
    if min(every, keep + 1, a.replicas, a.drives_per_node, spec.ranks) <= 0 or steps_per_hour <= 0:
        raise UsageError("--every, --steps-per-hour, --replicas, --drives-per-node and --ranks "
                         "must be positive, --keep not negative")
    w = Workload(_capacity(dataset, "dataset"), _capacity(checkpoint, "checkpoint"), every,
                 steps_per_hour, keep, a.replicas)
    out: dict[str, Any] = plan(w, a, prices)
    nodes, drives = int(out["nodes"]), int(out["drives"])
    spec = replace(spec, nodes=nodes, drives_per_node=math.ceil(drives / nodes),
                   clients=spec.clients if "clients" in given else max(1, spec.ranks // 8))
    with tempfile.TemporaryDirectory(prefix="shinglefs-size-") as tmp:
        est = cluster.estimate(spec, w.checkpoint_bytes,
                               cluster.NodeSampler(Path(tmp), 16 * 1024 * 1024))
    out["checkpoint_seconds"] = round(est.seconds, 1)
    out["checkpoint_bottleneck"] = est.bottleneck
    out["cluster"] = asdict(spec)
    out["tier_usd_per_tb_month"] = tier_costs(w.dataset_bytes, prices, a)
    # the seed's claim: 200 TB on SMR costs about what 80 TB of managed NVMe costs
    claim: dict[str, Any] = plan(replace(w, dataset_bytes=SEED_CLAIM_SMR_TB * 10**12), a, prices)
    nvme_80 = SEED_CLAIM_NVME_TB * prices.nvme_usd_per_tb_month
    out["seed_claim"] = {
        "claim": f"{SEED_CLAIM_SMR_TB} TB on SMR ~ {SEED_CLAIM_NVME_TB} TB of managed NVMe a month",
        "smr_monthly_usd": claim["monthly_usd"]["total"],
        "nvme_80tb_monthly_usd": nvme_80,
        "nvme_tb_for_the_same_money": claim["nvme_tb_for_the_same_money"],
        "holds": claim["monthly_usd"]["total"] <= nvme_80 * 1.1,
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
    typer.echo("by tier (USD per usable TB-month of the dataset): " + ", ".join(
        f"{k} {v:g}" for k, v in out["tier_usd_per_tb_month"].items()))
    c = out["seed_claim"]
    typer.echo(f"seed claim   {c['claim']}: SMR ${c['smr_monthly_usd']:,.0f} vs NVMe 80 TB "
               f"${c['nvme_80tb_monthly_usd']:,.0f} (the SMR cost buys "
               f"{c['nvme_tb_for_the_same_money']} TB of NVMe): "
               + ("holds" if c["holds"] else "does not hold"))
    for title, values in (("prices", out["prices"]), ("assumptions", out["assumptions"]),
                          ("cluster", out["cluster"]), ("workload", out["workload"])):
        typer.echo(f"{title}:")
        for key, value in values.items():
            typer.echo(f"  {key:28s} {value}")
    typer.echo("override any price or assumption above with --price-file FILE "
               "(a JSON object of these keys) or its flag")


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
    app.command("size")(size)
