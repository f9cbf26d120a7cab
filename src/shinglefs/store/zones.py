"""Zones of one slice log: their state, the append streams, allocation, space, reclaiming.

``LogZones`` is the base of ``SliceLog``: it holds the per-zone table (state,
write pointer, role, group, generation), the streams (one append zone per
lifetime group, plus the GC and metadata streams), the open-zone budget, the
space figures the writers reserve against (``writable_bytes``) and the resets
of dead zones. It never writes a record: ``SliceLog`` (log.py) appends,
``LogReads`` (reads.py) reads. The lock rules are log.py's.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from shinglefs.store.checkpoint import CheckpointArea
from shinglefs.store.config import StoreConfig
from shinglefs.store.errors import StoreFull, StoreIOError
from shinglefs.store.index import SliceIndex
from shinglefs.store.record import BLOCK, HEADER_BLOCK, RecordHeader
from shinglefs.zoned.errors import ZoneError
from shinglefs.zoned.model import ZonedDrive

log = logging.getLogger("shinglefs.store")

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


def checkpoint_zones(zone_count: int, conventional_zones: int) -> int:
    """Zones before the first data zone: the drive's conventional zones (index
    checkpoints live there), or 1 % (at least one) of an all-conventional drive."""
    if conventional_zones >= zone_count:
        return max(1, zone_count // 100)
    return conventional_zones


class LogZones:
    """The zone table, streams and space of one drive's slice log (see the module docstring)."""

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
        self.slot_covered = [0, 0]
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
        self._tls = threading.local()
        # Optional drive calls the read path uses when the drive has them natively:
        # one read into several buffers; a read-ahead hint for sequential scans.
        self.vectored_reads = drive.abilities.readv
        self.read_hints = drive.abilities.prefetch
        self.closed = False


    # ================================================================= small helpers
    def drive_call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the drive; a ``ZoneError`` becomes ``StoreIOError`` (drive, zone, offset)."""
        try:
            return fn(*args)
        except ZoneError as exc:
            raise StoreIOError(str(exc), drive=self.name, zone=getattr(exc, "zone", None),
                               offset=getattr(exc, "offset", None), cause=exc) from exc

    # Zone commands; on a drive without write pointers the store emulates them.
    def zone_reset(self, z: int) -> None:
        """RESET ZONE (on a drive without write pointers: discard the zone's bytes).

        Durable when it returns. Only ``reset_zones`` and ``format`` call it:
        the ordering rules (flush, readers gone, generation persisted) are theirs.
        """
        if self.wp_emulated:
            self.drive_call(self.drive.discard, self.zone_start(z), self.zs)
        else:
            self.drive_call(self.drive.reset, z)

    def zone_finish(self, z: int) -> None:
        """FINISH ZONE (no-op without write pointers). Raises ``ZoneError``."""
        if not self.wp_emulated:
            self.drive.finish(z)

    def zone_close(self, z: int) -> None:
        """CLOSE ZONE (no-op without write pointers). Raises ``ZoneError``."""
        if not self.wp_emulated:
            self.drive.close(z)

    def zone_start(self, z: int) -> int:
        return z * self.zs

    def room(self, z: int) -> int:
        return (z + 1) * self.zs - int(self.z_wp[z])

    def free_zones(self) -> int:
        return int((self.z_state == ZoneState.EMPTY).sum())

    def flush_drive(self) -> None:
        self.drive_call(self.drive.flush)


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
                    self.zone_finish(z)
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
                self.zone_close(z)
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
                    self.zone_close(victim)
                except ZoneError as exc:
                    log.warning("closing zone %d of %s failed: %s", victim, self.name, exc)
                self.evictions += 1
        table[z] = key

    def _allocate(self, key: StreamKey, zones_needed: int = 1, *, collect: bool = True) -> int:
        """An EMPTY zone; reclaims dead zones, then runs GC, before raising StoreFull.

        Reserves: data streams leave ``gc_reserve_zones`` free zones (at least
        2; a continuing slice one less), the metadata stream may take the last
        zone, GC too once the metadata stream has a zone with room -- so deletes
        and GC can still make room on a full drive. (The metadata stream left
        one for GC: once a continuing slice, then GC, had taken the reserve, no
        tombstone could be written and the drive stayed full whatever was
        deleted.)
        """
        privileged = key in (GC_STREAM, META_STREAM)
        if key == GC_STREAM:
            meta = self._streams.get(META_STREAM)
            reserve = 0 if meta is not None and self.room(meta) >= MIN_ROOM else 1
        elif key == META_STREAM:
            reserve = 0
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

    def writable_room(self) -> int:
        """Unwritten bytes of the zones that can still take appends: every EMPTY
        zone and the room of every ACTIVE one (a sealed zone's tail is lost
        until GC resets it). GC's measure of what a collection gained."""
        open_ = (self.z_state == ZoneState.EMPTY) | (self.z_state == ZoneState.ACTIVE)
        return int(self.room_per_zone()[open_].sum())

    def dead_bytes(self) -> int:
        """Written bytes of sequential zones that no live extent holds (deleted
        slices, superseded copies, record headers and padding)."""
        written = self.z_state[self.first_seq_zone:] != ZoneState.EMPTY
        used = (self.z_wp.astype(np.int64)[self.first_seq_zone:]
                - np.arange(self.first_seq_zone, self.nz, dtype=np.int64) * self.zs)
        usable = written & (self.z_state[self.first_seq_zone:] != ZoneState.BAD)
        return int(used[usable].sum()) - int(self.index.live_bytes)

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
        dead = self.dead_bytes()
        gave_up = self.collector.gave_up_at_dead if self.collector is not None else None
        if gave_up is not None:  # GC found the dead bytes it stopped at not worth copying
            dead -= gave_up
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
            self.zone_reset(z)
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
        covered = min(self.slot_covered)
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
        covered = min(self.slot_covered)
        sealed_meta = (self.z_role == ZoneRole.META) & (self.z_state == ZoneState.SEALED)
        return int((sealed_meta & (self.z_lastseq > covered)).sum())

    def reattach_streams(self) -> None:
        """Give each stream back its most recently written partly filled zone (recovery's last step)."""
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

