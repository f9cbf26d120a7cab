"""The tunables of a slice store (``StoreConfig``), in one place.

Every field has a default that suits a real drive; ``format`` and ``mount``
pass overrides by keyword. Imported by the slice log and the slice store;
this module imports nothing of the store.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVER_SWITCH_BYTES = 32 * 1024**2
"""A storage server's zone run (``StoreConfig.switch_bytes`` None)."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Tunables of a slice store; every field has a default that suits a real drive.

    ``gc_free_zones``: GC copies live data when fewer zones are free (default:
    5 % of the sequential zones, at least 3). ``gc_reserve_zones``: free zones
    only GC and tombstones may take (at least 2: one for each). ``open_zone_reserve``: open zones kept for
    the GC and metadata streams. ``checkpoint_interval_bytes``: device bytes
    between index checkpoints. ``checkpoint_path``: put checkpoints in a file
    instead of the drive's conventional zones.

    Write scheduler (store/scheduler.py): ``max_queue_bytes`` queued before
    ``submit`` waits; a group is written once ``min_run_bytes`` of it are
    queued, up to ``max_run_bytes`` a run and ``batch_bytes`` a batch, or
    once it lingered (``linger_s``). ``switch_bytes``: the zone run — the
    writer stays on a group until it wrote this many bytes of it in a row,
    or nothing of it was queued for ``switch_wait_s`` (about two zone
    switches' seeks: waiting longer idles the drive for more than the
    switches it saves; docs/cluster.md). None: the role's
    default, ``SERVER_SWITCH_BYTES`` on a storage server (whose drives take
    pieces from many clients at once), 0 (off) in a client's own stores.
    """

    gc_free_zones: int | None = None
    gc_reserve_zones: int = 2
    open_zone_reserve: int = 2
    checkpoint_interval_bytes: int = 4 * 1024**3
    checkpoint_path: str | None = None
    max_queue_bytes: int = 256 * 1024**2
    min_run_bytes: int = 4 * 1024**2
    max_run_bytes: int = 64 * 1024**2
    batch_bytes: int = 128 * 1024**2
    linger_s: float = 0.002
    switch_bytes: int | None = None
    switch_wait_s: float = 0.02
    gc_background: bool = True
    gc_interval_s: float = 0.05
    gc_chunk_bytes: int = 16 * 1024**2
    gc_pause_s: float = 0.001
    index_tail_limit: int = 65536
    header_cache: int = 4096
