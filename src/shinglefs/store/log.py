"""The slice log of one drive: records in zones, the index, resets, checkpoints, recovery.

Where its code lives: ``SliceLog`` (here) appends records, publishes them to
the index, deletes, checkpoints and closes; it inherits the read path from
``LogReads`` (reads.py) and the zone table, streams, space accounting and
zone resets from ``LogZones`` (zones.py). Recovery is ``store/recovery.py``.

Concurrency rules (see docs/slice-log.md):

- ``io_lock`` (reentrant) serialises every change of the drive: appends,
  flushes, resets and checkpoints. The write scheduler, deletes and the GC take
  it for one batch (or one GC chunk) at a time, so they interleave but never
  write at once; sequence numbers are assigned under it. One exception: the
  scheduler's ``flush_completed`` (a storage server's FLUSH, store/zonerun.py)
  flushes the drive beside the writer, outside ``io_lock``: a drive's flush is
  thread-safe and covers every write that completed before it.
- ``_cv`` (a condition on a plain lock) guards the index, the per-zone reader
  counts and the header cache. Readers take only ``_cv``, and only to look up
  extents and register on their zones; the I/O itself runs unlocked.
- A zone is reset only with ``io_lock`` held, after a flush (so the copies or
  tombstones that made it dead are durable) and after its reader count fell to
  zero (so no reader that looked up an extent there can see new bytes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shinglefs.store.checkpoint import CheckpointArea, encode_checkpoint
from shinglefs.store.config import StoreConfig
from shinglefs.store.errors import DriveTooSmall, StoreIOError
from shinglefs.store.index import Extent
from shinglefs.store.reads import LogReads
from shinglefs.store.record import (
    BLOCK,
    FLAG_GC_COPY,
    HEADER_BLOCK,
    MAX_RECORD_PAYLOAD,
    RecordHeader,
    RecordType,
    encode_header,
    padding,
    payload_block_crcs,
    record_footprint,
)
from shinglefs.store.recovery import RecoveryReport, recover
from shinglefs.store.zones import (
    GC_STREAM,
    META_STREAM,
    MIN_ROOM,
    LogZones,
    StreamKey,
    ZoneRole,
    ZoneState,
    checkpoint_zones,
)
from shinglefs.zoned.errors import ZoneError
from shinglefs.zoned.fileio import Payload
from shinglefs.zoned.model import ZoneCondition, ZonedDrive

__all__ = [  # the zone vocabulary is re-exported: it was defined here first
    "GC_STREAM",
    "META_STREAM",
    "MIN_ROOM",
    "STORE_VERSION",
    "LogUsage",
    "LogZones",
    "SliceLog",
    "StoreConfig",
    "StreamKey",
    "ZoneRole",
    "ZoneState",
    "check_drive_size",
    "checkpoint_zones",
    "sequential_zones_needed",
]

log = logging.getLogger("shinglefs.store")

STORE_VERSION = 1


@dataclass(frozen=True, slots=True)
class LogUsage:
    """One consistent view of a log's space, taken under the index lock (``SliceLog.usage``)."""

    live_bytes_per_zone: dict[int, int]
    slices: int
    live_bytes: int
    writable_bytes: int
    zones_collecting: int


