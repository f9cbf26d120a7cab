"""An emulated host-managed SMR drive on a sparse file (or a raw block device).

The data lives at its natural offsets in one file of ``zone_size * zone_count``
bytes (sparse: unwritten zones cost nothing); the zone table (geometry,
durable write pointers, failed zones) lives in ``<path>.zones``, see
``zonetable``. Every ZBC rule of ``model`` is enforced with the typed error
and errno of ``errors``.

Zone state machine (sequential zones; ZBC/ZAC):

- a write to EMPTY or CLOSED opens the zone implicitly (IMPLICIT_OPEN);
- a write reaching the zone's end, or FINISH, makes it FULL;
- OPEN takes EMPTY, IMPLICIT_OPEN or CLOSED to EXPLICIT_OPEN (FULL: ZoneFullError);
- CLOSE takes an open zone to CLOSED, or EMPTY when nothing was written
  (CLOSE of EMPTY, CLOSED or FULL changes nothing);
- RESET takes any zone but READ_ONLY/OFFLINE to EMPTY;
- READ_ONLY and OFFLINE are terminal (``fail_zone``).

Open-zone limit: IMPLICIT_OPEN + EXPLICIT_OPEN zones are at most
``max_open_zones`` (0 = unlimited). When opening one more (implicitly by a
write or explicitly by OPEN) would exceed it, the drive first closes the least
recently written IMPLICIT_OPEN zone, as ZBC lets a device do ("implicitly
closes"); it fails with ``TooManyOpenZones`` (ETOOMANYREFS) only when every
open zone is explicitly open.

Persistence and crash model (what is guaranteed):

- ``write`` returns with the bytes in the page cache ("the drive's volatile
  cache"); ``flush`` ``fdatasync``s the data file, then saves the current
  write pointers as the durable ones (zone table slot + ``fdatasync``).
- ``reset`` and ``fail_zone`` are durable when they return (they save the
  table at once, with the other zones' durable pointers unchanged); a reset
  zone never comes back with its old write pointer.
- ``finish`` and open/close are, like writes, volatile until ``flush``; after a
  restart open zones are CLOSED (EMPTY/FULL by their write pointer).
- After a crash (process kill or ``simulate_power_cut``) each zone's write
  pointer is its durable one; bytes past it read as zeros even if they reached
  the file, and are overwritten by the next writes.
- ``simulate_power_cut(torn=True)`` additionally keeps, in the zone of the last
  unflushed write, every earlier unflushed write to that zone and a block
  prefix (0 .. all blocks) of that last write, with the write pointer just
  past the kept prefix: the reopened drive may report a write pointer past the
  last flush, covering a partly written record. Nothing else unflushed survives.
- Conventional zones have no write pointer: their unflushed writes read as
  zeros after a power cut (harsher than a real drive, which keeps old or new
  per sector), except the kept prefix of a torn last write.
"""

from __future__ import annotations

import mmap
import os
import random
import stat
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from shinglefs.errors import UsageError
from shinglefs.zoned import fileio
from shinglefs.zoned.errors import (
    DriveClosedError,
    DriveFormatError,
    OutOfRangeError,
    TooManyOpenZones,
    UnalignedIOError,
    WritePointerViolation,
    ZoneBoundaryError,
    ZoneError,
    ZoneFullError,
    ZoneOfflineError,
    ZoneReadOnlyError,
    ZoneTypeError,
)
from shinglefs.zoned.model import (
    BLOCK_SIZE,
    DEFAULT_ZONE_SIZE,
    Buffer,
    DriveAbilities,
    DriveOrZoneOpen,
    TraceRecord,
    ZoneCondition,
    ZonedDrive,
    ZoneInfo,
    ZoneType,
)
from shinglefs.zoned.zonetable import Geometry, ZoneTable

DEFAULT_MAX_OPEN_ZONES = 128
_TERMINAL = (ZoneCondition.READ_ONLY, ZoneCondition.OFFLINE)


