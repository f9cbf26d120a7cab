"""The slice log of one drive: records in zones, the index, resets, checkpoints, recovery.

Concurrency rules (see docs/slice-log.md):

- ``io_lock`` (reentrant) serialises every change of the drive: appends,
  flushes, resets and checkpoints. The write scheduler, deletes and the GC take
  it for one batch (or one GC chunk) at a time, so they interleave but never
  write at once; sequence numbers are assigned under it.
- ``_cv`` (a condition on a plain lock) guards the index, the per-zone reader
  counts and the header cache. Readers take only ``_cv``, and only to look up
  extents and register on their zones; the I/O itself runs unlocked.
- A zone is reset only with ``io_lock`` held, after a flush (so the copies or
  tombstones that made it dead are durable) and after its reader count fell to
  zero (so no reader that looked up an extent there can see new bytes).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from shinglefs.store.checkpoint import CheckpointArea, encode_checkpoint
from shinglefs.store.config import StoreConfig
from shinglefs.store.errors import (
    ChecksumMismatch,
    DriveTooSmall,
    SliceNotFound,
    StoreFormatError,
    StoreFull,
    StoreIOError,
)
from shinglefs.store.index import SliceIndex
from shinglefs.store.record import (
    BLOCK,
    CRC_BLOCK,
    FLAG_GC_COPY,
    HEADER_BLOCK,
    MAX_RECORD_PAYLOAD,
    RecordDecodeError,
    RecordHeader,
    RecordType,
    align_up,
    decode_header,
    encode_header,
    padding,
    payload_block_crcs,
    record_footprint,
    verify_blocks,
)
from shinglefs.store.recovery import DiscardedTail, RecoveryReport
from shinglefs.zoned.errors import ZoneError
from shinglefs.zoned.fileio import Payload
from shinglefs.zoned.model import ZoneCondition, ZonedDrive, ZoneInfo, ZoneType

log = logging.getLogger("shinglefs.store")

STORE_VERSION = 1
MIN_ROOM = 2 * BLOCK  # a zone with less room than a header block plus one block is finished


class ZoneState(enum.IntEnum):
    EMPTY = 0
    ACTIVE = 1  # attached to a stream: the stream's current append zone
    SEALED = 2  # full, finished, or detached while partly written
    BAD = 3  # READ_ONLY/OFFLINE or failed writes: never written or reset by the store
    CONVENTIONAL = 4


class ZoneRole(enum.IntEnum):
    NONE = 0
    DATA = 1
    GC = 2
    META = 3


GC_STREAM = "gc"
META_STREAM = "meta"
StreamKey = Any  # ("g", group label) | GC_STREAM | META_STREAM


class SliceLog:
    """Records, zones, index and checkpoints of one drive. Use ``format``/``open``."""

    def __init__(self, drive: ZonedDrive, config: StoreConfig, area: CheckpointArea) -> None:
        self.drive = drive
        self.name = drive.name
        self.config = config
        self.area = area
        self.zs = drive.zone_size
        self.nz = drive.zone_count
        # A flash/CMR drive (every zone conventional): the store keeps the write
        # pointers itself, in the first 1 % of zones goes the checkpoint area.
        self.wp_emulated = drive.conventional_zones >= drive.zone_count
        self.first_seq_zone = checkpoint_zones(self.nz, drive.conventional_zones)
        self.seq_zones = self.nz - self.first_seq_zone
        self.io_lock = threading.RLock()
        self._cv = threading.Condition(threading.Lock())
        self.index = SliceIndex(self.zs, self.nz, tail_limit=config.index_tail_limit)
        self.z_state = np.zeros(self.nz, np.int8)
        self.z_state[: self.first_seq_zone] = ZoneState.CONVENTIONAL
        self.z_wp = np.arange(self.nz, dtype=np.int64) * self.zs
        self.z_role = np.zeros(self.nz, np.uint8)
        self.z_group = np.zeros(self.nz, np.uint64)
        self.z_lastb = np.zeros(self.nz, np.int64)
        self.z_lastseq = np.zeros(self.nz, np.int64)
        self.z_gen = np.zeros(self.nz, np.uint32)
        self._readers = np.zeros(self.nz, np.int32)
        self._streams: dict[StreamKey, int] = {}
        self._zone_stream: dict[int, StreamKey] = {}
        self._open_groups: OrderedDict[int, StreamKey] = OrderedDict()
        self._open_reserved: OrderedDict[int, StreamKey] = OrderedDict()
        self.gc_busy: set[int] = set()
        self.pinned: set[int] = set()  # zones written by an append not yet published
        self.gc_failed: set[int] = set()
        self._headers: OrderedDict[int, RecordHeader] = OrderedDict()
        self._seq = 1
        self.ckpt_number = 0
        self._slot_covered = [0, 0]
        self._last_ckpt_bytes = 0
        self.user_bytes = 0
        self.device_bytes = 0
        self.gc_bytes = 0
        self.zone_resets = 0
        self.evictions = 0
        self.borrowed_zones = 0  # zones a group took over from another (no empty zone left)
        self._continuing = False  # the append in progress continues a slice (``append``)
        self.checkpoint_bytes_base = 0
        self.collector: Any = None  # set by the store: ZoneCollector for inline GC
        self.recovery_report = RecoveryReport(drive=self.name)
        self._tls = threading.local()
        # Optional drive calls (the emulated drive has them): one read into several
        # buffers; a read-ahead hint for sequential scans.
        self._readv: Any = getattr(drive, "readv", None)
        self._prefetch: Any = getattr(drive, "prefetch", None)
        self.closed = False

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
                self._zone_reset(info.index)
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

    # ================================================================= small helpers
    def _drive_call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ZoneError as exc:
            raise StoreIOError(str(exc), drive=self.name, zone=getattr(exc, "zone", None),
                               offset=getattr(exc, "offset", None), cause=exc) from exc

    # Zone commands; on a drive without write pointers the store emulates them.
    def _zone_reset(self, z: int) -> None:
        if self.wp_emulated:
            self._drive_call(self.drive.discard, self.zone_start(z), self.zs)  # type: ignore[attr-defined]
        else:
            self._drive_call(self.drive.reset, z)

    def _zone_finish(self, z: int) -> None:
        if not self.wp_emulated:
            self.drive.finish(z)

    def _zone_close(self, z: int) -> None:
        if not self.wp_emulated:
            self.drive.close(z)

    def zone_start(self, z: int) -> int:
        return z * self.zs

    def room(self, z: int) -> int:
        return (z + 1) * self.zs - int(self.z_wp[z])

    def free_zones(self) -> int:
        return int((self.z_state == ZoneState.EMPTY).sum())

    def flush_drive(self) -> None:
        self._drive_call(self.drive.flush)

    @property
    def next_seq(self) -> int:
        return self._seq

    # ================================================================= streams and zones
    def _detach(self, z: int) -> None:
        key = self._zone_stream.pop(z, None)
        if key is not None and self._streams.get(key) == z:
            del self._streams[key]

    def _seal(self, z: int) -> None:
        """The zone takes no more writes: finish it when it has room left; drop it from streams."""
        self._detach(z)
        self._open_groups.pop(z, None)
        self._open_reserved.pop(z, None)
        if self.z_state[z] in (ZoneState.ACTIVE, ZoneState.SEALED):
            if self.room(z) > 0 and self.z_wp[z] > self.zone_start(z):
                try:
                    self._zone_finish(z)
                except ZoneError as exc:
                    log.warning("finishing zone %d of %s failed: %s", z, self.name, exc)
            self.z_state[z] = ZoneState.SEALED

    def _attach(self, z: int, key: StreamKey, group: int) -> None:
        self._streams[key] = z
        self._zone_stream[z] = key
        self.z_state[z] = ZoneState.ACTIVE
        if key == GC_STREAM:
            self.z_role[z] = ZoneRole.GC
        elif key == META_STREAM:
            self.z_role[z] = ZoneRole.META
        else:
            self.z_role[z] = ZoneRole.DATA
            self.z_group[z] = group

    def detach_idle(self, z: int) -> None:
        """Take a partly written zone away from its stream (GC victim, dead group zone)."""
        self._detach(z)
        if z in self._open_groups or z in self._open_reserved:
            self._open_groups.pop(z, None)
            self._open_reserved.pop(z, None)
            try:
                self._zone_close(z)
            except ZoneError:
                pass
        if self.z_state[z] == ZoneState.ACTIVE:
            self.z_state[z] = ZoneState.SEALED

    def _group_open_limit(self) -> int:
        if not self.drive.max_open_zones:
            return 1 << 30  # no limit
        return max(1, self.drive.max_open_zones - self.config.open_zone_reserve)

    def _open_for_write(self, z: int, key: StreamKey) -> None:
        """Count ``z`` as open; evict the least recently written group zone when over the limit.

        Policy: group streams share ``max_open_zones - open_zone_reserve`` open
        zones; the GC and metadata streams use the reserve. When a group needs
        a zone opened and the group share is used up, the group zone written
        least recently is closed (it stays its group's append zone, CLOSED, and
        reopens when that group writes again). Each such close counts as a
        ``group_zone_evictions``.
        """
        table = self._open_reserved if key in (GC_STREAM, META_STREAM) else self._open_groups
        if z in table:
            table.move_to_end(z)
            return
        if table is self._open_groups:
            while len(self._open_groups) >= self._group_open_limit():
                victim, _ = self._open_groups.popitem(last=False)
                try:
                    self._zone_close(victim)
                except ZoneError as exc:
                    log.warning("closing zone %d of %s failed: %s", victim, self.name, exc)
                self.evictions += 1
        table[z] = key

    def _allocate(self, key: StreamKey, zones_needed: int = 1, *, collect: bool = True) -> int:
        """An EMPTY zone; reclaims dead zones, then runs GC, before raising StoreFull.

        Reserves: data streams leave ``gc_reserve_zones`` free zones (at least
        2), the metadata stream leaves one (for GC), the GC stream may take the
        last zone -- so deletes and GC can still make room on a full drive.
        """
        privileged = key in (GC_STREAM, META_STREAM)
        if key == GC_STREAM:
            reserve = 0
        elif key == META_STREAM:
            reserve = 1
        else:
            reserve = max(2, self.config.gc_reserve_zones) - (1 if self._continuing else 0)
        for _attempt in range(64):
            free = np.flatnonzero(self.z_state == ZoneState.EMPTY)
            if free.size >= reserve + zones_needed:
                return int(free[0])
            if self.reclaim_dead_zones():
                continue
            if (collect and not privileged and self.collector is not None
                    and self.collector.collect_for_space()):
                continue
            break
        raise StoreFull(zones_needed * self.zs, drive=self.name, free_zones=self.free_zones(),
                        live_bytes=self.index.live_bytes)

    def _zone_for(self, key: StreamKey, group: int) -> int:
        z = self._streams.get(key)
        if z is not None:
            if self.room(z) >= MIN_ROOM:
                return z
            self._seal(z)
        # Out of empty zones, a group takes over the room of another group's
        # partly written zone (free; the lifetimes mix there and GC sorts them
        # out if it ever copies that zone) before GC copies anything to make
        # an empty one.
        try:
            z = self._allocate(key, collect=False)
        except StoreFull:
            borrowed = self._borrowable(key)
            if borrowed is None:
                z = self._allocate(key)
            else:
                z = borrowed
                log.info("%s: no empty zone for %s; writing into zone %d of another group",
                         self.name, key, z)
                self.borrowed_zones += 1
                self._detach(z)
        self._attach(z, key, group)
        return z

    def _borrowable(self, key: StreamKey) -> int | None:
        """The data zone with the most room that ``key`` may take over when no
        empty zone is left (never for GC or metadata: they have reserves);
        last, the GC stream's own zone (GC allocates another from its reserve)."""
        if key in (GC_STREAM, META_STREAM):
            return None
        own = self._streams.get(key)
        rooms = [(self.room(z), z) for z in self._data_zones_with_room() if z != own]
        if not rooms:
            rooms = [(self.room(z), z) for z in self._gc_zone_to_lend()]
        return max(rooms)[1] if rooms else None

    def _gc_zone_to_lend(self) -> list[int]:
        gc_zone = self._streams.get(GC_STREAM)
        if gc_zone is None or gc_zone in self.gc_busy or self.room(gc_zone) < MIN_ROOM:
            return []
        return [gc_zone]

    def _data_zones_with_room(self) -> list[int]:
        """Partly written zones a data stream may take over: other groups' append
        zones (ACTIVE; a sealed zone with room was finished and takes no more),
        never one GC is copying."""
        active = (self.z_state == ZoneState.ACTIVE) & (self.z_role == ZoneRole.DATA)
        return [int(z) for z in np.flatnonzero(active & (self.room_per_zone() >= MIN_ROOM))
                if int(z) not in self.gc_failed and int(z) not in self.gc_busy]

    def room_per_zone(self) -> np.ndarray:
        """Unwritten bytes of every zone (0 for conventional ones)."""
        starts = np.arange(self.nz, dtype=np.int64) * self.zs
        room = starts + self.zs - self.z_wp.astype(np.int64)
        room[: self.first_seq_zone] = 0
        return room

    def writable_bytes(self) -> int:
        """Bytes data streams can still append, what ``statfs`` reports and
        writers reserve against (caller holds ``_cv`` or ``io_lock``): empty
        zones beyond the GC reserve, the room of partly written zones a group
        may take over, and the dead bytes of written zones, which GC turns back
        into empty zones; less a margin for zone granularity."""
        reserve = max(2, self.config.gc_reserve_zones)
        # Not clamped at 0: when a continuing slice (or GC) has taken a reserve
        # zone, its room counts among the lenders below but is not writable by
        # anyone else, so the reserve's deficit is taken off again.
        empty = (self.free_zones() - reserve) * self.zs
        lenders = self._data_zones_with_room() + self._gc_zone_to_lend()
        room = sum(self.room(z) for z in lenders)
        written = self.z_state[self.first_seq_zone:] != ZoneState.EMPTY
        used = (self.z_wp.astype(np.int64)[self.first_seq_zone:]
                - np.arange(self.first_seq_zone, self.nz, dtype=np.int64) * self.zs)
        usable = written & (self.z_state[self.first_seq_zone:] != ZoneState.BAD)
        dead = int(used[usable].sum()) - int(self.index.live_bytes)
        # What zone granularity costs at the end (the tails of zones GC seals,
        # the GC stream's own zone, a zone being collected): measured at about
        # one zone a drive when filling 4-8 GiB drives; kept back so that a
        # write accepted against this figure is also stored.
        margin = self.zs + self.seq_zones * self.zs // 50
        return max(0, empty + room + max(0, dead) - margin)

    def _ensure_space(self, key: StreamKey, footprint: int) -> None:
        """Check (reclaiming or collecting if need be) that ``footprint`` bytes fit, before writing."""
        z = self._streams.get(key)
        room = self.room(z) if z is not None and self.room(z) >= MIN_ROOM else 0
        if footprint <= room:
            return
        # Each zone switch may cost one extra header block.
        per_zone = self.zs - HEADER_BLOCK
        zones = -(-(footprint - room) // per_zone)
        try:
            self._allocate(key, zones_needed=zones, collect=False)
        except StoreFull:
            reserve = max(2, self.config.gc_reserve_zones) - (1 if self._continuing else 0)
            empty = max(0, self.free_zones() - reserve) * per_zone
            borrowable = sum(max(0, self.room(b) - HEADER_BLOCK)
                             for b in self._data_zones_with_room() + self._gc_zone_to_lend()
                             if b != z)
            if key in (GC_STREAM, META_STREAM) or room + empty + borrowable < footprint:
                self._allocate(key, zones_needed=zones)  # GC makes room, or StoreFull

    # ================================================================= appending
    def append(self, key: StreamKey, items: Sequence[tuple[int, int, Any, int]], *,
               gc: bool = False) -> list[tuple[int, int, int, int, int]]:
        """Write data records for ``items`` = ``(slice id, offset, bytes, group)`` to a stream
        (bytes: a buffer, a sequence of buffers or a ``Payload``).

        Consecutive pieces of one slice become one record (up to 64 MiB and the
        zone's room); records that fit in the stream's zone go out as one
        vectored write. Returns the extents written ``(sid, off, len, dev,
        group)``, not yet in the index. Caller holds ``io_lock``.
        """
        records: list[list[Any]] = []  # [sid, off, [views], length, group]
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
        if not records:
            return []
        total = sum(record_footprint(r[3]) for r in records)
        # A slice already begun here must be able to end here (slices stay whole
        # on one drive; failing it would lose what it holds): its pieces may
        # take one of the data streams' reserved zones.
        self._continuing = any(off > 0 for _sid, off, _data, _group in items)
        self._ensure_space(key, total)
        flags = FLAG_GC_COPY if gc else 0
        extents: list[tuple[int, int, int, int, int]] = []
        ri = 0
        while ri < len(records):
            z = self._zone_for(key, records[ri][4])
            start = int(self.z_wp[z])
            pos = start
            room = self.room(z)
            iov: list[Any] = []
            written: list[tuple[int, int, int, int, int]] = []
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
                written.append((sid, off, take, pos, group))
                footprint = record_footprint(take)
                pos += footprint
                room -= footprint
            if not iov:
                self._seal(z)
                continue
            self._write(z, start, iov, pos - start, key, seq_first)
            self._cache_headers(fresh)
            if gc:
                self.gc_bytes += sum(w[2] for w in written)
            else:
                self.user_bytes += sum(w[2] for w in written)
            extents.extend(written)
        return extents

    def _cache_headers(self, fresh: list[tuple[int, RecordHeader]]) -> None:
        """Remember the headers just written: reads of fresh data skip the header block read."""
        limit = self.config.header_cache
        with self._cv:
            for dev, header in fresh[-limit:]:
                self._headers[dev] = header
            while len(self._headers) > limit:
                self._headers.popitem(last=False)

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
    def publish(self, extents: Sequence[tuple[int, int, int, int, int]]) -> None:
        """Make written extents readable (index them). Caller holds ``io_lock``."""
        with self._cv:
            for sid, off, length, dev, group in extents:
                self.index.add(sid, off, length, dev, group)
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

    # ================================================================= reading
    def contains(self, sid: int) -> bool:
        with self._cv:
            return self.index.contains(sid)

    def length(self, sid: int) -> int:
        with self._cv:
            n = self.index.length(sid)
        if n is None:
            raise SliceNotFound(sid, drive=self.name)
        return n

    def slice_ids(self) -> Iterator[int]:
        with self._cv:
            ids = list(self.index.slice_ids())
        return iter(ids)

    def _scratch(self, n: int) -> memoryview:
        buf = getattr(self._tls, "buf", None)
        if buf is None or len(buf) < n:
            buf = bytearray(max(n, CRC_BLOCK + HEADER_BLOCK))
            self._tls.buf = buf
        return memoryview(buf)[:n]

    def readinto(self, sid: int, offset: int, dest: memoryview) -> int:
        """Fill ``dest`` from the slice at ``offset``; returns bytes read (short at the end).

        Every byte returned was verified against its record's block crc.
        Raises SliceNotFound, ChecksumMismatch (``dest`` is then zeroed) or
        StoreIOError.
        """
        with self._cv:
            extents = self.index.extents(sid)
            if not extents:
                raise SliceNotFound(sid, drive=self.name)
            end = extents[-1][0] + extents[-1][1]
            n = max(0, min(dest.nbytes, end - offset))
            chosen = [e for e in extents if e[0] < offset + n and e[0] + e[1] > offset]
            zones = [e[2] // self.zs for e in chosen]
            for z in zones:
                self._readers[z] += 1
        try:
            for e_off, e_len, dev in chosen:
                a = max(offset, e_off) - e_off
                b = min(offset + n, e_off + e_len) - e_off
                self._read_extent(sid, e_off, e_len, dev, a, b,
                                  dest[a + e_off - offset : b + e_off - offset])
        except ChecksumMismatch:
            dest[:n] = bytes(n)
            raise
        finally:
            with self._cv:
                for z in zones:
                    self._readers[z] -= 1
                self._cv.notify_all()
        return n

    def prefetch(self, sid: int, offset: int, length: int) -> None:
        """Hint the drive that ``[offset, offset + length)`` of a slice is read
        soon (the records' spans; ``drive.prefetch``, e.g. ``WILLNEED``).
        Returns at once; an unknown slice or a drive without hints is ignored."""
        if self._prefetch is None or length <= 0:
            return
        with self._cv:
            extents = self.index.extents(sid) or []
        end = offset + length
        for e_off, e_len, dev in extents:
            a = max(offset, e_off) - e_off
            b = min(end, e_off + e_len) - e_off
            if a < b:
                lo = a // BLOCK * BLOCK  # whole blocks; the header block with the first
                self._prefetch(dev + (0 if lo == 0 else HEADER_BLOCK + lo),
                               align_up(b) - lo + (HEADER_BLOCK if lo == 0 else 0))

    def _cached_header(self, dev: int) -> RecordHeader | None:
        with self._cv:
            header = self._headers.get(dev)
            if header is not None:
                self._headers.move_to_end(dev)
        return header

    def _checked_header(self, sid: int, e_off: int, e_len: int, dev: int,
                        header: RecordHeader | None, block: memoryview | None) -> RecordHeader:
        """``header`` (cached) or the one decoded from ``block``, checked against the index."""
        if header is None:
            assert block is not None
            try:
                header = decode_header(block)
            except RecordDecodeError as exc:
                raise ChecksumMismatch(drive=self.name, zone=dev // self.zs, offset=dev,
                                       detail=f"record header: {exc}", slice_id=sid) from None
            with self._cv:
                self._headers[dev] = header
                if len(self._headers) > self.config.header_cache:
                    self._headers.popitem(last=False)
        if (header.type != RecordType.DATA or header.slice_id != sid
                or header.slice_offset != e_off or header.length != e_len):
            with self._cv:
                self._headers.pop(dev, None)
            raise ChecksumMismatch(drive=self.name, zone=dev // self.zs, offset=dev,
                                   detail="record header does not match the index", slice_id=sid)
        return header

    def _header(self, sid: int, e_off: int, e_len: int, dev: int) -> RecordHeader:
        header = self._cached_header(dev)
        block = None
        if header is None:
            block = self._scratch(HEADER_BLOCK)
            self._read_raw(dev, block)
        return self._checked_header(sid, e_off, e_len, dev, header, block)

    def _read_raw(self, pos: int, view: memoryview) -> None:
        try:
            self.drive.readinto(pos, view)
        except ZoneError as exc:
            raise StoreIOError(f"read failed: {exc}", drive=self.name, zone=pos // self.zs,
                               offset=pos, cause=exc) from exc

    def _read_raw_v(self, pos: int, views: list[memoryview]) -> None:
        """Read ``views`` back to back from ``pos``: one vectored read where the drive has one."""
        readv = self._readv
        if readv is None:
            for view in views:
                self._read_raw(pos, view)
                pos += view.nbytes
            return
        try:
            readv(pos, views)
        except ZoneError as exc:
            raise StoreIOError(f"read failed: {exc}", drive=self.name, zone=pos // self.zs,
                               offset=pos, cause=exc) from exc

    def _read_extent(self, sid: int, e_off: int, e_len: int, dev: int, a: int, b: int,
                     dest: memoryview) -> None:
        """Payload bytes ``[a, b)`` of the record at ``dev`` into ``dest``, verified.

        The whole crc blocks of the range go straight into ``dest`` in one
        read and are verified with one crc call per 256 KiB block. A range that
        starts at the payload's start reads the header block in the same
        (vectored) read: no separate 4 KiB read when the header is not cached,
        and one contiguous request per record either way, so a sequential scan
        of records reaches the drive as sequential reads. The partial crc
        blocks at the range's edges go through a scratch buffer.
        """
        header = self._cached_header(dev)
        payload = dev + HEADER_BLOCK
        first_full = -(-a // CRC_BLOCK)
        last_full = b // CRC_BLOCK
        if b == e_len and e_len % BLOCK == 0:
            last_full = -(-b // CRC_BLOCK)  # the record's short last block reads in place too
        if first_full < last_full:
            lo = first_full * CRC_BLOCK
            hi = min(last_full * CRC_BLOCK, e_len)
            view = dest[lo - a : hi - a]
            if lo == 0:
                # Header block and payload in one read, even when the header is cached:
                # the drive then sees one contiguous request per record, as a raw read would.
                block = self._scratch(HEADER_BLOCK)
                self._read_raw_v(dev, [block, view])
                header = self._checked_header(sid, e_off, e_len, dev, header, block)
            else:
                header = self._header(sid, e_off, e_len, dev)
                self._read_raw(payload + lo, view)
            if hi == e_len:
                self._read_ahead(dev, lo, e_len)
            bad = verify_blocks(header, view, first_full)
            if bad is not None:
                raise ChecksumMismatch(drive=self.name, zone=dev // self.zs,
                                       offset=payload + bad, detail="payload block crc",
                                       slice_id=sid)
            edges = []
            if a < lo:
                edges.append((a, lo))
            if hi < b:
                edges.append((hi, b))
        else:
            edges = [(a, b)]
        if not edges:
            return
        if header is None:
            header = self._header(sid, e_off, e_len, dev)
        for x, y in edges:
            blk = x // CRC_BLOCK
            while x < y:
                lo = blk * CRC_BLOCK
                hi = min(lo + CRC_BLOCK, e_len)
                scratch = self._scratch(align_up(hi - lo))
                self._read_raw(payload + lo, scratch)
                if verify_blocks(header, scratch[: hi - lo], blk) is not None:
                    raise ChecksumMismatch(drive=self.name, zone=dev // self.zs,
                                           offset=payload + lo, detail="payload block crc",
                                           slice_id=sid)
                take_hi = min(y, hi)
                dest[x - a : take_hi - a] = scratch[x - lo : take_hi - lo]
                x = take_hi
                blk += 1

    def _read_ahead(self, dev: int, lo: int, e_len: int) -> None:
        """Sequential scans: hint the drive to fetch the next record while this one is verified.

        A thread whose read runs to the end of a record, and whose previous
        read ended exactly where this record starts, is scanning the log in
        order (slices written one after another, read back one after
        another). For it, the next record's span (assumed as long as this one,
        never past the zone's write pointer) is prefetched before this
        record's crcs are computed, so the disk works while the CPU verifies.
        Random reads never trigger it.
        """
        end = dev + record_footprint(e_len)
        if self._prefetch is not None and lo == 0 and getattr(self._tls, "seq_end", -1) == dev:
            z = dev // self.zs
            n = min(end - dev, int(self.z_wp[z]) - end, (z + 1) * self.zs - end)
            if n > 0:
                self._prefetch(end, n)
        self._tls.seq_end = end

    def read_extent(self, sid: int, e_off: int, e_len: int, dev: int) -> bytearray:
        """A whole extent's payload, verified (for GC copies)."""
        buf = bytearray(e_len)
        self._read_extent(sid, e_off, e_len, dev, 0, e_len, memoryview(buf))
        return buf

    def live_extents(self, z: int) -> list[tuple[int, int, int, int, int]]:
        """``(sid, off, len, dev, group label)`` of the live extents in zone ``z``."""
        with self._cv:
            return self.index.extents_in_zone(z)

    # ================================================================= reclaiming
    def reset_zones(self, zones: Sequence[int]) -> None:
        """Reset zones whose bytes are all dead. Caller holds ``io_lock``.

        Order: flush (what made them dead is durable), wait for readers, bump
        and persist their generations, reset.
        """
        zones = [z for z in zones if self.z_state[z] in (ZoneState.ACTIVE, ZoneState.SEALED)]
        if not zones:
            return
        self.flush_drive()
        with self._cv:
            while any(self._readers[z] for z in zones):
                self._cv.wait(0.1)
            self._headers.clear()
        for z in zones:
            self.z_gen[z] += 1
        try:
            self.area.write_generations(self.z_gen, list(zones))
            self.area.sync()
        except ZoneError as exc:
            raise StoreIOError(f"generation table write failed: {exc}", drive=self.name,
                               zone=exc.zone, offset=exc.offset, cause=exc) from exc
        for z in zones:
            self.detach_idle(z)
            self._zone_reset(z)
            self.z_state[z] = ZoneState.EMPTY
            self.z_wp[z] = self.zone_start(z)
            self.z_role[z] = ZoneRole.NONE
            self.z_group[z] = 0
            self.gc_failed.discard(z)
            self.zone_resets += 1

    def dead_zones(self) -> list[int]:
        """Written zones holding nothing live (metadata zones: once two checkpoints cover them)."""
        with self._cv:
            live = self.index.zone_live.copy()
        written = self.z_wp > np.arange(self.nz, dtype=np.int64) * self.zs
        cand = np.flatnonzero(
            written & (live == 0)
            & ((self.z_state == ZoneState.SEALED) | (self.z_state == ZoneState.ACTIVE)))
        covered = min(self._slot_covered)
        out = []
        for z in cand.tolist():
            if z in self.gc_busy or z in self.pinned:
                continue
            role = self.z_role[z]
            if role == ZoneRole.META and (self.z_lastseq[z] > covered
                                          or self._streams.get(META_STREAM) == z):
                continue
            out.append(z)
        return out

    def reclaim_dead_zones(self) -> int:
        """Reset every dead zone without copying a byte; returns how many. Takes ``io_lock``."""
        with self.io_lock:
            zones = self.dead_zones()
            if zones:
                self.reset_zones(zones)
            return len(zones)

    def meta_zones_awaiting_checkpoint(self) -> int:
        covered = min(self._slot_covered)
        sealed_meta = (self.z_role == ZoneRole.META) & (self.z_state == ZoneState.SEALED)
        return int((sealed_meta & (self.z_lastseq > covered)).sum())

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
                "slot_covered": self._slot_covered,
            }
            parts = encode_checkpoint(number, covered, meta, columns)
            try:
                size = self.area.write_checkpoint(number, parts)
                self.area.sync()
            except ZoneError as exc:
                raise StoreIOError(f"checkpoint write failed: {exc}", drive=self.name,
                                   zone=exc.zone, offset=exc.offset, cause=exc) from exc
            self.ckpt_number = number
            self._slot_covered[number % 2] = covered
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
        t0 = time.perf_counter()
        report = self.recovery_report
        ckpt, notes = self.area.load_best()
        report.notes.extend(notes)
        if ckpt is None:
            raise StoreFormatError("no valid index checkpoint: not a slice store, or both "
                                   "checkpoint slots are corrupt", drive=self.name,
                                   hint="check the drive path; a drive is made by `shinglefs format`")
        meta = ckpt.meta
        if meta.get("zone_size") != self.zs or meta.get("zone_count") != self.nz:
            raise StoreFormatError("checkpoint geometry does not match the drive",
                                   drive=self.name)
        cols = ckpt.columns
        self.index.load_columns({k: cols[k] for k in ("sid", "off", "len", "dev", "grp")},
                                meta["groups"])
        ck_wp = cols["z_wp"].astype(np.int64)
        self.z_role[:] = cols["z_role"]
        self.z_group[:] = cols["z_group"]
        self.z_lastb[:] = cols["z_lastb"]
        self.z_lastseq[:] = cols["z_lastseq"]
        ck_gen = cols["z_gen"].astype(np.uint32)
        self.user_bytes = meta["user_bytes"]
        self.device_bytes = meta["device_bytes"]
        self.gc_bytes = meta["gc_bytes"]
        self.zone_resets = meta["zone_resets"]
        self.evictions = meta["evictions"]
        self.checkpoint_bytes_base = meta["checkpoint_bytes"]
        self.ckpt_number = ckpt.number
        self._slot_covered = [ckpt.covered_seq, ckpt.covered_seq]
        for number, covered in self.area.slot_numbers():
            self._slot_covered[number % 2] = covered
        self._slot_covered = [min(c, ckpt.covered_seq) for c in self._slot_covered]
        covered = ckpt.covered_seq
        report.checkpoint_number = ckpt.number
        report.checkpoint_seq = covered
        gens, valid = self.area.read_generations()
        self.z_gen[:] = np.where(valid, gens, ck_gen)
        bad_blocks = int((~valid).sum())
        if bad_blocks:
            report.notes.append(f"{bad_blocks} zone generation entries unreadable: those zones "
                                "were scanned from their start")

        infos = self._drive_call(self.drive.report_zones)
        found: list[tuple[int, int, RecordHeader, bytes | None]] = []  # (seq, dev, header, ids)
        for info in infos:
            z = info.index
            if z < self.first_seq_zone:
                continue
            start = info.start
            if self.wp_emulated:
                # No write pointer: scan to the first invalid record (zeros end the log).
                info = ZoneInfo(z, start, self.zs, self.zs, start + self.zs,
                                ZoneType.SEQUENTIAL_WRITE_REQUIRED, ZoneCondition.CLOSED)
            self.z_wp[z] = info.write_pointer
            if info.condition == ZoneCondition.OFFLINE:
                self.z_state[z] = ZoneState.BAD
                if self.index.zone_live[z]:
                    report.notes.append(f"zone {z} is offline: {int(self.index.zone_live[z])} "
                                        "live bytes cannot be read")
                continue
            reset_since = (not valid[z]) or gens[z] != ck_gen[z]
            scan_from = start if reset_since else int(ck_wp[z])
            if reset_since:
                self.z_role[z] = ZoneRole.NONE
            if self.wp_emulated:
                self.z_wp[z] = scan_from  # until the scan finds records
            if info.write_pointer < scan_from:
                report.notes.append(
                    f"zone {z}: write pointer {info.write_pointer} is behind the checkpoint's "
                    f"{scan_from}; its newer records are lost")
                scan_from = info.write_pointer
            if info.write_pointer > scan_from:
                report.zones_scanned += 1
                self._scan_zone(z, scan_from, info.write_pointer, found, report)
            if info.condition == ZoneCondition.READ_ONLY:
                self.z_state[z] = ZoneState.BAD
            elif self.z_wp[z] == start:
                self.z_state[z] = ZoneState.EMPTY
            else:
                self.z_state[z] = ZoneState.SEALED
            if info.condition.is_open:
                try:
                    self._zone_close(z)
                except ZoneError:
                    pass

        found.sort(key=lambda f: f[0])
        max_seq = covered
        # Extents that do not continue what the index knows of their slice yet:
        # GC copies whose originals were in a zone collected (reset) since the
        # checkpoint, and records that follow such copies. Copies carry newer
        # sequence numbers than what they copied, so a slice's extents arrive
        # out of offset order; they are added once the pass has seen them all.
        adopted: dict[int, list[tuple[int, int, int, int]]] = {}
        for seq, dev, header, ids in found:
            max_seq = max(max_seq, seq)
            z = dev // self.zs
            self.z_lastseq[z] = max(int(self.z_lastseq[z]), seq)
            if seq <= covered:
                continue
            self.device_bytes += header.footprint
            self.z_lastb[z] = self.device_bytes
            report.records_replayed += 1
            report.bytes_replayed += header.length
            if header.type == RecordType.DATA:
                if header.is_gc_copy:
                    self.gc_bytes += header.length
                    if not self.index.relocate(header.slice_id, header.slice_offset, None, dev):
                        adopted.setdefault(header.slice_id, []).append(
                            (header.slice_offset, header.length, dev, header.group))
                    continue
                self.user_bytes += header.length
                current = self.index.length(header.slice_id) or 0
                if header.slice_offset < current:
                    # A piece rewritten after a failed write: the newer record wins.
                    self.index.truncate(header.slice_id, header.slice_offset)
                    current = self.index.length(header.slice_id) or 0
                if header.slice_offset != current:
                    adopted.setdefault(header.slice_id, []).append(
                        (header.slice_offset, header.length, dev, header.group))
                    continue
                self.index.add(header.slice_id, header.slice_offset, header.length, dev,
                               header.group)
            elif header.type == RecordType.TOMBSTONE and ids is not None:
                for sid in np.frombuffer(ids, np.uint64).tolist():
                    self.index.remove(sid)
                    adopted.pop(sid, None)
            elif header.type == RecordType.GROUP_DELETE:
                self.index.remove_group(header.group)
                for sid in [s for s, ext in adopted.items() if ext[0][3] == header.group]:
                    del adopted[sid]
        self._adopt_gc_copies(adopted, report)
        self._seq = max_seq + 1
        self.zone_resets += int(np.where(valid, (gens - ck_gen).astype(np.int64), 0).sum())
        self._reattach_streams()
        report.seconds = time.perf_counter() - t0
        level = logging.WARNING if report.discarded or report.records_skipped else logging.INFO
        log.log(level, "recovery: %s", report.summary())
        # A fresh checkpoint makes the next recovery start from here (and from the
        # generation table just read, even where a block of it was torn).
        self.area.write_generations(self.z_gen)
        self.checkpoint()

    def _adopt_gc_copies(self, adopted: dict[int, list[tuple[int, int, int, int]]],
                         report: RecoveryReport) -> None:
        """Index the extents set aside by the replay, in offset order: what
        continues each slice is added, the rest is reported and dropped."""
        for sid, extents in adopted.items():
            for off, length, dev, group in sorted(extents):
                current = self.index.length(sid) or 0
                if off < current:
                    continue  # copied twice (a later collection): one is enough
                if off != current:
                    report.records_skipped += 1
                    report.notes.append(f"slice {sid:#x}: record at offset {off} (zone "
                                        f"{dev // self.zs}) does not continue the slice; "
                                        "dropped")
                    break
                self.index.add(sid, off, length, dev, group)

    def _scan_zone(self, z: int, pos: int, wp: int,
                   found: list[tuple[int, int, RecordHeader, bytes | None]],
                   report: RecoveryReport) -> None:
        head = bytearray(HEADER_BLOCK)
        first = pos
        while pos < wp:
            reason = None
            header = None
            try:
                self._read_raw(pos, memoryview(head))
                header = decode_header(head)
            except RecordDecodeError as exc:
                reason = f"record header: {exc}"
            except StoreIOError as exc:
                reason = f"read error: {exc}"
            if header is not None:
                if pos + header.footprint > wp:
                    reason = "record runs past the write pointer (torn write)"
                else:
                    buf = bytearray(align_up(header.length))
                    view = memoryview(buf)
                    try:
                        self._read_raw(pos + HEADER_BLOCK, view)
                        bad = verify_blocks(header, view[: header.length], 0)
                        if bad is not None:
                            reason = f"payload crc mismatch at payload byte {bad}"
                    except StoreIOError as exc:
                        reason = f"read error: {exc}"
            if reason is not None and self.wp_emulated:
                self._end_emulated_zone(z, pos, reason, header, report)
                return
            if reason is not None:
                report.discarded.append(DiscardedTail(z, pos, wp - pos, reason))
                log.warning("recovery: zone %d of %s: discarding %d bytes from %d: %s",
                            z, self.name, wp - pos, pos, reason)
                try:
                    self._zone_finish(z)
                except ZoneError as exc:
                    report.notes.append(f"zone {z}: finish failed: {exc}")
                self.z_wp[z] = (z + 1) * self.zs
                return
            assert header is not None
            ids = bytes(buf[: header.length]) if header.type == RecordType.TOMBSTONE else None
            found.append((header.seq, pos, header, ids))
            if pos == first and first == self.zone_start(z):
                if header.type == RecordType.DATA:
                    self.z_role[z] = ZoneRole.GC if header.is_gc_copy else ZoneRole.DATA
                    self.z_group[z] = header.group
                else:
                    self.z_role[z] = ZoneRole.META
            pos += header.footprint
            if self.wp_emulated:
                self.z_wp[z] = pos

    def _end_emulated_zone(self, z: int, pos: int, reason: str, header: RecordHeader | None,
                           report: RecoveryReport) -> None:
        """The end of a zone's log on a drive without write pointers.

        Zeros are the clean end; anything else (a torn or corrupt record) is
        reported. Either way the rest of the zone is zeroed, so no later scan
        can mistake what lies beyond the end for records.
        """
        self.z_wp[z] = pos
        end = self.zone_start(z) + self.zs
        if "zeros" not in reason:
            claimed = min(header.footprint, end - pos) if header is not None else BLOCK
            report.discarded.append(DiscardedTail(z, pos, claimed, reason))
            log.warning("recovery: zone %d of %s: discarding the record at %d: %s", z,
                        self.name, pos, reason)
        if pos < end:
            # Unflushed blocks may have landed out of order: clear the rest of the zone.
            self._drive_call(self.drive.discard, pos, end - pos)  # type: ignore[attr-defined]

    def _reattach_streams(self) -> None:
        """Give each stream back its most recently written partly filled zone."""
        best: dict[StreamKey, int] = {}
        partial = np.flatnonzero(self.z_state == ZoneState.SEALED)
        for z in partial.tolist():
            if self.room(z) < MIN_ROOM or z in self.gc_failed:
                continue
            role = self.z_role[z]
            if role == ZoneRole.DATA:
                key: StreamKey = ("g", int(self.z_group[z]))
            elif role == ZoneRole.GC:
                key = GC_STREAM
            elif role == ZoneRole.META:
                key = META_STREAM
            else:
                continue
            if key not in best or self.z_lastseq[z] > self.z_lastseq[best[key]]:
                best[key] = z
        for key, z in best.items():
            self._streams[key] = z
            self._zone_stream[z] = key
            self.z_state[z] = ZoneState.ACTIVE

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


def checkpoint_zones(zone_count: int, conventional_zones: int) -> int:
    """Zones before the first data zone: the drive's conventional zones (index
    checkpoints live there), or 1 % (at least one) of an all-conventional drive."""
    if conventional_zones >= zone_count:
        return max(1, zone_count // 100)
    return conventional_zones


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
