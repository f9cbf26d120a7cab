"""Zone GC: reset dead zones for free, copy live extents out of cheap victims when space runs low.

Policy, in order, each pass:

1. Every written zone whose bytes are all dead is reset without copying a
   byte (how deleting a lifetime group frees its zones). Metadata zones count
   as dead once both checkpoint slots cover their last record, because no
   recovery can then replay anything their tombstones kill.
2. When fewer than ``gc_free_zones`` zones are free, the victim is the zone
   with the highest cost-benefit score ``(1 - u) * age / (1 + u)``, where ``u``
   is its live fraction of the zone and ``age`` the device bytes written since
   it was last written (a clock that survives restarts). Sealed data/GC zones
   and idle groups' partly filled append zones are candidates; the GC and
   metadata append zones, metadata zones, zones being written and zones that
   failed a previous copy are never victims, nor zones that would free less
   than 1/16 of a zone.
   Its live extents are read (crc-verified), appended to the GC stream's zone
   (records flagged as GC copies, keeping their lifetime group), flushed, and
   only then switched in the index -- each switch conditional on the extent
   still being where it was read from. The victim is reset once nothing live
   remains and no reader still uses it.

The background thread copies ``gc_chunk_bytes`` at a time, holding the drive's
``io_lock`` only while appending a chunk and pausing ``gc_pause_s`` between
chunks, so acknowledged writes and reads are never blocked for long.

GC gives up rather than copy in circles: when ``FUTILE_COLLECTIONS``
collections in a row each gained less than 1/16 of a zone of writable room
(a drive nearly full of live data, where every copy only moves bytes and
leaves a new tail) or found no room even for the copies (zones failing
writes: a dying drive had GC warn 17 times a second), it stops collecting -- in the background and for writers
short of zones, who then get ``StoreFull`` -- until deletes have killed at
least 1/16 of a zone more than there was dead when it stopped. (Before, a
drive filled past the free-zone target rewrote its zones without end: 2.3 GB
copied in 20 s on a 16 MiB drive.)
"""

from __future__ import annotations

import logging
import mmap
import threading
from typing import TYPE_CHECKING

import numpy as np

from shinglefs.errors import UsageError
from shinglefs.store.errors import StoreError, StoreFull
from shinglefs.store.index import Extent
from shinglefs.store.zones import GC_STREAM, ZoneRole, ZoneState

if TYPE_CHECKING:
    from shinglefs.store.log import SliceLog

log = logging.getLogger("shinglefs.store.gc")

# Collections in a row, each gaining less than 1/16 of a zone of writable
# room, after which GC stops until more is dead (module docstring).
FUTILE_COLLECTIONS = 3


def cost_benefit(live_fraction: np.ndarray, age: np.ndarray) -> np.ndarray:
    """The victim score ``(1 - u) * age / (1 + u)``: high for empty, old zones."""
    u = live_fraction
    return (1.0 - u) * age / (1.0 + u)