def default_conventional_zones(zone_count: int) -> int:
    """About 1% of the zones, at least one when the drive has two or more (HC620: 524/55,880)."""
    return 0 if zone_count < 2 else max(1, zone_count // 100)


BOUNCE_BYTES = 8 * 1024 * 1024  # O_DIRECT writes go out in rounds of at most this


DIRECT_ENV = "SHINGLEFS_EMULATED_DIRECT"


def direct_writes_from_env() -> bool:
    """Whether emulated drives write with O_DIRECT: on unless ``SHINGLEFS_EMULATED_DIRECT=0``.

    Read each time a drive is opened, never at import.
    """
    return os.environ.get(DIRECT_ENV, "1") != "0"


def _open_direct(path: str) -> int | None:
    """A second descriptor of ``path`` opened O_DIRECT for writing, or None where
    the file system (tmpfs, some overlays) refuses it."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError:
        return None


class EmulatedZonedDrive(ZonedDrive):
    """A host-managed SMR drive emulated on a file; see the module docstring for the model.

    Build with ``create`` (new drive) or ``open`` (existing one), not the constructor.
    """

    # Write with O_DIRECT where the backing file allows it (see __init__). None:
    # the environment (``DIRECT_ENV``, on unless "0") decides when a drive is
    # opened; a subclass or a test may fix it to True or False.
    DIRECT_WRITES: bool | None = None

    kind = "emulated"
    abilities = DriveAbilities(readv=True, prefetch=True)

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
        # Writes go around the page cache (O_DIRECT through an aligned bounce
        # buffer) where the file system allows it, as on a real zoned device:
        # no double caching, and no dirty-page throttling of the writer.
        # Reads stay buffered (the kernel keeps the two coherent).
        direct = self.DIRECT_WRITES
        if direct is None:
            direct = direct_writes_from_env()
        self._dfd = _open_direct(path) if direct else None
        self._bounce: mmap.mmap | None = None
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

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        zone_size: int = DEFAULT_ZONE_SIZE,
        zone_count: int | None = None,
        size: int | None = None,
        conventional_zones: int | None = None,
        max_open_zones: int = DEFAULT_MAX_OPEN_ZONES,
        block_size: int = BLOCK_SIZE,
        name: str | None = None,
        table_path: str | None = None,
    ) -> EmulatedZonedDrive:
        """Create a new, all-EMPTY drive at ``path`` and return it open.

        Give ``zone_count`` or ``size`` (bytes, rounded down to whole zones).
        ``path`` may be a regular file (created sparse; must not exist) or an
        existing block device at least as large as the drive, in which case
        ``table_path`` (default ``<path>.zones``) should be on a persistent
        file system; the device is trimmed where it supports it (otherwise its
        conventional zones keep their old bytes; sequential zones always read
        as zeros past their write pointers). Raises UsageError for a bad
        geometry or an existing file.
        """
        path = os.fspath(path)
        if zone_size <= 0 or block_size <= 0 or zone_size % block_size:
            raise UsageError(
                f"zone size {zone_size} is not a positive multiple of the block size {block_size}"
            )
        if zone_count is None:
            if size is None:
                raise UsageError("give the drive a zone_count or a size")
            zone_count = size // zone_size
        if zone_count < 1:
            raise UsageError(
                f"a drive needs at least one zone of {zone_size} bytes",
                hint="give a larger size or a smaller zone size",
            )
        if conventional_zones is None:
            conventional_zones = default_conventional_zones(zone_count)
        if not 0 <= conventional_zones <= zone_count:
            raise UsageError(f"conventional_zones {conventional_zones} not in 0..{zone_count}")
        if max_open_zones < 0:
            raise UsageError(f"max_open_zones {max_open_zones} is negative (0 means unlimited)")
        geometry = Geometry(zone_size, zone_count, conventional_zones, max_open_zones, block_size)
        table_path = table_path or path + ".zones"
        name = name or os.path.basename(path)
        is_device = os.path.exists(path) and stat.S_ISBLK(os.stat(path).st_mode)
        if is_device:
            fd = os.open(path, os.O_RDWR)
            device_size = os.lseek(fd, 0, os.SEEK_END)
            if device_size < geometry.capacity:
                os.close(fd)
                raise UsageError(
                    f"{path} holds {device_size} bytes, less than the {geometry.capacity} asked"
                )
        else:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                raise UsageError(
                    f"{path} already exists", hint="format never overwrites a drive: choose a new path for it"
                ) from None
            except OSError as exc:
                raise UsageError(f"cannot create {path}: {exc.strerror}") from None
            os.ftruncate(fd, geometry.capacity)
            fileio.sync_file(fd)
        try:
            table = ZoneTable.create(table_path, geometry, name)
            if is_device:
                # Old device bytes past a write pointer never show (reads past it are
                # zeros); trim the lot if the device can, but never write 15 TB of zeros.
                fileio.discard(fd, 0, geometry.capacity, must_zero=False)
        except BaseException:
            os.close(fd)
            if not is_device:
                os.unlink(path)
            raise
        return cls(path, fd, table, [0] * zone_count, [None] * zone_count, name)

    @classmethod
    def open_drive(
        cls, path: str | os.PathLike[str], *, name: str | None = None, table_path: str | None = None
    ) -> EmulatedZonedDrive:
        """Open an existing drive: geometry, durable write pointers and failed zones come back.

        Raises DriveFormatError when the zone table is missing or corrupt, or
        the data file is smaller than the geometry says.
        """
        path = os.fspath(path)
        table_path = table_path or path + ".zones"
        name = name or os.path.basename(path)
        table, wps, failed = ZoneTable.load(table_path, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            table.close()
            raise DriveFormatError(f"data file {path} not found", drive=name) from None
        size = os.lseek(fd, 0, os.SEEK_END)
        if size < table.geometry.capacity:
            os.close(fd)
            table.close()
            raise DriveFormatError(
                f"data file holds {size} bytes; the zone table says {table.geometry.capacity}",
                drive=name,
            )
        return cls(path, fd, table, wps, failed, name)

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

    @property
    def writes_direct(self) -> bool:
        """True while writes go around the page cache (O_DIRECT); False once refused or never on."""
        return self._dfd is not None

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

    # -- I/O ------------------------------------------------------------------------------
    def write(self, zone: int, offset: int, data: Buffer | Sequence[Buffer]) -> None:
        self._check_open()
        views = fileio.as_views(data)
        length = sum(v.nbytes for v in views)
        self._write_views(zone, offset, views, length)

    def append(self, zone: int, data: Buffer | Sequence[Buffer]) -> int:
        self._check_open()
        self._check_zone(zone)
        self._check_sequential(zone, "append")
        views = fileio.as_views(data)
        length = sum(v.nbytes for v in views)
        with self._lock:
            offset = self._wp[zone]
            self._write_views(zone, offset, views, length)
        return offset

    def _write_views(self, zone: int, offset: int, views: list[memoryview], length: int) -> None:
        self._check_zone(zone)
        bs = self.block_size
        if offset % bs or length % bs:
            raise UnalignedIOError(
                f"write of {length} bytes is not aligned to {bs} bytes",
                drive=self.name, zone=zone, offset=offset,
            )
        start = zone * self.zone_size
        end = start + self.zone_size
        if not start <= offset <= end:
            raise ZoneBoundaryError(
                f"offset is outside the zone [{start}, {end})", drive=self.name, zone=zone,
                offset=offset,
            )
        with self._lock:
            self._check_open()
            self._check_usable(zone, offset)
            if self._is_conventional(zone):
                if offset + length > end:
                    raise ZoneBoundaryError(
                        f"write of {length} bytes crosses the zone end {end}",
                        drive=self.name, zone=zone, offset=offset,
                    )
                self._pwritev(zone, views, offset, length)
                if length:
                    self._conv_unflushed.append((offset, length))
                    self._last_write = (zone, offset, offset + length)
                return
            cond = self._cond[zone]
            if cond is ZoneCondition.FULL:
                raise ZoneFullError(
                    "zone is FULL", drive=self.name, zone=zone, offset=offset,
                    hint="reset the zone before writing it again",
                )
            wp = self._wp[zone]
            if offset != wp:
                raise WritePointerViolation(
                    f"write is not at the write pointer {wp}", drive=self.name, zone=zone,
                    offset=offset,
                )
            if offset + length > end:
                raise ZoneBoundaryError(
                    f"write of {length} bytes crosses the zone end {end}",
                    drive=self.name, zone=zone, offset=offset,
                )
            if length == 0:
                return
            opening = cond in (ZoneCondition.EMPTY, ZoneCondition.CLOSED)
            if opening:
                self._take_open_resource(zone, explicit=False)
            self._pwritev(zone, views, offset, length)  # on failure the zone is as it was
            if opening:
                self._implicit_open[zone] = None
                self._cond[zone] = ZoneCondition.IMPLICIT_OPEN
            elif cond is ZoneCondition.IMPLICIT_OPEN:
                self._implicit_open.move_to_end(zone)
            self._wp[zone] = offset + length
            self._unflushed.add(zone)
            self._last_write = (zone, offset, offset + length)
            if offset + length == end:
                self._release_open(zone)
                self._cond[zone] = ZoneCondition.FULL

    def _pwritev(self, zone: int, views: list[memoryview], offset: int, length: int) -> None:
        # Traced here, after every rule passed: the trace holds the I/O the media saw.
        if self._trace is not None:
            self._trace.append(TraceRecord("write", zone, offset, length, time.perf_counter()))
        try:
            if self._dfd is not None and self._direct_write(views, offset, length):
                return
            fileio.pwritev_all(self._fd, views, offset)
        except OSError as exc:
            raise ZoneError(
                f"write failed: {exc.strerror}", drive=self.name, zone=zone, offset=offset,
                errno=exc.errno,
            ) from exc

    def _direct_write(self, views: list[memoryview], offset: int, length: int) -> bool:
        """Write ``views`` at ``offset`` with O_DIRECT, in bounce-buffer rounds
        (``_lock`` held; offset and length are block-aligned). False: the file
        refuses O_DIRECT (EINVAL), which is then given up for good."""
        assert self._dfd is not None
        if self._bounce is None:
            self._bounce = mmap.mmap(-1, BOUNCE_BYTES)  # page-aligned
        bounce = memoryview(self._bounce)
        pending = list(views)
        done = 0
        try:
            while done < length:
                fill = 0
                while pending and fill < BOUNCE_BYTES:
                    view = pending[0]
                    take = min(view.nbytes, BOUNCE_BYTES - fill)
                    bounce[fill : fill + take] = view[:take]
                    fill += take
                    if take == view.nbytes:
                        pending.pop(0)
                    else:
                        pending[0] = view[take:]
                written = 0
                while written < fill:
                    n = os.pwrite(self._dfd, bounce[written:fill], offset + done + written)
                    if n <= 0:
                        raise OSError(5, "O_DIRECT write wrote nothing")
                    written += n
                done += fill
        except OSError as exc:
            if exc.errno != 22 or done:  # EINVAL before any byte: no O_DIRECT here
                raise
            os.close(self._dfd)
            self._dfd = None
            return False
        finally:
            bounce.release()
        return True

    def read(self, offset: int, length: int) -> bytes:
        self._check_open()
        self._check_read(offset, length)
        zone = offset // self.zone_size
        if (
            length
            and (offset + length - 1) // self.zone_size == zone
            and self._cond[zone] is not ZoneCondition.OFFLINE
            and (self._is_conventional(zone) or offset + length <= self._wp[zone])
            and length < 0x7FFFF000
        ):
            # Fast path: wholly written bytes of one zone; pread builds the bytes object.
            if self._trace is not None:
                self._trace.append(TraceRecord("read", zone, offset, length, time.perf_counter()))
            try:
                data = os.pread(self._fd, length, offset)
            except OSError as exc:
                raise ZoneError(
                    f"read failed: {exc.strerror}", drive=self.name, zone=zone, offset=offset,
                    errno=exc.errno,
                ) from exc
            if len(data) == length:
                return data
        buffer = bytearray(length)
        self.readinto(offset, memoryview(buffer))
        return bytes(buffer)

    def readinto(self, offset: int, buffer: memoryview) -> int:
        return self.readv(offset, [buffer])

    def readv(self, offset: int, buffers: Sequence[Buffer]) -> int:
        """Fill ``buffers`` back to back from ``offset`` with one vectored read; returns the bytes.

        The same rules as ``readinto`` for the whole span (4 KiB aligned
        offset and total length; bytes past a write pointer read as zeros), so
        a record's header block and payload can arrive in one system call.
        """
        self._check_open()
        views = fileio.as_views(buffers)
        length = sum(v.nbytes for v in views)
        self._check_read(offset, length)
        if length == 0:
            return 0
        zs = self.zone_size
        first = offset // zs
        last = (offset + length - 1) // zs
        if self._trace is not None:
            self._trace.append(TraceRecord("read", first, offset, length, time.perf_counter()))
        # Snapshot write pointers before reading: bytes written meanwhile past the
        # snapshot read as zeros, never as stale garbage.
        zero_ranges: list[tuple[int, int]] = []
        for z in range(first, last + 1):
            if self._cond[z] is ZoneCondition.OFFLINE:
                raise ZoneOfflineError(
                    "zone is OFFLINE", drive=self.name, zone=z, offset=max(offset, z * zs)
                )
            if self._is_conventional(z):
                continue
            seg_start = max(offset, z * zs)
            seg_end = min(offset + length, (z + 1) * zs)
            wp = self._wp[z]
            if wp < seg_end:
                zero_ranges.append((max(wp, seg_start) - offset, seg_end - offset))
        try:
            if len(views) == 1:
                fileio.preadv_all(self._fd, views[0], offset)
            else:
                fileio.preadv_views_all(self._fd, views, offset)
        except OSError as exc:
            raise ZoneError(
                f"read failed: {exc.strerror}", drive=self.name, zone=first, offset=offset,
                errno=exc.errno,
            ) from exc
        for a, b in zero_ranges:
            _zero_span(views, a, b)
        return length

    def prefetch(self, offset: int, length: int) -> None:
        """Hint that ``[offset, offset + length)`` will be read soon; returns without waiting.

        Only a hint to the backing file (``posix_fadvise(WILLNEED)``: the
        kernel queues the read): no rule is checked, no state changes, and
        errors are ignored, so a caller may prefetch speculatively.
        """
        if length <= 0 or self._closed:
            return
        try:
            os.posix_fadvise(self._fd, offset, length, os.POSIX_FADV_WILLNEED)
        except (OSError, AttributeError):
            pass

    def _check_read(self, offset: int, length: int) -> None:
        bs = self.block_size
        if offset % bs or length % bs:
            raise UnalignedIOError(
                f"read of {length} bytes is not aligned to {bs} bytes",
                drive=self.name, zone=self.zone_of(offset), offset=offset,
            )
        if offset < 0 or length < 0 or offset + length > self.capacity:
            raise OutOfRangeError(
                f"read of {length} bytes is outside the drive (capacity {self.capacity})",
                drive=self.name, offset=offset,
            )

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

    # ``EmulatedZonedDrive.open(path)`` opens a drive; ``drive.open(zone)`` opens a zone.
    open = DriveOrZoneOpen(open_drive, open_zone)

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

    def flush(self) -> None:
        """Make every completed write durable: data ``fdatasync``, then the write pointers."""
        self._check_open()
        if self._trace is not None:
            self._trace.append(TraceRecord("flush", -1, 0, 0, time.perf_counter()))
        with self._persist_lock:
            with self._lock:
                self._check_open()
                dirty, self._unflushed = self._unflushed, set()
                snapshot = [(z, self._wp[z]) for z in dirty]
                conv_flushed = len(self._conv_unflushed)
                last_write = self._last_write
            try:
                fileio.sync_data(self._fd)
                changed = False
                for z, wp in snapshot:
                    if self._durable_wp[z] != wp:
                        self._set_durable(z, wp)
                        changed = True
                if changed:
                    self._table.save_entries(self._entries)
            except BaseException:
                with self._lock:
                    self._unflushed |= dirty
                raise
            with self._lock:
                del self._conv_unflushed[:conv_flushed]
                if self._last_write == last_write:
                    self._last_write = None

    def _set_durable(self, zone: int, wp: int) -> None:
        """Record ``wp`` as ``zone``'s durable pointer (saved by the caller's next table save)."""
        self._durable_wp[zone] = wp
        self._entries[zone] = ZoneTable.encode(wp - zone * self.zone_size, self._failed[zone])

    def close_drive(self) -> None:
        """Flush, then release the files; further calls raise DriveClosedError. Idempotent."""
        if self._closed:
            return
        self.flush()
        self._release()

    def _release(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._fd)
            if self._dfd is not None:
                os.close(self._dfd)
                self._dfd = None
            if self._bounce is not None:
                self._bounce.close()
                self._bounce = None
            self._table.close()

    # -- failures and crashes (tests) ----------------------------------------------------
    def fail_zone(self, zone: int, condition: ZoneCondition) -> None:
        """Mark ``zone`` READ_ONLY or OFFLINE, as a failed head does; durable at once, terminal."""
        self._check_open()
        self._check_zone(zone)
        if condition not in _TERMINAL:
            raise UsageError(f"fail_zone takes READ_ONLY or OFFLINE, not {condition.name}")
        with self._persist_lock, self._lock:
            self._check_open()
            self._release_open(zone)
            self._failed[zone] = condition
            self._cond[zone] = condition
            self._set_durable(zone, self._durable_wp[zone])
            self._table.save_entries(self._entries)

    def simulate_process_crash(self) -> None:
        """Die without flushing: release the files, keep everything as it is on disk.

        Unflushed bytes stay in the file (the page cache survives a process
        death) but the zone table keeps the pointers of the last flush, so a
        reopened drive shows none of them (they read as zeros).
        """
        self._check_open()
        self._release()

    def simulate_power_cut(
        self,
        torn: bool = False,
        rng: random.Random | None = None,
        *,
        keep_blocks: int | None = None,
    ) -> tuple[int, int] | None:
        """Lose power: drop every unflushed write, then close the drive (reopen with ``open``).

        With ``torn``, the last unflushed write keeps a prefix of ``keep_blocks``
        blocks (random in 0..all when None, drawn from ``rng``), and earlier
        unflushed writes to its zone survive whole; see the module docstring.
        Returns ``(zone, new write pointer)`` of the torn zone, or None.
        """
        self._check_open()
        rng = rng or random.Random()
        torn_result: tuple[int, int] | None = None
        with self._persist_lock, self._lock:
            self._check_open()
            new_wp = list(self._durable_wp)
            kept: tuple[int, int] | None = None  # byte range of the last write that survives
            last = self._last_write
            if torn and last is not None and self._failed[last[0]] is None:
                zone, start, end = last
                blocks = (end - start) // self.block_size
                keep = rng.randint(0, blocks) if keep_blocks is None else keep_blocks
                keep = max(0, min(blocks, keep))
                kept = (start, start + keep * self.block_size)
                if not self._is_conventional(zone):
                    new_wp[zone] = kept[1]
                torn_result = (zone, kept[1])
            for z in range(self.conventional_zones, self.zone_count):
                if self._wp[z] > new_wp[z] and self._failed[z] is None:
                    fileio.discard(self._fd, new_wp[z], self._wp[z] - new_wp[z])
            for off, length in self._conv_unflushed:
                for a, b in _subtract((off, off + length), kept):
                    fileio.discard(self._fd, a, b - a)
            fileio.sync_data(self._fd)
            if torn_result is not None and not self._is_conventional(torn_result[0]):
                zone = torn_result[0]
                if new_wp[zone] != self._durable_wp[zone]:
                    self._set_durable(zone, new_wp[zone])
                    self._table.save_entries(self._entries)
            self._wp = new_wp
        self._release()
        return torn_result

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

    def __repr__(self) -> str:
        return (
            f"EmulatedZonedDrive({self.path!r}, zones={self.zone_count}x{self.zone_size}, "
            f"conventional={self.conventional_zones}, max_open={self.max_open_zones})"
        )


def _subtract(extent: tuple[int, int], hole: tuple[int, int] | None) -> list[tuple[int, int]]:
    """``extent`` minus ``hole`` as up to two half-open ranges."""
    a, b = extent
    if hole is None or hole[1] <= a or hole[0] >= b or hole[0] == hole[1]:
        return [(a, b)]
    out = []
    if a < hole[0]:
        out.append((a, hole[0]))
    if hole[1] < b:
        out.append((hole[1], b))
    return out


def _zero_span(views: list[memoryview], start: int, end: int) -> None:
    """Zero bytes ``[start, end)`` of the concatenation of ``views``."""
    pos = 0
    for view in views:
        n = view.nbytes
        a = max(start, pos)
        b = min(end, pos + n)
        if a < b:
            fileio.zero_fill(view, a - pos, b - pos)
        pos += n
        if pos >= end:
            break
