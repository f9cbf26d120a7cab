"""Helpers for the slice-store tests: real emulated drives on sparse files, small zones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shinglefs.store import SliceStore
from shinglefs.zoned import EmulatedZonedDrive

MiB = 1024 * 1024

reopened: list[EmulatedZonedDrive] = []
"""Drives ``reopen`` and ``crash`` opened: the test closes the store it ends with,
tests/store/conftest.py closes these after it (a drive holds three descriptors)."""


def _open_again(path: str) -> EmulatedZonedDrive:
    drive = EmulatedZonedDrive.open(path)
    reopened.append(drive)
    return drive


def make_drive(path: Path, *, zone_size: int = MiB, zone_count: int = 64,
               conventional_zones: int = 2, max_open_zones: int = 8) -> EmulatedZonedDrive:
    return EmulatedZonedDrive.create(str(path), zone_size=zone_size, zone_count=zone_count,
                                     conventional_zones=conventional_zones,
                                     max_open_zones=max_open_zones)


def reopen(store: SliceStore, **config: Any) -> SliceStore:
    """Close store and drive cleanly, then open both again."""
    path = store.drive.path  # type: ignore[attr-defined]
    store.close()
    store.drive.close_drive()
    return SliceStore.open(_open_again(path), **config)


def crash(store: SliceStore, *, torn: bool = False, keep_blocks: int | None = None,
          **config: Any) -> SliceStore:
    """Cut power under a running store (unflushed writes lost), then recover."""
    drive = store.drive
    path = drive.path  # type: ignore[attr-defined]
    store.scheduler.close()
    store.collector.stop()
    drive.simulate_power_cut(torn=torn, keep_blocks=keep_blocks)  # type: ignore[attr-defined]
    store.mark_lost()
    store.slice_log.area.close()  # a checkpoint file's descriptor dies with the process too
    return SliceStore.open(_open_again(path), **config)


def payload(seed: int, n: int) -> bytes:
    """Deterministic, incompressible-looking bytes."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
