"""Plots of ``shinglefs bench smr``: each claim beside its baseline, as PNG files.

``write_plots(result, out_dir)`` takes the bench's JSON (or ``bench all``'s,
with an ``smr`` key) and writes:

1. ``smr-epoch-reads.png`` - epoch reads by 1, 4, 8 readers, fraction of the
   rated rate (data loaders, readers as fast as the drive, and a read path
   that tops its window up 32 MiB at a time), with the rated rate and the 0.85
   target;
2. ``smr-checkpoint.png`` - checkpoints by 1, 4, 16, 64 ranks: ShingleFS vs the
   same writes uncoalesced vs a conventional file system on DM-SMR;
3. ``smr-churn-waf.png`` - write amplification over corpus growth plus
   checkpoint churn with retention, beside one append stream without groups;
4. ``smr-churn-gc.png`` - GC bytes copied and zone resets over the same rounds,
   the same two;
5. ``smr-cluster.png`` - the 100 GB checkpoint time by nodes and by drives per
   node, with the product's 72 s claim;
6. ``smr-cost.png`` - USD per usable TB-month by tier (managed NVMe beside).

``CAPTIONS`` says under each what it shows and what its baseline is (the
report, ``bench.report``, prints them). matplotlib runs headless (Agg);
nothing is shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CAPTIONS = {
    "smr-epoch-reads.png": "Epoch reads of a corpus of 8 files by 1, 4 and 8 concurrent readers, "
    "in the order the client's read path sends them to the drive (4 MiB extents, 64 MiB "
    "readahead, a FIFO pool of 8 threads): the drive's modeled rate as a fraction of its rated "
    "sequential read (baseline: 1.0). Data loaders consume 100 MiB/s each; 'as fast as the "
    "drive' keeps each reader's window together; the third bar is a read path we do not have.",
    "smr-checkpoint.png": "A checkpoint written by 1, 4, 16 and 64 concurrent ranks: ShingleFS's "
    "write scheduler beside the same writes without coalescing and beside a conventional file "
    "system's layout of the same arrivals on a drive-managed SMR drive (fractions of each "
    "drive's rated sequential write).",
    "smr-churn-waf.png": "Write amplification over corpus growth plus checkpoint churn with "
    "retention (keep 3): ShingleFS's lifetime groups beside the baseline of one append stream "
    "without groups (corpus and checkpoint arriving together, old checkpoints deleted slice by "
    "slice), each on a drive of 1.25 times its own peak plus 12 zones; 1.0 is no amplification.",
    "smr-churn-gc.png": "GC bytes copied and zone resets over the same rounds: with lifetime "
    "groups a deleted checkpoint frees whole zones (resets, nothing copied); without them its "
    "bytes die among live ones and GC copies the live ones out.",
    "smr-cluster.png": "The 100 GB checkpoint on the cluster model (real placement and "
    "schedulers on a sample, HC620 drives, 25 GbE) by nodes and by drives per node, beside the "
    "product's claim of 72 s.",
    "smr-cost.png": "USD per usable TB-month by tier (assumed prices, `shinglefs size`), with "
    "managed NVMe beside.",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _epoch(plt: Any, r: dict[str, Any], path: Path) -> Path:
    readers = [1, 4, 8]
    series = [("data loaders (100 MiB/s each)", "epoch_read_fraction_{}"),
              ("readers as fast as the drive", "epoch_read_fraction_{}_drive_bound"),
              ("window topped up 32 MiB at once (not built)", "epoch_read_fraction_{}_refill_32mib")]
    series = [(label, key) for label, key in series if key.format(8) in r]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series):
        xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(readers))]
        ax.bar(xs, [r[key.format(n)] for n in readers], width, label=label)
    ax.axhline(1.0, color="gray", ls="--", label="rated sequential read")
    ax.axhline(0.85, color="tab:red", ls=":", label="target 0.85 (8 readers)")
    ax.set_xticks(range(len(readers)), [str(n) for n in readers])
    ax.set(xlabel="concurrent readers", ylabel="fraction of rated read", ylim=(0, 1.45),
           title="Epoch reads (HM-SMR model)")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    return _save(fig, path)


def _checkpoint(plt: Any, r: dict[str, Any], path: Path) -> Path:
    ranks = [1, 4, 16, 64]
    series = [("ShingleFS scheduler", "ckpt_write_fraction_{}"),
              ("same writes, uncoalesced", "ckpt_write_fraction_{}_uncoalesced"),
              ("conventional FS on DM-SMR", "dmsmr_write_fraction_{}")]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    width = 0.27
    for i, (label, key) in enumerate(series):
        xs = [k + (i - 1) * width for k in range(len(ranks))]
        ax.bar(xs, [r.get(key.format(n), 0) for n in ranks], width, label=label)
    ax.axhline(0.95, color="tab:red", ls=":", label="target 0.95 (16 ranks)")
    ax.set_xticks(range(len(ranks)), [str(n) for n in ranks])
    ax.set(xlabel="concurrent ranks", ylabel="fraction of rated write", ylim=(0, 1.45),
           title="Checkpoint write")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    return _save(fig, path)


def _churn(plt: Any, r: dict[str, Any], waf_path: Path, gc_path: Path) -> list[Path]:
    runs = [(label, rows) for label, rows in (("ShingleFS (lifetime groups)", r.get("churn")),
                                              ("one append stream, no groups (baseline)",
                                               r.get("churn_ungrouped"))) if rows]
    if not runs:
        return []
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for (label, rows), mark in zip(runs, "os", strict=False):
        ax.plot([x["user_gib"] for x in rows], [x["waf"] for x in rows], marker=mark, label=label)
    ax.axhline(1.0, color="gray", ls="--", label="no amplification")
    top = max(x["waf"] for _, rows in runs for x in rows)
    ax.set(xlabel="user GiB written", ylabel="write amplification",
           ylim=(0.98, max(1.1, top + 0.05)), title="Corpus growth + checkpoint churn (keep 3)")
    ax.legend(fontsize=7, loc="upper left")
    out = [_save(fig, waf_path)]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.5, 3.2))
    for (label, rows), mark in zip(runs, "os", strict=False):
        gib = [x["user_gib"] for x in rows]
        a1.plot(gib, [x["gc_mib_copied"] for x in rows], marker=mark, label=label)
        a2.plot(gib, [x["zone_resets"] for x in rows], marker=mark, label=label)
    a1.set(xlabel="user GiB written", ylabel="MiB", title="GC bytes copied")
    a2.set(xlabel="user GiB written", ylabel="count", title="zone resets")
    a1.legend(fontsize=7, loc="upper left")
    out.append(_save(fig, gc_path))
    return out


def _cluster(plt: Any, r: dict[str, Any], path: Path) -> Path:
    rows = r.get("cluster_scaling") or []
    base = {"drives_per_node": 1, "ranks": 96, "replicas": 1}
    by_nodes = sorted((x["nodes"], x["seconds"]) for x in rows
                      if all(x[k] == v for k, v in base.items()))
    by_drives = sorted((x["drives_per_node"], x["seconds"]) for x in rows
                       if x["nodes"] == 12 and x["ranks"] == 96 and x["replicas"] == 1)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7, 3.2))
    a1.plot([n for n, _ in by_nodes], [s for _, s in by_nodes], marker="o", label="modeled")
    a2.plot([d for d, _ in by_drives], [s for _, s in by_drives], marker="o", label="modeled")
    for ax, xl in ((a1, "nodes (1 drive each)"), (a2, "drives per node (12 nodes)")):
        ax.axhline(72, color="tab:red", ls=":", label="product claim 72 s")
        ax.set(xlabel=xl, ylabel="seconds")
        ax.legend(fontsize=7)
    fig.suptitle("100 GB checkpoint, 25 GbE")
    return _save(fig, path)


def _cost(plt: Any, r: dict[str, Any], path: Path) -> Path:
    tiers = r.get("tier_usd_per_tb_month") or {}
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.barh(list(tiers), list(tiers.values()), color="tab:green")
    ax.set_xscale("log")
    ax.set_xlim(left=1)
    ax.set(xlabel="USD per usable TB-month (log; assumed prices)", title="Cost by tier")
    for i, v in enumerate(tiers.values()):
        ax.text(v, i, f" {v:g}", va="center", fontsize=8)
    return _save(fig, path)


def write_plots(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write every plot of ``result`` into ``out_dir``; returns the files written."""
    r = result.get("smr", result)
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    paths = [_epoch(plt, r, out_dir / "smr-epoch-reads.png"),
             _checkpoint(plt, r, out_dir / "smr-checkpoint.png")]
    paths += _churn(plt, r, out_dir / "smr-churn-waf.png", out_dir / "smr-churn-gc.png")
    if r.get("cluster_scaling"):
        paths.append(_cluster(plt, r, out_dir / "smr-cluster.png"))
    if r.get("tier_usd_per_tb_month"):
        paths.append(_cost(plt, r, out_dir / "smr-cost.png"))
    return paths
