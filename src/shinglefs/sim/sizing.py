"""Sizing a cluster from its capacity: drives, nodes, zones, metadata rows, index memory.

Every input is a field of ``SizingAssumptions`` and printed with the result.
Rows per file follow the metadata schema (``meta/schema.py``): one inode and
one dentry row; per 64 MiB chunk one chunk row, one chunk_refs row (one slice
per chunk when a file is written sequentially), one slices row and one
slice_replicas row per replica. Index memory per server: one extent per slice
on its drive at ``index_bytes_per_extent`` (29.5 B at 3.5 M extents, measured
by ``shinglefs bench index-scale`` at full size; the quick run's 350 k extents
cost more a piece).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from shinglefs.sim.drives import hc620

MiB = 1024 * 1024
CHUNK = 64 * MiB  # meta.records.CHUNK_SIZE


_CAPACITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]?)(I?)B?\s*$", re.IGNORECASE)


def parse_capacity(text: str) -> int:
    """``"200TB"`` -> 2e14 (decimal units, as drives are sold); ``"64GiB"`` binary; ValueError else."""
    m = _CAPACITY.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a capacity (e.g. 200TB, 100GB, 64GiB)")
    power = " KMGTP".index(m.group(2).upper() or " ")
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base**power)


@dataclass(frozen=True, slots=True)
class SizingAssumptions:
    mean_file_bytes: int = 64 * MiB  # a training shard (MosaicML .mds, litdata chunks)
    replicas: int = 1
    fill_fraction: float = 0.90  # of a drive's capacity usable (GC reserve, zone granularity)
    drives_per_node: int = 24
    index_bytes_per_extent: float = 29.5
    extents_per_slice: float = 1.0
    # groups map to zones: a deleted checkpoint resets its zones without copying;
    # what remains is record headers and zone tails (bench store: waf_churn 1.0005)
    write_amplification: float = 1.0005


def size_cluster(usable_bytes: int, a: SizingAssumptions | None = None) -> dict[str, object]:
    """Drives, nodes, zones, metadata rows and index memory for ``usable_bytes`` of user data."""
    a = a or SizingAssumptions()
    drive = hc620()
    raw = usable_bytes * a.replicas
    drives = math.ceil(raw / (drive.capacity * a.fill_fraction))
    nodes = math.ceil(drives / a.drives_per_node)
    files = math.ceil(usable_bytes / a.mean_file_bytes)
    chunks_per_file = math.ceil(a.mean_file_bytes / CHUNK)
    chunks = files * chunks_per_file
    rows = {
        "inodes": files,
        "dentries": files,
        "chunks": chunks,
        "chunk_refs": chunks,
        "slices": chunks,
        "slice_replicas": chunks * a.replicas,
    }
    extents_per_drive = chunks * a.replicas * a.extents_per_slice / drives
    index_per_drive = extents_per_drive * a.index_bytes_per_extent
    return {
        "usable_bytes": usable_bytes,
        "raw_bytes": raw,
        "drive": drive.name,
        "drive_bytes": drive.capacity,
        "drives": drives,
        "nodes": nodes,
        "zones": drives * drive.zone_count,
        "zones_per_drive": drive.zone_count,
        "files": files,
        "metadata_rows": sum(rows.values()),
        "metadata_rows_by_table": rows,
        "extents_per_drive": round(extents_per_drive),
        "index_mib_per_drive": round(index_per_drive / MiB, 1),
        "index_mib_per_server": round(index_per_drive * a.drives_per_node / MiB, 1),
        "assumptions": asdict(a),
    }


@dataclass(frozen=True, slots=True)
class Prices:
    """Monthly cost inputs; every figure is an assumption (override with ``--price-file``)."""

    drive_usd: float = 300.0  # a 15 TB HM-SMR drive (~$20/TB, assumed street price)
    node_usd: float = 6000.0  # a storage server chassis without drives (assumed)
    amortize_months: float = 60
    drive_watts: float = 7.0
    node_watts: float = 200.0
    usd_per_kwh: float = 0.15
    colo_usd_per_node_month: float = 150.0  # rack space, network port (assumed)
    ops_usd_per_node_month: float = 200.0  # operations staff share (assumed)
    metadata_usd_month: float = 300.0  # a PostgreSQL server for metadata (assumed)
    nvme_usd_per_tb_month: float = 100.0  # managed NVMe file service (assumed list-price class)
    hours_per_month: float = 730.0
    # the other tiers of the cost comparison (assumed street prices)
    cmr_drive_usd: float = 330.0
    cmr_drive_tb: float = 16.0
    cmr_drive_watts: float = 7.5
    nvme_drive_usd: float = 700.0  # a 7.68 TB data-center NVMe SSD, self-hosted
    nvme_drive_tb: float = 7.68
    nvme_drive_watts: float = 12.0


@dataclass(frozen=True, slots=True)
class Workload:
    dataset_bytes: int
    checkpoint_bytes: int
    every_steps: int
    steps_per_hour: float
    keep: int
    replicas: int = 1


def monthly_cost(drives: int, nodes: int, p: Prices) -> dict[str, float]:
    """Cost of ``drives`` in ``nodes`` per month, by item (USD)."""
    hours = p.hours_per_month
    items = {
        "drives": drives * p.drive_usd / p.amortize_months,
        "nodes": nodes * p.node_usd / p.amortize_months,
        "power": (drives * p.drive_watts + nodes * p.node_watts) / 1000 * hours * p.usd_per_kwh,
        "colo": nodes * p.colo_usd_per_node_month,
        "operations": nodes * p.ops_usd_per_node_month,
        "metadata": p.metadata_usd_month,
    }
    items["total"] = sum(items.values())
    return {k: round(v, 2) for k, v in items.items()}


def plan(w: Workload, a: SizingAssumptions | None = None,
         p: Prices | None = None) -> dict[str, object]:
    """Drives, nodes, zones, write amplification and monthly cost for a training workload."""
    a = a or SizingAssumptions(replicas=w.replicas)
    p = p or Prices()
    usable = w.dataset_bytes + (w.keep + 1) * w.checkpoint_bytes  # +1: the one being written
    sized = size_cluster(usable, a)
    drives, nodes = int(sized["drives"]), int(sized["nodes"])  # type: ignore[call-overload]
    cost = monthly_cost(drives, nodes, p)
    ckpt_per_hour = w.steps_per_hour / w.every_steps
    nvme_tb_same_cost = cost["total"] / p.nvme_usd_per_tb_month
    return {
        "usable_bytes": usable,
        "drives": drives,
        "nodes": nodes,
        "zones": sized["zones"],
        "checkpoints_per_hour": round(ckpt_per_hour, 3),
        "checkpoint_write_bytes_per_day": round(ckpt_per_hour * 24 * w.checkpoint_bytes),
        "expected_write_amplification": a.write_amplification,
        "monthly_usd": cost,
        "usd_per_usable_tb_month": round(cost["total"] / (usable / 1e12), 2),
        "nvme_monthly_usd_same_capacity": round(usable / 1e12 * p.nvme_usd_per_tb_month, 2),
        "nvme_tb_for_the_same_money": round(nvme_tb_same_cost, 1),
        "workload": asdict(w),
        "assumptions": asdict(a),
        "prices": asdict(p),
    }


def tiers(p: Prices) -> dict[str, tuple[float, float, float]]:
    """(drive price USD, drive capacity bytes, watts) of each tier of the cost comparison."""
    return {
        "HM-SMR (ShingleFS)": (p.drive_usd, float(hc620().capacity), p.drive_watts),
        "CMR HDD": (p.cmr_drive_usd, p.cmr_drive_tb * 1e12, p.cmr_drive_watts),
        "self-hosted NVMe": (p.nvme_drive_usd, p.nvme_drive_tb * 1e12, p.nvme_drive_watts),
    }


def tier_costs(usable_bytes: int = 200 * 10**12, p: Prices | None = None,
               a: SizingAssumptions | None = None) -> dict[str, float]:
    """USD per usable TB-month of each tier for ``usable_bytes`` (and managed NVMe's price)."""
    from dataclasses import replace

    p, a = p or Prices(), a or SizingAssumptions()
    out = {}
    for name, (price, capacity, watts) in tiers(p).items():
        drives = math.ceil(usable_bytes * a.replicas / (capacity * a.fill_fraction))
        nodes = math.ceil(drives / a.drives_per_node)
        cost = monthly_cost(drives, nodes, replace(p, drive_usd=price, drive_watts=watts))
        out[name] = round(cost["total"] / (usable_bytes / 1e12), 2)
    out["managed NVMe"] = p.nvme_usd_per_tb_month
    return out
