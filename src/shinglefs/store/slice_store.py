"""``SliceStore``: the slice log of one drive behind the ``SliceStoreAPI`` contract."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from shinglefs.errors import UsageError
from shinglefs.store.api import (
    MAX_SLICE_SIZE,
    PieceBytes,
    PieceFuture,
    SliceStoreAPI,
    StoreAbilities,
    StoreSpace,
    StoreStats,
)
from shinglefs.store.config import StoreConfig
from shinglefs.store.errors import SliceNotFound, StoreClosed
from shinglefs.store.gc import ZoneCollector
from shinglefs.store.log import SliceLog
from shinglefs.store.recovery import RecoveryReport
from shinglefs.store.scheduler import WriteScheduler
from shinglefs.zoned.fileio import Payload
from shinglefs.zoned.model import Buffer, ZonedDrive

log = logging.getLogger("shinglefs.store")

_U64 = 1 << 64


class SliceStore(SliceStoreAPI):
    """A thread-safe slice store on one zoned drive.

    ``format`` makes a fresh store (every zone reset); ``open`` recovers an
    existing one and leaves what it found in ``recovery_report``. Keyword
    arguments of both are ``StoreConfig`` fields. Writes go through the
    drive's ``WriteScheduler``; reads go straight to the drive; a
    ``ZoneCollector`` thread reclaims zones.

    What is durable: a piece submitted with ``durable=True`` once its future
    completes; everything written or deleted before a ``flush()`` once it
    returns. A crash never resurrects a deleted-and-flushed slice and never
    loses an acknowledged durable one.
    """

    abilities = StoreAbilities(scheduler=True)

    def __init__(self, slice_log: SliceLog) -> None:
        self._log = slice_log
        cfg = slice_log.config
        self.name = slice_log.name
        self.collector = ZoneCollector(slice_log)
        slice_log.collector = self.collector
        self._scheduler = WriteScheduler(slice_log)
        if cfg.gc_background:
            self.collector.start()
        self._closed = False
        self._close_lock = threading.Lock()

    @property
    def scheduler(self) -> WriteScheduler:
        """The drive's write scheduler (``abilities.scheduler``)."""
        return self._scheduler

    # ================================================================= lifecycle
    @classmethod
    def format(cls, drive: ZonedDrive, **config: Any) -> SliceStore:
        """Make ``drive`` an empty slice store (destroys what it held)."""
        return cls(SliceLog.format(drive, StoreConfig(**config)))

    @classmethod
    def open(cls, drive: ZonedDrive, **config: Any) -> SliceStore:
        """Open an existing store, recovering from the last checkpoint and the log after it."""
        return cls(SliceLog.open(drive, StoreConfig(**config)))

    @property
    def drive(self) -> ZonedDrive:
        return self._log.drive

    @property
    def slice_log(self) -> SliceLog:
        return self._log

    @property
    def recovery_report(self) -> RecoveryReport:
        return self._log.recovery_report

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("store is closed", drive=self.name)

    def close(self) -> None:
        """Write what is queued, stop GC, flush, checkpoint and release the drive."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self.scheduler.close()
        self.collector.stop()
        self._log.close()

    def mark_lost(self) -> None:
        """The drive died under this store (a test's power cut or process crash).

        Every later call raises ``StoreClosed`` and ``close`` does nothing: no
        flush, no checkpoint, no write reaches the drive. The caller has
        stopped the scheduler and the collector itself, before the cut.
        """
        with self._close_lock:
            self._closed = True

    def __enter__(self) -> SliceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ================================================================= writing
    def submit(self, slice_id: int, offset: int, data: PieceBytes, group: int, *,
               durable: bool = False, urgent: bool = False, wait: bool = True) -> PieceFuture:
        """The one write call (``SliceStoreAPI.submit``): through the drive's ``WriteScheduler``."""
        self._check_open()
        if not 0 <= slice_id < _U64:
            raise UsageError(f"slice id {slice_id} is not a 64-bit unsigned integer")
        if not 0 <= group < _U64:
            raise UsageError(f"lifetime group {group} is not a 64-bit unsigned integer")
        return self.scheduler.submit(slice_id, offset, Payload(data), group, durable=durable,
                                     urgent=urgent, wait=wait,
                                     indexed_length=self._indexed_length)

    def has_room(self, nbytes: int) -> bool:
        return self.scheduler.has_room(nbytes)

    def _indexed_length(self, slice_id: int) -> int:
        return self._log.indexed_length(slice_id)

    def delete(self, slice_id: int) -> None:
        """Delete a slice (after its queued pieces are written); idempotent; durable at flush."""
        self._check_open()
        self.scheduler.wait_slice(slice_id)
        with self._log.io_lock:
            self._log.delete([slice_id])
        self.collector.wake()

    def delete_many(self, slice_ids: list[int]) -> int:
        """Delete several slices with one tombstone record; returns how many existed."""
        self._check_open()
        for sid in slice_ids:
            self.scheduler.wait_slice(sid)
        with self._log.io_lock:
            n = self._log.delete(slice_ids)
        self.collector.wake()
        return n

    def delete_group(self, group: int) -> list[int]:
        """Delete every slice with a piece in ``group``; returns their ids. Durable at flush.

        One group-delete record is logged; the group's zones become dead and
        are reset without copying.
        """
        self._check_open()
        self.scheduler.wait_group(group)
        with self._log.io_lock:
            removed = self._log.delete_group(group)
        self.collector.wake()
        return removed

    def flush(self) -> None:
        """Return when every write and delete completed before the call is durable."""
        self._check_open()
        self.scheduler.flush()

    # ================================================================= reading
    def read(self, slice_id: int, offset: int, length: int) -> bytes:
        self._check_open()
        if offset < 0 or length < 0:
            raise UsageError(f"bad range offset={offset} length={length}")
        # Sized to what the slice holds (not to ``length``): no large zeroed buffer for a short read.
        buf = bytearray(max(0, min(length, MAX_SLICE_SIZE, self._log.length(slice_id) - offset)))
        n = self._log.readinto(slice_id, offset, memoryview(buf))
        if n < len(buf):
            del buf[n:]
        return bytes(buf)

    def readinto(self, slice_id: int, offset: int, buffer: Buffer) -> int:
        """Fill ``buffer`` from ``offset`` of the slice; returns the bytes read (short at its end)."""
        self._check_open()
        view = memoryview(buffer)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        if offset < 0:
            raise UsageError(f"bad offset {offset}")
        return self._log.readinto(slice_id, offset, view)

    def prefetch(self, slice_id: int, offset: int, length: int) -> None:
        self._check_open()
        self._log.prefetch(slice_id, offset, length)

    def length(self, slice_id: int) -> int:
        self._check_open()
        pending = self.scheduler.pending_length(slice_id)
        try:
            return self._log.length(slice_id)
        except SliceNotFound:
            if pending:
                return 0
            raise

    def contains(self, slice_id: int) -> bool:
        self._check_open()
        return self._log.contains(slice_id)

    def highest_slice_id(self) -> int:
        """The highest slice id this drive's index holds or held (0: none):
        new slices must be given higher ones (``StorageNode.highest_slice_id``)."""
        self._check_open()
        return self._log.highest_slice_id()

    def slice_ids(self) -> Iterator[int]:
        """Every slice id held (a snapshot), for reconciliation with the metadata."""
        self._check_open()
        return self._log.slice_ids()

    # ================================================================= counters
    def stats(self) -> StoreStats:
        slog = self._log
        # Counters are read without the drive's io_lock: a batch in flight may be
        # half counted, never blocked on.
        usage = slog.usage()
        user = slog.user_bytes
        device = slog.device_bytes
        return StoreStats(
            user_bytes_written=user,
            device_bytes_written=device,
            write_amplification=(device / user) if user else 1.0,
            gc_bytes_copied=slog.gc_bytes,
            zone_resets=slog.zone_resets,
            checkpoint_bytes_written=slog.checkpoint_bytes_written,
            slices=usage.slices,
            live_bytes=usage.live_bytes,
            free_zones=slog.free_zones(),
            zones_by_condition=slog.zones_by_condition(),
            live_bytes_per_zone=usage.live_bytes_per_zone,
            group_zone_evictions=slog.evictions,
            capacity_bytes=slog.seq_zones * slog.zs,
            writable_bytes=usage.writable_bytes,
            zones_collecting=usage.zones_collecting,
        )

    def space(self) -> StoreSpace:
        slog = self._log
        writable, collecting = slog.space()
        return StoreSpace(writable, collecting, slog.seq_zones * slog.zs)

    def checkpoint(self) -> int:
        """Write an index checkpoint now; returns its size in bytes."""
        self._check_open()
        return self._log.checkpoint()

    def collect_garbage(self) -> None:
        """Run one GC pass in the calling thread (reset dead zones; collect if space is low)."""
        self._check_open()
        self.collector.step()
