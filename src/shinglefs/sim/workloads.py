"""Synthetic workloads as traces: the fio jobs behind the published calibration figures.

Each function returns ``TraceRecord``s in the byte space of ``model`` (its own
zone size), as ``fio --zonemode=zbd --ioengine=libaio --bs=256K`` would issue
them (zonedstorage.io, "fio Examples for SMR hard-disks": 256 KiB blocks,
starting at the first sequential zone). Where the published page does not say
how a job spread its I/O, the choice here is stated in the docstring.
"""

from __future__ import annotations

import random

from shinglefs.sim.model import DriveModel
from shinglefs.zoned.model import TraceRecord

KiB = 1024
MiB = 1024 * KiB
BS = 256 * KiB


def _rec(op: str, model: DriveModel, position: int, length: int) -> TraceRecord:
    return TraceRecord(op, position // model.zone_size, position, length, 0.0)


def sequential(model: DriveModel, start_zone: int, total: int, op: str = "write",
               bs: int = BS) -> list[TraceRecord]:
    """One stream of ``total`` bytes from the start of ``start_zone``."""
    base = start_zone * model.zone_size
    return [_rec(op, model, base + off, bs) for off in range(0, total, bs)]


def interleaved_appends(model: DriveModel, start_zone: int, streams: int, per_stream: int,
                        bs: int = BS) -> list[TraceRecord]:
    """``streams`` append streams, one per zone (adjacent zones), issued round robin."""
    out = []
    for off in range(0, per_stream, bs):
        for s in range(streams):
            out.append(_rec("write", model, (start_zone + s) * model.zone_size + off, bs))
    return out


def scattered_zone_writes(model: DriveModel, first_zone: int, zones: int, count: int,
                          bs: int = BS, seed: int = 1) -> list[TraceRecord]:
    """``count`` writes, each at the write pointer of a zone drawn at random among ``zones``."""
    rng = random.Random(seed)
    wp: dict[int, int] = {}
    out = []
    for _ in range(count):
        zone = first_zone + rng.randrange(zones)
        off = wp.get(zone, 0)
        wp[zone] = off + bs
        out.append(_rec("write", model, zone * model.zone_size + off, bs))
    return out


def random_reads(model: DriveModel, first_zone: int, zones: int, count: int, bs: int = BS,
                 seed: int = 2) -> list[TraceRecord]:
    """``count`` reads of ``bs`` at random aligned offsets within ``zones`` zones."""
    rng = random.Random(seed)
    base, span = first_zone * model.zone_size, zones * model.zone_size // bs
    return [_rec("read", model, base + rng.randrange(span) * bs, bs) for _ in range(count)]


def random_small_writes(model: DriveModel, total: int, bs: int = BS, seed: int = 3,
                        ) -> list[TraceRecord]:
    """Writes of ``bs`` at random aligned offsets over the whole drive (a busy CMR-style file system)."""
    rng = random.Random(seed)
    span = model.capacity // bs
    return [_rec("write", model, rng.randrange(span) * bs, bs) for _ in range(total // bs)]


def resilver_stream(model: DriveModel, total: int, bs: int = 32 * KiB, gap: int = 64 * KiB,
                    start: int = 0) -> list[TraceRecord]:
    """A resilver-like stream: ``bs`` writes in rising order with ``gap`` bytes skipped between."""
    out, pos = [], start
    for _ in range(total // bs):
        out.append(_rec("write", model, pos, bs))
        pos += bs + gap
    return out
