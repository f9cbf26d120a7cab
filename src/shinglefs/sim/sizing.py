"""Sizing a cluster from its capacity: drives, nodes, zones, metadata rows, index memory.

Every input is a field of ``SizingAssumptions`` and printed with the result.
Rows per file follow the metadata schema (``meta/schema.py``): one inode and
one dentry row; per 64 MiB chunk one chunk row, one chunk_refs row (one slice
per chunk when a file is written sequentially), one slices row and one
slice_replicas row per replica. Index memory per server: one extent per slice
on its drive at ``index_bytes_per_extent`` (29.5 B measured by ``shinglefs
bench index-scale``, docs/benchmarks.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from shinglefs.sim.drives import hc620

MiB = 1024 * 1024
CHUNK = 64 * MiB  # meta.records.CHUNK_SIZE


@dataclass(frozen=True, slots=True)
class SizingAssumptions:
    mean_file_bytes: int = 64 * MiB  # a training shard (MosaicML .mds, litdata chunks)
    replicas: int = 1
    fill_fraction: float = 0.90  # of a drive's capacity usable (GC reserve, zone granularity)
    drives_per_node: int = 24
    index_bytes_per_extent: float = 29.5
    extents_per_slice: float = 1.0


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
