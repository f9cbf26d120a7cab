"""The zone state of an emulated drive: conditions, the ZBC rules, open zones, zone commands.

``EmulatedZones`` is the base of ``EmulatedZonedDrive`` (emulated.py, where
the model and the crash guarantees are written down): it holds the zone table
in memory (write pointers, durable write pointers, failed marks, conditions),
checks every rule a host-managed drive enforces, keeps the open-zone
accounting, and runs the zone commands (RESET, OPEN, CLOSE, FINISH) and the
trace. Data I/O is ``EmulatedIO`` (emulated_io.py); construction, flush and
the crash emulation are ``EmulatedZonedDrive``.

Locks: ``_lock`` serialises state changes and sequential writes;
``_persist_lock`` (taken first when both are needed) serialises zone table
saves so a flush's snapshot can never overwrite a later reset.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from array import array
from collections import OrderedDict

from shinglefs.zoned import fileio
from shinglefs.zoned.directio import DirectWriter, direct_writes_from_env, open_direct_reads
from shinglefs.zoned.errors import (
    DriveClosedError,
    OutOfRangeError,
    TooManyOpenZones,
    ZoneError,
    ZoneFullError,
    ZoneOfflineError,
    ZoneReadOnlyError,
    ZoneTypeError,
)
from shinglefs.zoned.model import (
    DriveAbilities,
    TraceRecord,
    ZoneCondition,
    ZonedDrive,
    ZoneInfo,
    ZoneType,
)
from shinglefs.zoned.zonetable import ZoneTable

log = logging.getLogger(__name__)


class EmulatedZones(ZonedDrive):
    """Zone state, rules and zone commands of an emulated drive (see the module docstring)."""

    # Write with O_DIRECT where the backing file allows it (see __init__). None:
    # the environment (``SHINGLEFS_EMULATED_DIRECT``, on unless "0") decides when
    # a drive is opened; a subclass or a test may fix it to True or False.
    DIRECT_WRITES: bool | None = None
    # Read page-aligned buffers with O_DIRECT (see __init__); None as above.
    DIRECT_READS: bool | None = None

    def __init__(
        self,
        path: str,
        fd: int,
        table: ZoneTable,
        wp_offsets: list[int],
        failed: list[ZoneCondition | None],
        name: str,
    ) -> None:
        g = table.geometry
        self.path = path
        self.name = name
        self.zone_size = g.zone_size
        self.zone_count = g.zone_count
        self.conventional_zones = g.conventional_zones
        self.max_open_zones = g.max_open_zones
        self.block_size = g.block_size
        self._fd = fd
        self._image_checked = time.monotonic()  # _check_image
        self._image_gone = False
        # Writes go around the page cache (O_DIRECT through an aligned bounce
        # buffer) where the file system allows it, as on a real zoned device:
        # no double caching, and no dirty-page throttling of the writer.
        # Reads into page-aligned buffers do too (directio.py); other reads
        # are buffered (the kernel keeps the two coherent).
        direct = self.DIRECT_WRITES
        if direct is None:
            direct = direct_writes_from_env()
        self._direct = DirectWriter.open(path) if direct else None
        direct_reads = self.DIRECT_READS
        if direct_reads is None:
            direct_reads = direct_writes_from_env()
        self._direct_reads = open_direct_reads(path) if direct_reads else None
        self._reads_direct = self._direct_reads is not None
        # Read-ahead hints fill the page cache, which direct reads pass by.
        self.abilities = DriveAbilities(readv=True, prefetch=self._direct_reads is None)
        self._table = table
        self._closed = False
        # Serialises state changes and sequential writes. _persist_lock (taken
        # first when both are needed) serialises zone table saves so a flush's
        # snapshot can never overwrite a later reset.
        self._lock = threading.RLock()
        self._persist_lock = threading.Lock()
        zs = self.zone_size
        self._wp = [z * zs + off for z, off in enumerate(wp_offsets)]
        self._durable_wp = list(self._wp)
        self._failed = list(failed)
        # The zone table as saved (encoded durable pointers and failed marks), and
        # the zones written or finished since the last flush: a flush re-encodes
        # only those, so its cost does not grow with the zone count.
        self._entries = array("Q", [ZoneTable.encode(off, f) for off, f in zip(wp_offsets, failed,
                                                                                strict=True)])
        self._unflushed: set[int] = set()
        self._cond: list[ZoneCondition] = [
            self._resting_condition(z) for z in range(self.zone_count)
        ]
        self._implicit_open: OrderedDict[int, None] = OrderedDict()  # LRU order
        self._explicit_open: set[int] = set()
        self._conv_unflushed: list[tuple[int, int]] = []
        self._last_write: tuple[int, int, int] | None = None  # zone, start, end
        self._trace: list[TraceRecord] | None = None


    # -- zone descriptors -----------------------------------------------------------------
    def _is_conventional(self, zone: int) -> bool:
        return zone < self.conventional_zones

    def _resting_condition(self, zone: int) -> ZoneCondition:
        """Condition after power-on: failed mark, else derived from the write pointer."""
        failed = self._failed[zone]
        if failed is not None:
            return failed
        if self._is_conventional(zone):
            return ZoneCondition.NOT_WP
        start = zone * self.zone_size
        wp = self._wp[zone]
        if wp == start:
            return ZoneCondition.EMPTY
        if wp == start + self.zone_size:
            return ZoneCondition.FULL
        return ZoneCondition.CLOSED

    def report_zones(self, start_zone: int = 0, count: int | None = None) -> list[ZoneInfo]:
        self._check_open()
        if not 0 <= start_zone < self.zone_count:
            raise OutOfRangeError(
                f"zone {start_zone} not in 0..{self.zone_count - 1}", drive=self.name,
                zone=start_zone,
            )
        end = self.zone_count if count is None else min(self.zone_count, start_zone + count)
        zs = self.zone_size
        with self._lock:
            return [
                ZoneInfo(
                    index=z,
                    start=z * zs,
                    size=zs,
                    capacity=zs,
                    write_pointer=z * zs if self._is_conventional(z) else self._wp[z],
                    type=ZoneType.CONVENTIONAL
                    if self._is_conventional(z)
                    else ZoneType.SEQUENTIAL_WRITE_REQUIRED,
                    condition=self._cond[z],
                )
                for z in range(start_zone, end)
            ]

    def open_zone_count(self) -> tuple[int, int]:
        """(implicitly open, explicitly open) sequential zones right now."""
        with self._lock:
            return len(self._implicit_open), len(self._explicit_open)

    # -- checks ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise DriveClosedError("the drive is closed", drive=self.name)

    def _check_zone(self, zone: int) -> None:
        if not 0 <= zone < self.zone_count:
            raise OutOfRangeError(
                f"zone {zone} not in 0..{self.zone_count - 1}", drive=self.name, zone=zone
            )

    IMAGE_CHECK_S = 1.0
    """How often a write checks that the image file still has a name (``_check_image``)."""

    def _check_image(self) -> None:
        """Refuse writes once the image file was deleted under us: they would
        succeed into a file that vanishes when the drive closes, taking every
        acknowledged byte with it. Checked at most every ``IMAGE_CHECK_S``."""
        now = time.monotonic()
        if not self._image_gone and now - self._image_checked >= self.IMAGE_CHECK_S:
            self._image_checked = now
            if os.fstat(self._fd).st_nlink == 0:
                self._image_gone = True
                log.error("drive image %s was deleted while in use: its writes now fail; "
                          "what it holds is readable until the file system unmounts, then "
                          "gone (copy files off now; then `shinglefs drive replace`)",
                          self.path)
        if self._image_gone:
            raise ZoneError("the drive's image file was deleted while in use",
                            drive=self.name, hint="copy the files you need off the mount "
                            "now, unmount, then run `shinglefs drive replace`")

    def _check_usable(self, zone: int, offset: int | None) -> None:
        cond = self._cond[zone]
        if cond is ZoneCondition.OFFLINE:
            raise ZoneOfflineError("zone is OFFLINE", drive=self.name, zone=zone, offset=offset)
        if cond is ZoneCondition.READ_ONLY:
            raise ZoneReadOnlyError(
                "zone is READ_ONLY", drive=self.name, zone=zone, offset=offset,
                hint="read its data off and stop writing this zone",
            )

    def _check_sequential(self, zone: int, op: str) -> None:
        if self._is_conventional(zone):
            raise ZoneTypeError(
                f"{op} is not defined for a conventional zone", drive=self.name, zone=zone
            )

    # -- open-zone accounting (caller holds _lock) --------------------------------------
    def _take_open_resource(self, zone: int, explicit: bool) -> None:
        """Make room for one more open zone, implicitly closing an IMPLICIT_OPEN one if needed."""
        limit = self.max_open_zones
        if limit == 0 or len(self._implicit_open) + len(self._explicit_open) < limit:
            return
        for victim in self._implicit_open:
            if victim != zone:
                self._release_open(victim)
                self._cond[victim] = self._closed_condition(victim)
                return
        kind = "explicitly" if explicit else "implicitly"
        raise TooManyOpenZones(
            f"cannot open the zone {kind}: all {limit} open zones are explicitly open",
            drive=self.name, zone=zone, offset=self._wp[zone],
            hint="close or finish an explicitly opened zone first",
        )

    def _release_open(self, zone: int) -> None:
        self._implicit_open.pop(zone, None)
        self._explicit_open.discard(zone)

    def _closed_condition(self, zone: int) -> ZoneCondition:
        return ZoneCondition.EMPTY if self._wp[zone] == zone * self.zone_size else ZoneCondition.CLOSED

    # -- zone management ------------------------------------------------------------------
    def reset(self, zone: int) -> None:
        """Make ``zone`` EMPTY, durably; its old bytes are discarded (read as zeros)."""
        self._check_open()
        self._check_zone(zone)
        self._check_sequential(zone, "reset")
        start = zone * self.zone_size
        with self._persist_lock, self._lock:
            self._check_open()
            self._check_usable(zone, start)
            self._trace_command("reset", zone)
            old_wp = self._wp[zone]
            self._release_open(zone)
            self._wp[zone] = start
            self._cond[zone] = ZoneCondition.EMPTY
            if self._last_write is not None and self._last_write[0] == zone:
                self._last_write = None
            if self._durable_wp[zone] != start:
                self._set_durable(zone, start)
                self._table.save_entries(self._entries)
            # Space only: bytes past the write pointer already read as zeros.
            fileio.discard(self._fd, start, old_wp - start, must_zero=False)

    def open_zone(self, zone: int) -> None:
        """Explicitly open ``zone`` (EMPTY, IMPLICIT_OPEN or CLOSED -> EXPLICIT_OPEN)."""
        self._check_open()
        self._check_zone(zone)
        self._check_sequential(zone, "open")
        with self._lock:
            self._check_open()
            self._check_usable(zone, self._wp[zone])
            self._trace_command("open", zone)
            cond = self._cond[zone]
            if cond is ZoneCondition.EXPLICIT_OPEN:
                return
            if cond is ZoneCondition.FULL:
                raise ZoneFullError(
                    "cannot open a FULL zone", drive=self.name, zone=zone, offset=self._wp[zone]
                )
            if cond is ZoneCondition.IMPLICIT_OPEN:
                del self._implicit_open[zone]
            else:
                self._take_open_resource(zone, explicit=True)
            self._explicit_open.add(zone)
            self._cond[zone] = ZoneCondition.EXPLICIT_OPEN

    def close(self, zone: int) -> None:
        self._check_open()
        self._check_zone(zone)
        self._check_sequential(zone, "close")
        with self._lock:
            self._check_open()
            self._check_usable(zone, self._wp[zone])
            self._trace_command("close", zone)
            if self._cond[zone].is_open:
                self._release_open(zone)
                self._cond[zone] = self._closed_condition(zone)

    def finish(self, zone: int) -> None:
        """Make ``zone`` FULL (write pointer at its end); volatile until ``flush``."""
        self._check_open()
        self._check_zone(zone)
        self._check_sequential(zone, "finish")
        with self._lock:
            self._check_open()
            self._check_usable(zone, self._wp[zone])
            self._trace_command("finish", zone)
            if self._cond[zone] is ZoneCondition.FULL:
                return
            end = (zone + 1) * self.zone_size
            old_wp = self._wp[zone]
            self._release_open(zone)
            # Bytes between the old pointer and the end may hold garbage from an
            # earlier crash; after FINISH they are readable, so make them zeros.
            fileio.discard(self._fd, old_wp, end - old_wp)
            self._wp[zone] = end
            self._unflushed.add(zone)
            self._cond[zone] = ZoneCondition.FULL


    def _set_durable(self, zone: int, wp: int) -> None:
        """Record ``wp`` as ``zone``'s durable pointer (saved by the caller's next table save)."""
        self._durable_wp[zone] = wp
        self._entries[zone] = ZoneTable.encode(wp - zone * self.zone_size, self._failed[zone])


    # -- tracing ---------------------------------------------------------------------------
    def _trace_command(self, op: str, zone: int) -> None:
        """Record a zone command (offset: the write pointer it found)."""
        if self._trace is not None:
            self._trace.append(TraceRecord(op, zone, self._wp[zone], 0, time.perf_counter()))

    def start_trace(self) -> None:
        self._trace = []

    def stop_trace(self) -> list[TraceRecord]:
        records, self._trace = self._trace or [], None
        return records
