"""Plots of ``shinglefs bench smr``: each claim beside its baseline, as PNG files.

``write_plots(result, out_dir)`` takes the bench's JSON (or ``bench all``'s,
with an ``smr`` key) and writes:

1. ``smr-epoch-reads.png`` - epoch reads by 1, 4, 8 readers, fraction of the
   rated rate, with the rated rate and the 0.85 target;
2. ``smr-checkpoint.png`` - checkpoints by 1, 4, 16, 64 ranks: ShingleFS vs the
   same writes uncoalesced vs a conventional file system on DM-SMR;
3. ``smr-churn-waf.png`` - write amplification over corpus growth plus
   checkpoint churn with retention (1.0 = none, the baseline);
4. ``smr-churn-gc.png`` - GC bytes copied and zone resets over the same rounds;
5. ``smr-cluster.png`` - the 100 GB checkpoint time by nodes and by drives per
   node, with the product's 72 s claim;
6. ``smr-cost.png`` - USD per usable TB-month by tier (managed NVMe beside).

``markdown(paths)`` returns a report section linking them. matplotlib runs
headless (Agg); nothing is shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar([str(n) for n in readers], [r[f"epoch_read_fraction_{n}"] for n in readers],
           color="tab:blue", label="ShingleFS on HM-SMR (modeled)")
    ax.axhline(1.0, color="gray", ls="--", label="rated sequential read")
    ax.axhline(0.85, color="tab:red", ls=":", label="target 0.85")
    ax.set(xlabel="concurrent readers", ylabel="fraction of rated", ylim=(0, 1.4),
           title="Epoch reads")
    ax.legend(fontsize=7, loc="upper right")
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
    rounds = r.get("churn") or []
    if not rounds:
        return []
    gib = [x["user_gib"] for x in rounds]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(gib, [x["waf"] for x in rounds], marker="o", label="ShingleFS")
    ax.axhline(1.0, color="gray", ls="--", label="no amplification")
    ax.set(xlabel="user GiB written", ylabel="write amplification", ylim=(0.95, 1.5),
           title="Corpus growth + checkpoint churn (keep 3)")
    ax.legend(fontsize=7)
    out = [_save(fig, waf_path)]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(gib, [x["zone_resets"] for x in rounds], marker="o", label="zone resets")
    ax.plot(gib, [x["gc_mib_copied"] for x in rounds], marker="s", label="GC MiB copied")
    ax.set(xlabel="user GiB written", ylabel="count / MiB", title="GC work over the same rounds")
    ax.legend(fontsize=7)
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


def markdown(paths: list[Path], relative_to: Path) -> str:
    """A report section showing ``paths`` (links relative to the report's folder)."""
    lines = ["## SMR model plots (`shinglefs bench smr`, `shinglefs sim plots`)", ""]
    for p in paths:
        rel = Path(p).resolve().relative_to(relative_to.resolve())
        lines.append(f"![{p.stem}]({rel.as_posix()})")
        lines.append("")
    return "\n".join(lines)