class SliceLog(LogReads):
    """Records, zones, index and checkpoints of one drive. Use ``format``/``open``."""

    def __init__(self, drive: ZonedDrive, config: StoreConfig, area: CheckpointArea) -> None:
        super().__init__(drive, config, area)
        self.recovery_report = RecoveryReport(drive=self.name)

    # ================================================================= construction
    @classmethod
    def format(cls, drive: ZonedDrive, config: StoreConfig) -> SliceLog:
        """Reset every writable sequential zone and write an empty checkpoint (twice)."""
        area = CheckpointArea(drive, drive.zone_count, path=config.checkpoint_path,
                              area_zones=_area_zones(drive))
        self = cls(drive, config, area)
        for info in drive.report_zones():
            if info.index < self.first_seq_zone:
                continue
            if info.condition in (ZoneCondition.OFFLINE, ZoneCondition.READ_ONLY):
                self.z_state[info.index] = ZoneState.BAD
                continue
            if self.wp_emulated or info.write_pointer != info.start or (
                    info.condition != ZoneCondition.EMPTY):
                self.zone_reset(info.index)
        area.write_generations(self.z_gen)
        with self.io_lock:
            self.checkpoint()
            self.checkpoint()
        return self

    @classmethod
    def open(cls, drive: ZonedDrive, config: StoreConfig) -> SliceLog:
        """Recover: load the last good checkpoint, replay the log after it, report."""
        area = CheckpointArea(drive, drive.zone_count, path=config.checkpoint_path,
                              area_zones=_area_zones(drive))
        self = cls(drive, config, area)
        with self.io_lock:
            self._recover()
        return self

    # ================================================================= appending
    def append(self, key: StreamKey, items: Sequence[tuple[int, int, Any, int]], *,
               gc: bool = False) -> list[Extent]:
        """Write data records for ``items`` = ``(slice id, offset, bytes, group)`` to a stream
        (bytes: a buffer, a sequence of buffers or a ``Payload``).

        Consecutive pieces of one slice become one record (up to 64 MiB and the
        zone's room); records that fit in the stream's zone go out as one
        vectored write. Returns the extents written, not yet in the index
        (``publish`` makes them readable). Caller holds ``io_lock``.
        """
        records = _coalesce(items, gc)
        if not records:
            return []
        total = sum(record_footprint(r[3]) for r in records)
        # A slice already begun here must be able to end here (slices stay whole
        # on one drive; failing it would lose what it holds): its pieces may
        # take one of the data streams' reserved zones.
        self._continuing = any(off > 0 for _sid, off, _data, _group in items)
        self._ensure_space(key, total)
        extents: list[Extent] = []
        ri = 0
        while ri < len(records):
            z = self._zone_for(key, records[ri][4])
            ri, written = self._append_run(z, key, records, ri, gc)
            extents.extend(written)
        return extents

    def _append_run(self, z: int, key: StreamKey, records: list[list[Any]], ri: int,
                    gc: bool) -> tuple[int, list[Extent]]:
        """Write ``records[ri:]`` that fit in zone ``z`` as one vectored write (a record
        that does not fit is split at the zone's end, except a GC copy); returns the
        index of the first record left and the extents written."""
        flags = FLAG_GC_COPY if gc else 0
        start = int(self.z_wp[z])
        pos = start
        room = self.room(z)
        iov: list[Any] = []
        written: list[Extent] = []
        fresh: list[tuple[int, RecordHeader]] = []
        seq_first = self._seq
        while ri < len(records) and room >= MIN_ROOM:
            sid, off, views, length, group = records[ri]
            take = min(length, room - HEADER_BLOCK)
            if take < length and gc:
                break  # a GC copy keeps its extent whole: continue in the next zone
            if take < length:
                take = take // BLOCK * BLOCK
                part, rest = _split_views(views, take)
                records[ri] = [sid, off + take, rest, length - take, group]
            else:
                part = views
                ri += 1
            crcs = payload_block_crcs(part, take)
            header = encode_header(RecordType.DATA, slice_id=sid, slice_offset=off,
                                   length=take, group=group, seq=self._seq, crcs=crcs,
                                   flags=flags)
            fresh.append((pos, RecordHeader(RecordType.DATA, flags, sid, off, take, group,
                                            self._seq, tuple(crcs))))
            self._seq += 1
            iov.append(header)
            iov.extend(part)
            pad = padding(take)
            if pad.nbytes:
                iov.append(pad)
            written.append(Extent(sid, off, take, pos, group))
            footprint = record_footprint(take)
            pos += footprint
            room -= footprint
        if not iov:
            self._seal(z)
            return ri, []
        self._write(z, start, iov, pos - start, key, seq_first)
        self._cache_headers(fresh)
        if gc:
            self.gc_bytes += sum(w.length for w in written)
        else:
            self.user_bytes += sum(w.length for w in written)
        return ri, written

    def _write(self, z: int, start: int, iov: list[Any], nbytes: int, key: StreamKey,
               seq_first: int) -> None:
        self._open_for_write(z, key)
        self.pinned.add(z)
        try:
            self.drive.write(z, start, iov)
        except ZoneError as exc:
            # The zone's state is unknown now: never write it again; GC may still read it.
            self._detach(z)
            self._open_groups.pop(z, None)
            self._open_reserved.pop(z, None)
            self.z_state[z] = ZoneState.BAD
            try:
                info = self.drive.zone_info(z)
                self.z_wp[z] = info.write_pointer
            except ZoneError:
                pass
            raise StoreIOError(f"write failed: {exc}", drive=self.name, zone=z, offset=start,
                               cause=exc) from exc
        self.z_wp[z] = start + nbytes
        self.device_bytes += nbytes
        self.z_lastb[z] = self.device_bytes
        self.z_lastseq[z] = self._seq - 1
        if self.room(z) < MIN_ROOM:
            self._seal(z)

    def append_meta(self, rtype: RecordType, payload: bytes, *, group: int = 0,
                    count: int = 0) -> int:
        """Write a tombstone or group-delete record on the metadata stream; returns its seq."""
        view = memoryview(payload)
        footprint = record_footprint(len(payload))
        self._ensure_space(META_STREAM, footprint)
        z = self._zone_for(META_STREAM, 0)
        if self.room(z) < footprint:
            self._seal(z)
            z = self._zone_for(META_STREAM, 0)
        start = int(self.z_wp[z])
        crcs = payload_block_crcs([view], len(payload)) if payload else []
        seq = self._seq
        header = encode_header(rtype, slice_id=count, slice_offset=0, length=len(payload),
                               group=group, seq=seq, crcs=crcs)
        self._seq += 1
        iov: list[Any] = [header]
        if payload:
            iov += [view, padding(len(payload))]
        self._write(z, start, iov, footprint, META_STREAM, seq)
        return seq

    # ================================================================= publishing
    def publish(self, extents: Sequence[Extent]) -> None:
        """Make written extents readable (index them). Caller holds ``io_lock``."""
        with self._cv:
            for e in extents:
                self.index.add(e.slice_id, e.offset, e.length, e.dev, e.group)
        self.pinned.clear()

    def relocate(self, moves: Sequence[tuple[int, int, int, int]]) -> int:
        """Switch extents ``(sid, off, old_dev, new_dev)`` that are still at old_dev; count them."""
        done = 0
        with self._cv:
            for sid, off, old, new in moves:
                if self.index.relocate(sid, off, old, new):
                    done += 1
        self.pinned.clear()
        return done

    def delete(self, slice_ids: Sequence[int]) -> int:
        """Log one tombstone record for ``slice_ids`` and drop them from the index.

        Returns how many were present. Not durable until the next flush.
        Caller holds ``io_lock``.
        """
        present = [s for s in slice_ids if self.contains(s)]
        if not present:
            return 0
        payload = np.asarray(present, dtype=np.uint64).tobytes()
        self.append_meta(RecordType.TOMBSTONE, payload, count=len(present))
        with self._cv:
            for sid in present:
                self.index.remove(sid)
        return len(present)

    def delete_group(self, group: int) -> list[int]:
        """Log a group-delete record and drop every slice with an extent in ``group``."""
        self.append_meta(RecordType.GROUP_DELETE, b"", group=group)
        with self._cv:
            removed = self.index.remove_group(group)
        return removed

    # ================================================================= checkpoints
    def checkpoint(self) -> int:
        """Flush, then write the index and zone table to the older slot; returns its size."""
        with self.io_lock:
            self.flush_drive()
            number = self.ckpt_number + 1
            covered = self._seq - 1
            with self._cv:
                columns = self.index.columns()
                labels = list(self.index.group_labels)
            columns = dict(columns)
            columns.update(z_wp=self.z_wp, z_role=self.z_role, z_group=self.z_group,
                           z_lastb=self.z_lastb, z_lastseq=self.z_lastseq, z_gen=self.z_gen)
            meta = {
                "store_version": STORE_VERSION,
                "zone_size": self.zs,
                "zone_count": self.nz,
                "groups": labels,
                "user_bytes": self.user_bytes,
                "device_bytes": self.device_bytes,
                "gc_bytes": self.gc_bytes,
                "zone_resets": self.zone_resets,
                "evictions": self.evictions,
                "checkpoint_bytes": self.checkpoint_bytes_base + self.area.bytes_written,
                "slot_covered": self.slot_covered,
            }
            parts = encode_checkpoint(number, covered, meta, columns)
            try:
                size = self.area.write_checkpoint(number, parts)
                self.area.sync()
            except ZoneError as exc:
                raise StoreIOError(f"checkpoint write failed: {exc}", drive=self.name,
                                   zone=exc.zone, offset=exc.offset, cause=exc) from exc
            self.ckpt_number = number
            self.slot_covered[number % 2] = covered
            self._last_ckpt_bytes = self.device_bytes
            return size

    @property
    def checkpoint_due(self) -> bool:
        """Enough bytes were appended since the last index checkpoint to write one."""
        return self.device_bytes - self._last_ckpt_bytes >= self.config.checkpoint_interval_bytes

    def maybe_checkpoint(self) -> None:
        if self.checkpoint_due:
            self.checkpoint()

    @property
    def checkpoint_bytes_written(self) -> int:
        return self.checkpoint_bytes_base + self.area.bytes_written

    # ================================================================= recovery
    def _recover(self) -> None:
        """Rebuild the index and zone table (``store.recovery.recover``), then write a fresh
        checkpoint so the next recovery starts from here (and from the generation table
        just read, even where a block of it was torn)."""
        self._seq = recover(self)
        self.area.write_generations(self.z_gen)
        self.checkpoint()

    # ================================================================= stats and closing
    def zones_by_condition(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.wp_emulated:
            for z in range(self.nz):
                state = self.z_state[z]
                if state == ZoneState.CONVENTIONAL:
                    name = "NOT_WP"
                elif state == ZoneState.EMPTY:
                    name = "EMPTY"
                elif state == ZoneState.ACTIVE:
                    name = "IMPLICIT_OPEN"
                elif state == ZoneState.BAD:
                    name = "OFFLINE"
                else:
                    name = "FULL" if self.room(z) < MIN_ROOM else "CLOSED"
                out[name] = out.get(name, 0) + 1
            return out
        for info in self.drive.report_zones():
            name = info.condition.name
            out[name] = out.get(name, 0) + 1
        return out

    def usage(self) -> LogUsage:
        """Live bytes (per zone and in all), slices, writable bytes and zones being collected,
        read together under the index lock; never takes ``io_lock`` (a batch in flight may
        be half counted, never waited for)."""
        with self._cv:
            live = self.index.zone_live
            return LogUsage(
                live_bytes_per_zone={int(z): int(live[z]) for z in live.nonzero()[0]},
                slices=self.index.slices,
                live_bytes=self.index.live_bytes,
                writable_bytes=self.writable_bytes(),
                zones_collecting=len(self.gc_busy),
            )

    def space(self) -> tuple[int, int]:
        """``(writable_bytes, zones_collecting)``, read together under the index lock
        (like ``usage``, without its per-zone dict)."""
        with self._cv:
            return self.writable_bytes(), len(self.gc_busy)

    def close(self) -> None:
        with self.io_lock:
            if self.closed:
                return
            try:
                self.checkpoint()
            finally:
                self.closed = True
                self.area.close()


MIN_GROUP_ZONES = 3
"""Lifetime groups a drive must be able to give a zone of their own at once ("a few")."""


def sequential_zones_needed(config: StoreConfig | None = None) -> int:
    """The fewest data zones a slice log is useful with: the GC reserve (free
    zones only GC and tombstones may take, see ``SliceLog._allocate``) plus one
    zone each for ``MIN_GROUP_ZONES`` lifetime groups."""
    cfg = config or StoreConfig()
    return max(2, cfg.gc_reserve_zones) + MIN_GROUP_ZONES


def check_drive_size(drive: str, *, zone_size: int, zone_count: int, conventional_zones: int,
                     config: StoreConfig | None = None) -> None:
    """Raise ``DriveTooSmall`` unless a drive of this geometry makes a useful slice store.

    It needs a conventional zone for index checkpoints and
    ``sequential_zones_needed`` data zones after them. Only looks at numbers:
    call it before creating anything.
    """
    reserve = max(2, (config or StoreConfig()).gc_reserve_zones)
    needed = sequential_zones_needed(config)
    ckpt = checkpoint_zones(zone_count, conventional_zones)
    data = zone_count - ckpt
    if ckpt >= 1 and data >= needed:
        return
    zone_mib = zone_size / 2**20
    least = (needed + 1) * zone_size
    raise DriveTooSmall(
        f"{zone_count} zone(s) of {zone_mib:g} MiB leave {max(data, 0)} data zone(s) after "
        f"{ckpt} for index checkpoints; a slice store needs at least {needed} ({reserve} "
        f"reserved for GC and tombstones, {MIN_GROUP_ZONES} for lifetime groups) and one "
        f"zone for checkpoints",
        drive=drive,
        hint=f"give the drive at least {needed + 1} zones ({least // 2**20} MiB with "
        f"{zone_mib:g} MiB zones)",
    )


def _area_zones(drive: ZonedDrive) -> int:
    """Zones of the checkpoint area: the conventional ones (1 % of an all-conventional drive)."""
    if drive.conventional_zones >= drive.zone_count:
        return max(1, drive.zone_count // 100)
    return drive.conventional_zones


def _split_views(views: list[memoryview], n: int) -> tuple[list[memoryview], list[memoryview]]:
    """Split a list of views after ``n`` bytes, without copying."""
    head: list[memoryview] = []
    rest: list[memoryview] = []
    left = n
    for i, v in enumerate(views):
        if left == 0:
            rest.extend(views[i:])
            break
        if v.nbytes <= left:
            head.append(v)
            left -= v.nbytes
        else:
            head.append(v[:left])
            rest.append(v[left:])
            rest.extend(views[i + 1 :])
            left = 0
            break
    return head, rest


def _coalesce(items: Sequence[tuple[int, int, Any, int]], gc: bool) -> list[list[Any]]:
    """``[sid, off, [views], length, group]`` records for ``items``: consecutive pieces of
    one slice and group merge into one record up to ``MAX_RECORD_PAYLOAD`` (GC copies
    never merge: each keeps its extent)."""
    records: list[list[Any]] = []
    for sid, off, data, group in items:
        payload = data if isinstance(data, Payload) else Payload(data)
        n = payload.nbytes
        if n == 0:
            continue
        last = records[-1] if records else None
        if (not gc and last is not None and last[0] == sid and last[1] + last[3] == off
                and last[4] == group and last[3] + n <= MAX_RECORD_PAYLOAD):
            last[2].extend(payload.views)
            last[3] += n
        else:
            records.append([sid, off, list(payload.views), n, group])
    return records