def choose_victim(slice_log: SliceLog) -> int | None:
    """The best GC victim, or None when no zone would free at least 1/16 of a zone.

    Candidates: sealed data and GC zones, and the append zones of idle groups
    (a group that stopped writing keeps a partly filled zone; copying its few
    live bytes out frees the rest). Never the GC or metadata append zones,
    metadata zones, zones being written, or zones a copy failed on.
    """
    live = slice_log.live_per_zone()
    zs = slice_log.zs
    written = slice_log.z_wp - np.arange(slice_log.nz, dtype=np.int64) * zs
    role = slice_log.z_role
    state = slice_log.z_state
    cand = (((state == ZoneState.SEALED) & ((role == ZoneRole.DATA) | (role == ZoneRole.GC)))
            | ((state == ZoneState.ACTIVE) & (role == ZoneRole.DATA)))
    cand &= (written > 0) & (live <= zs - zs // 16)
    for z in slice_log.gc_busy | slice_log.gc_failed | slice_log.pinned:
        cand[z] = False
    idx = np.flatnonzero(cand)
    if idx.size == 0:
        return None
    u = live[idx] / float(zs)
    age = (slice_log.device_bytes - slice_log.z_lastb[idx]).astype(np.float64) + 1.0
    score = cost_benefit(u, age)
    return int(idx[int(np.argmax(score))])


class ZoneCollector:
    """The GC of one slice log: a background thread plus an inline entry for the writer."""

    def __init__(self, slice_log: SliceLog) -> None:
        self.log = slice_log
        cfg = slice_log.config
        if cfg.gc_free_zones is not None and not 0 <= cfg.gc_free_zones <= slice_log.seq_zones:
            # More free zones than the drive has: GC would copy for ever (a typo
            # of 100000 copied 37 MiB for 100 MiB written, with nothing to collect).
            raise UsageError(
                f"gc_free_zones {cfg.gc_free_zones} is not in 0..{slice_log.seq_zones}: "
                f"drive {slice_log.name} has {slice_log.seq_zones} sequential zones",
                hint="leave it out (5 % of the zones, at least 3) or give a few zones")
        self.threshold = (cfg.gc_free_zones if cfg.gc_free_zones is not None
                          else max(3, slice_log.seq_zones // 20))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.victims_collected = 0
        self.last_error: BaseException | None = None
        self._fruitless = 0  # collections in a row that gained too little room
        # Dead bytes on the drive when GC gave up (None: it has not): it tries
        # again once deletes have added 1/16 of a zone to them.
        self.gave_up_at_dead: int | None = None

    # -- thread ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"gc-{self.log.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        interval = self.log.config.gc_interval_s
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.step()
            except StoreError as exc:
                self.last_error = exc
                log.warning("gc of %s: %s", self.log.name, exc)
            except Exception as exc:  # keep the thread alive; the error is logged
                self.last_error = exc
                log.exception("gc of %s failed", self.log.name)

    # -- passes ------------------------------------------------------------------------
    def step(self) -> None:
        """One pass: reset dead zones; checkpoint for metadata zones; collect when low."""
        slog = self.log
        if slog.closed:
            return
        slog.reclaim_dead_zones()
        if slog.meta_zones_awaiting_checkpoint() and slog.free_zones() < 2 * self.threshold:
            slog.checkpoint()
            slog.checkpoint()
            slog.reclaim_dead_zones()
        while (not self._stop.is_set() and slog.free_zones() < self.threshold
               and self._worth_collecting()):
            with slog.io_lock:  # chosen on the state it is collected from (see ``collect``)
                victim = choose_victim(slog)
                generation = None if victim is None else int(slog.z_gen[victim])
            if victim is None or not self._collect_counted(victim, slog.config.gc_pause_s,
                                                           generation):
                break

    def collect_for_space(self) -> bool:
        """Inline GC for a writer short of zones (``io_lock`` held); True if a zone was freed."""
        slog = self.log
        if slog.meta_zones_awaiting_checkpoint():
            slog.checkpoint()
            slog.checkpoint()
            if slog.reclaim_dead_zones():
                return True
        if not self._worth_collecting():
            return False
        victim = choose_victim(slog)
        if victim is None:
            return False
        return self._collect_counted(victim, 0.0)

    # -- giving up ---------------------------------------------------------------------
    def _worth_collecting(self) -> bool:
        """False while GC has given up and deletes have not killed enough since."""
        if self.gave_up_at_dead is None:
            return True
        if self.log.dead_bytes() >= self.gave_up_at_dead + self.log.zs // 16:
            self.gave_up_at_dead = None
            self._fruitless = 0
            return True
        return False

    def _collect_counted(self, victim: int, pause: float, generation: int | None = None) -> bool:
        """``collect``, counting collections that gained too little writable room;
        gives up after ``FUTILE_COLLECTIONS`` of them in a row."""
        slog = self.log
        before = slog.writable_room()
        collected = False
        try:
            collected = self.collect(victim, pause=pause, generation=generation)
        finally:  # a failed write of the copies counts too (and is raised)
            self._count(collected and slog.writable_room() - before >= slog.zs // 16)
        return collected

    def _count(self, fruitful: bool) -> None:
        slog = self.log
        if fruitful:
            self._fruitless = 0
        else:  # too little gained, no room even for the copies, or their write failed
            self._fruitless += 1
            if self._fruitless >= FUTILE_COLLECTIONS and slog.free_zones() < self.threshold:
                self.gave_up_at_dead = slog.dead_bytes()
                log.warning("gc of %s: %d zone(s) free where it keeps %d, and copying "
                            "live data frees no more (the drive is nearly full of live "
                            "data, or its zones fail); GC waits for deletes", slog.name,
                            slog.free_zones(), self.threshold)

    def collect(self, zone: int, *, pause: float = 0.0, generation: int | None = None) -> bool:
        """Copy the live extents of ``zone`` to the GC stream and reset it; True if reset.

        ``generation``: the zone's generation when it was chosen. A zone reset
        since (collected by a writer short of room) and written again is not
        the victim that was chosen: collecting it would copy a writer's fresh
        data out of its own append zone, taking free zones for nothing (the
        last ones, once: GC then had no room left for any copy and the drive
        stayed full with half of it dead). Such a zone is left alone (False).
        """
        slog = self.log
        with slog.io_lock:
            if zone in slog.gc_busy or slog.z_state[zone] not in (ZoneState.SEALED,
                                                                   ZoneState.ACTIVE):
                return False
            if generation is not None and int(slog.z_gen[zone]) != generation:
                return False
            slog.detach_idle(zone)
            slog.gc_busy.add(zone)
        try:
            extents = slog.live_extents(zone)
            chunk_limit = slog.config.gc_chunk_bytes
            i = 0
            while i < len(extents):
                chunk: list[Extent] = []
                size = 0
                while i < len(extents) and (not chunk or size + extents[i].length <= chunk_limit):
                    chunk.append(extents[i])
                    size += extents[i].length
                    i += 1
                payloads = self._read_chunk(zone, chunk)
                if payloads is None or not self._copy_chunk(zone, chunk, payloads):
                    return False
                if pause:
                    self._stop.wait(pause)
            with slog.io_lock:
                if slog.zone_live_bytes(zone):
                    return False
                slog.reset_zones([zone])
                self.victims_collected += 1
                return True
        finally:
            slog.gc_busy.discard(zone)

    def _read_chunk(self, zone: int, chunk: list[Extent]) -> list[memoryview | None] | None:
        """The verified payloads of ``chunk`` (None for a slice deleted meanwhile); None when
        a live extent cannot be read: the zone is marked failed and never collected again."""
        slog = self.log
        payloads: list[memoryview | None] = []
        # One page-aligned mapping for the chunk, each extent at a page boundary
        # of it (read around the page cache: ``read_extent``), not one per extent.
        spans = [-(-e.length // mmap.PAGESIZE) * mmap.PAGESIZE for e in chunk]
        buf = memoryview(mmap.mmap(-1, max(1, sum(spans))))
        at = 0
        for e, span in zip(chunk, spans, strict=True):
            into, at = buf[at:at + span], at + span
            try:
                payloads.append(slog.read_extent(e.slice_id, e.offset, e.length, e.dev, into))
            except StoreError as exc:
                if slog.contains(e.slice_id):
                    log.error("gc of %s zone %d: cannot copy slice %#x: %s",
                              slog.name, zone, e.slice_id, exc)
                    slog.gc_failed.add(zone)
                    return None
                payloads.append(None)  # deleted meanwhile
        return payloads

    def _copy_chunk(self, zone: int, chunk: list[Extent],
                    payloads: list[memoryview | None]) -> bool:
        """Append the copies to the GC stream, flush, then switch the index to them
        (each switch only if the extent is still where it was read from). False when
        the log closed or no room is left for the copies."""
        slog = self.log
        with slog.io_lock:
            if slog.closed:
                return False
            # Copy only extents still where they were read from: a slice deleted
            # (and perhaps re-created under its id) meanwhile is not copied.
            here = slog.still_at(chunk)
            items = [(e.slice_id, e.offset, data, e.group)
                     for e, data, at in zip(chunk, payloads, here, strict=True)
                     if data is not None and at]
            try:
                written = slog.append(GC_STREAM, items, gc=True)
            except StoreFull as exc:
                log.warning("gc of %s zone %d: no room for copies: %s", slog.name, zone, exc)
                return False
            slog.flush_drive()
            sources = {(e.slice_id, e.offset): e.dev for e in chunk}
            slog.relocate([(w.slice_id, w.offset, sources[(w.slice_id, w.offset)], w.dev)
                           for w in written])
        return True
