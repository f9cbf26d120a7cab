"""Linux zoned block devices (HM-SMR disks, null_blk, ZNS) through the kernel's zone ioctls.

The kernel and the device track every zone's write pointer and condition;
this backend keeps none of it in Python. A write goes straight to
``pwritev`` at the offset asked (O_DIRECT, so it reaches the device in one
piece), and only when the kernel rejects it does the backend report that zone
to turn the bare ``OSError`` into the precise typed error (write pointer
violation, FULL, READ_ONLY, OFFLINE, too many open zones). ``append`` asks the
kernel for the write pointer (one BLKREPORTZONE) and writes there, under a
per-drive lock.

Struct layouts and ioctl numbers come from ``include/uapi/linux/blkzoned.h``;
the pack/parse functions below take and return plain bytes so they can be
tested without a device (``tests/zoned/test_linux_ioctls.py`` checks them
against the header with the C compiler when one is present).

O_DIRECT needs page-aligned buffers: ``aligned_buffer`` allocates them (an
anonymous mmap). Callers that pass aligned memory avoid any copy; anything
else goes through a reused bounce buffer in ``BOUNCE_SIZE`` pieces.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
    Buffer,
    DriveOrZoneOpen,
    TraceRecord,
    ZoneCondition,
    ZonedDrive,
    ZoneInfo,
    ZoneType,
)

SECTOR = 512

# ioctl numbers (include/uapi/linux/blkzoned.h), _IOWR/_IOW/_IOR(0x12, nr, type).
BLKREPORTZONE = 0xC0101282
BLKRESETZONE = 0x40101283
BLKGETZONESZ = 0x80041284
BLKGETNRZONES = 0x80041285
BLKOPENZONE = 0x40101286
BLKCLOSEZONE = 0x40101287
BLKFINISHZONE = 0x40101288

BLK_ZONE_REP_CAPACITY = 1

BLK_ZONE = struct.Struct("<QQQBBBB4sQ24s")  # struct blk_zone, 64 bytes
BLK_ZONE_REPORT = struct.Struct("<QII")  # struct blk_zone_report header, 16 bytes
BLK_ZONE_RANGE = struct.Struct("<QQ")  # struct blk_zone_range, 16 bytes
U32 = struct.Struct("<I")

REPORT_BATCH = 4096  # zones per BLKREPORTZONE call (256 KiB of descriptors)
BOUNCE_SIZE = 4 * 1024 * 1024


# -- kernel structs, as plain bytes --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlkZone:
    """One ``struct blk_zone`` as the kernel filled it (positions in 512 B sectors)."""

    start: int
    len: int
    wp: int
    type: int
    cond: int
    non_seq: int
    reset: int
    capacity: int

    def to_zone_info(self, index: int, flags: int) -> ZoneInfo:
        """Byte-based ``ZoneInfo``; capacity is ``len`` unless the report flags it valid."""
        capacity = self.capacity if flags & BLK_ZONE_REP_CAPACITY else self.len
        conventional = self.type == ZoneType.CONVENTIONAL
        return ZoneInfo(
            index=index,
            start=self.start * SECTOR,
            size=self.len * SECTOR,
            capacity=capacity * SECTOR,
            write_pointer=self.start * SECTOR if conventional else self.wp * SECTOR,
            type=ZoneType(self.type),
            condition=ZoneCondition(self.cond),
        )


def pack_blk_zone(zone: BlkZone) -> bytes:
    """``struct blk_zone`` bytes (for tests and for fake reports)."""
    return BLK_ZONE.pack(
        zone.start, zone.len, zone.wp, zone.type, zone.cond, zone.non_seq, zone.reset,
        bytes(4), zone.capacity, bytes(24),
    )


def pack_report_request(sector: int, nr_zones: int) -> bytearray:
    """A BLKREPORTZONE argument: header asking for ``nr_zones`` from ``sector``, room for them."""
    buf = bytearray(BLK_ZONE_REPORT.size + nr_zones * BLK_ZONE.size)
    BLK_ZONE_REPORT.pack_into(buf, 0, sector, nr_zones, 0)
    return buf


def parse_report(buf: Buffer) -> tuple[int, list[BlkZone]]:
    """Parse a filled BLKREPORTZONE buffer: ``(flags, zones)`` (``nr_zones`` of them)."""
    _sector, nr_zones, flags = BLK_ZONE_REPORT.unpack_from(buf, 0)
    room = (len(buf) - BLK_ZONE_REPORT.size) // BLK_ZONE.size
    if nr_zones > room:
        raise ValueError(f"report claims {nr_zones} zones but has room for {room}")
    zones = []
    for i in range(nr_zones):
        start, length, wp, ztype, cond, non_seq, reset, _resv, cap, _rsv = BLK_ZONE.unpack_from(
            buf, BLK_ZONE_REPORT.size + i * BLK_ZONE.size
        )
        zones.append(BlkZone(start, length, wp, ztype, cond, non_seq, reset, cap))
    return flags, zones


def pack_zone_range(sector: int, nr_sectors: int) -> bytes:
    """A ``struct blk_zone_range`` for BLKRESETZONE/BLKOPENZONE/BLKCLOSEZONE/BLKFINISHZONE."""
    return BLK_ZONE_RANGE.pack(sector, nr_sectors)


# -- sysfs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """What ``/sys/block/<dev>/queue`` says about a zoned device (0 = no limit / unknown)."""

    zoned: str  # "host-managed", "host-aware" or "none"
    zone_sectors: int  # chunk_sectors
    nr_zones: int
    max_open_zones: int
    max_active_zones: int
    logical_block_size: int
    physical_block_size: int


def read_queue_limits(queue_dir: str | os.PathLike[str]) -> QueueLimits:
    """Parse a ``queue`` sysfs directory; missing files read as 0 ("none" for ``zoned``)."""
    q = Path(queue_dir)

    def text(name: str, default: str) -> str:
        try:
            return (q / name).read_text().strip()
        except FileNotFoundError:
            return default

    def number(name: str) -> int:
        value = text(name, "0")
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{q / name}: expected a number, read {value!r}") from None

    return QueueLimits(
        zoned=text("zoned", "none"),
        zone_sectors=number("chunk_sectors"),
        nr_zones=number("nr_zones"),
        max_open_zones=number("max_open_zones"),
        max_active_zones=number("max_active_zones"),
        logical_block_size=number("logical_block_size") or SECTOR,
        physical_block_size=number("physical_block_size") or SECTOR,
    )


def queue_dir_for(device: str, sysfs: str = "/sys") -> Path:
    """``/sys/block/<name>/queue`` for a device node such as ``/dev/sdb`` or ``/dev/nullb0``."""
    name = os.path.basename(os.path.realpath(device))
    return Path(sysfs) / "block" / name / "queue"


# -- aligned memory ------------------------------------------------------------------------


def aligned_buffer(size: int) -> mmap.mmap:
    """A zero-filled, page-aligned buffer of ``size`` bytes, usable for O_DIRECT I/O."""
    return mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def is_aligned(view: memoryview, alignment: int) -> bool:
    """True when the buffer's address and length are multiples of ``alignment``."""
    if view.nbytes % alignment:
        return False
    import numpy as np  # lazily: only O_DIRECT users pay for the import

    address = np.frombuffer(view, dtype=np.uint8).ctypes.data if view.nbytes else 0
    return address % alignment == 0


# -- error classification ------------------------------------------------------------------


def classify_write_error(
    exc: OSError, zone: ZoneInfo | None, offset: int, length: int, drive: str
) -> ZoneError:
    """Turn the kernel's bare errno for a failed write into the typed error, given the zone.

    ``zone`` is the zone as reported right after the failure (None when the
    report itself failed). The order mirrors what the device checks.
    """
    z = None if zone is None else zone.index
    code = exc.errno
    if code == errno.ETOOMANYREFS:
        return TooManyOpenZones("the device has no open-zone resource left", drive=drive,
                                zone=z, offset=offset)
    if code == errno.EOVERFLOW:  # BLK_STS_ZONE_ACTIVE_RESOURCE: ZNS or null_blk zone_max_active
        return TooManyOpenZones("the device has no active-zone resource left", drive=drive,
                                zone=z, offset=offset, errno=code,
                                hint="finish or reset a partly written zone")
    if zone is not None:
        if zone.condition is ZoneCondition.OFFLINE:
            return ZoneOfflineError("zone is OFFLINE", drive=drive, zone=z, offset=offset,
                                    errno=code)
        if zone.condition is ZoneCondition.READ_ONLY:
            return ZoneReadOnlyError("zone is READ_ONLY", drive=drive, zone=z, offset=offset,
                                     errno=code)
        if zone.type is not ZoneType.CONVENTIONAL:
            if zone.condition is ZoneCondition.FULL:
                return ZoneFullError("zone is FULL", drive=drive, zone=z, offset=offset,
                                     errno=code)
            if offset != zone.write_pointer:
                return WritePointerViolation(
                    f"write is not at the write pointer {zone.write_pointer}",
                    drive=drive, zone=z, offset=offset, errno=code,
                )
            if offset + length > zone.start + zone.capacity:
                return ZoneBoundaryError("write crosses the zone capacity", drive=drive,
                                         zone=z, offset=offset, errno=code)
    return ZoneError(f"write failed: {exc.strerror}", drive=drive, zone=z, offset=offset,
                     errno=code)


# -- the drive -----------------------------------------------------------------------------


class LinuxZonedDrive(ZonedDrive):
    """A zoned block device opened with O_DIRECT; see the module docstring. Thread-safe.

    Differences from the emulated drive: bytes past a write pointer read as
    whatever the device returns (zeros on null_blk and on drives reporting
    URSWRZ; an error on others); durability is the device's (``flush`` is
    ``fdatasync``, which issues a cache flush); conventional zones are
    counted as the leading run of CONVENTIONAL zones.
    """

    kind = "linux"

    def __init__(self, path: str, fd: int, limits: QueueLimits, zone_size: int, zone_count: int,
                 name: str, *, conventional_zones: int | None = None) -> None:
        """Wrap an open ``fd``; use ``open(path)``. ``conventional_zones`` None: count from a report."""
        self.path = path
        self.name = name
        self.limits = limits
        self.zone_size = zone_size
        self.zone_count = zone_count
        self.max_open_zones = limits.max_open_zones
        self.block_size = max(BLOCK_SIZE, limits.physical_block_size, limits.logical_block_size)
        self._fd = fd
        self._closed = False
        self._append_lock = threading.Lock()
        self._bounce_lock = threading.Lock()
        self._bounce: mmap.mmap | None = None
        self._trace: list[TraceRecord] | None = None
        if conventional_zones is None:
            zones = self.report_zones()
            conventional_zones = 0
            while (conventional_zones < len(zones)
                   and zones[conventional_zones].type is ZoneType.CONVENTIONAL):
                conventional_zones += 1
        self.conventional_zones = conventional_zones

    @classmethod
    def open_drive(cls, path: str | os.PathLike[str], *, name: str | None = None,
                   sysfs: str = "/sys") -> LinuxZonedDrive:
        """Open zoned block device ``path`` (O_RDWR | O_DIRECT | O_EXCL)."""
        path = os.fspath(path)
        name = name or os.path.basename(path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise DriveFormatError(f"{path} does not exist", drive=name) from None
        if not stat.S_ISBLK(st.st_mode):
            raise DriveFormatError(
                f"{path} is not a block device", drive=name,
                hint="use smr:PATH for an emulated drive on a file",
            )
        limits = read_queue_limits(queue_dir_for(path, sysfs))
        if limits.zoned == "none":
            raise DriveFormatError(
                f"{path} is not a zoned device (queue/zoned is 'none')", drive=name,
                hint="use conventional:PATH for an ordinary disk",
            )
        try:
            fd = os.open(path, os.O_RDWR | os.O_DIRECT | os.O_EXCL)
        except OSError as exc:
            raise ZoneError(
                f"cannot open {path}: {exc.strerror}", drive=name, errno=exc.errno,
                hint="it must not be mounted or held by another process (O_EXCL), and "
                "needs root or the disk group",
            ) from exc
        try:
            zone_sectors = _ioctl_u32(fd, BLKGETZONESZ)
            zone_count = _ioctl_u32(fd, BLKGETNRZONES)
            return cls(path, fd, limits, zone_sectors * SECTOR, zone_count, name)
        except BaseException:
            os.close(fd)
            raise

    # -- zone reports -----------------------------------------------------------------------
    def report_zones(self, start_zone: int = 0, count: int | None = None) -> list[ZoneInfo]:
        self._check_open()
        self._check_zone(start_zone)
        end = self.zone_count if count is None else min(self.zone_count, start_zone + count)
        out: list[ZoneInfo] = []
        index = start_zone
        while index < end:
            want = min(REPORT_BATCH, end - index)
            buf = pack_report_request(index * self.zone_size // SECTOR, want)
            try:
                fcntl.ioctl(self._fd, BLKREPORTZONE, buf, True)
            except OSError as exc:
                raise ZoneError(f"zone report failed: {exc.strerror}", drive=self.name,
                                zone=index, errno=exc.errno) from exc
            flags, zones = parse_report(buf)
            if not zones:
                break
            for blk in zones[: end - index]:
                out.append(blk.to_zone_info(index, flags))
                index += 1
        return out

    # -- I/O ------------------------------------------------------------------------------
    def write(self, zone: int, offset: int, data: Buffer | Sequence[Buffer]) -> None:
        self._check_open()
        views = fileio.as_views(data)
        self._write(zone, offset, views, sum(v.nbytes for v in views))

    def append(self, zone: int, data: Buffer | Sequence[Buffer]) -> int:
        self._check_open()
        self._check_zone(zone)
        if zone < self.conventional_zones:
            raise ZoneTypeError("append is not defined for a conventional zone",
                                drive=self.name, zone=zone)
        views = fileio.as_views(data)
        with self._append_lock:
            offset = self.zone_info(zone).write_pointer
            self._write(zone, offset, views, sum(v.nbytes for v in views))
        return offset

    def _write(self, zone: int, offset: int, views: list[memoryview], length: int) -> None:
        self._check_zone(zone)
        bs = self.block_size
        if offset % bs or length % bs:
            raise UnalignedIOError(f"write of {length} bytes is not aligned to {bs} bytes",
                                   drive=self.name, zone=zone, offset=offset)
        start = zone * self.zone_size
        if not start <= offset <= start + self.zone_size:
            raise ZoneBoundaryError(f"offset is outside the zone [{start}, "
                                    f"{start + self.zone_size})", drive=self.name, zone=zone,
                                    offset=offset)
        if offset + length > start + self.zone_size:
            raise ZoneBoundaryError(f"write of {length} bytes crosses the zone end",
                                    drive=self.name, zone=zone, offset=offset)
        if self._trace is not None:
            self._trace.append(TraceRecord("write", zone, offset, length, time.perf_counter()))
        if not length:
            return
        try:
            if all(is_aligned(v, mmap.PAGESIZE) for v in views):
                fileio.pwritev_all(self._fd, views, offset)
            else:
                self._bounce_write(views, offset)
        except OSError as exc:
            try:
                info: ZoneInfo | None = self.zone_info(zone)
            except ZoneError:
                info = None
            raise classify_write_error(exc, info, offset, length, self.name) from exc

    def _bounce_write(self, views: list[memoryview], offset: int) -> None:
        with self._bounce_lock:
            bounce = self._bounce_buffer()
            fill = 0
            for view in views:
                pos = 0
                while pos < view.nbytes:
                    n = min(BOUNCE_SIZE - fill, view.nbytes - pos)
                    bounce[fill : fill + n] = view[pos : pos + n]
                    fill += n
                    pos += n
                    if fill == BOUNCE_SIZE:
                        fileio.pwritev_all(self._fd, [memoryview(bounce)], offset)
                        offset += fill
                        fill = 0
            if fill:
                fileio.pwritev_all(self._fd, [memoryview(bounce)[:fill]], offset)

    def _bounce_buffer(self) -> mmap.mmap:
        if self._bounce is None:
            self._bounce = aligned_buffer(BOUNCE_SIZE)
        return self._bounce

    def read(self, offset: int, length: int) -> bytes:
        self._check_open()
        self._check_read(offset, length)
        if length == 0:
            return b""
        # O_DIRECT needs an aligned target; the mmap is freed with its last reference
        # (closing it here could fail while a traceback still holds a view of it).
        buffer = aligned_buffer(length)
        self.readinto(offset, memoryview(buffer))
        return buffer[:length]

    def readinto(self, offset: int, buffer: memoryview) -> int:
        self._check_open()
        view = memoryview(buffer)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        length = view.nbytes
        self._check_read(offset, length)
        if self._trace is not None:
            self._trace.append(TraceRecord("read", self.zone_of(offset), offset, length,
                                           time.perf_counter()))
        try:
            if is_aligned(view, mmap.PAGESIZE) and not view.readonly:
                fileio.preadv_all(self._fd, view, offset)
            else:
                with self._bounce_lock:
                    bounce = self._bounce_buffer()
                    pos = 0
                    while pos < length:
                        n = min(BOUNCE_SIZE, length - pos)
                        fileio.preadv_all(self._fd, memoryview(bounce)[:n], offset + pos)
                        view[pos : pos + n] = memoryview(bounce)[:n]
                        pos += n
        except OSError as exc:
            zone = self.zone_of(offset)
            try:
                cond = self.zone_info(zone).condition
            except ZoneError:
                cond = None
            if cond is ZoneCondition.OFFLINE:
                raise ZoneOfflineError("zone is OFFLINE", drive=self.name, zone=zone,
                                       offset=offset, errno=exc.errno) from exc
            raise ZoneError(f"read failed: {exc.strerror}", drive=self.name, zone=zone,
                            offset=offset, errno=exc.errno) from exc
        return length

    def _check_read(self, offset: int, length: int) -> None:
        bs = self.block_size
        if offset % bs or length % bs:
            raise UnalignedIOError(f"read of {length} bytes is not aligned to {bs} bytes",
                                   drive=self.name, zone=self.zone_of(offset), offset=offset)
        if offset < 0 or length < 0 or offset + length > self.capacity:
            raise OutOfRangeError(f"read of {length} bytes is outside the drive",
                                  drive=self.name, offset=offset)

    # -- zone management ------------------------------------------------------------------
    def _zone_command(self, op: str, request: int, zone: int) -> None:
        self._check_open()
        self._check_zone(zone)
        if zone < self.conventional_zones:
            raise ZoneTypeError(f"{op} is not defined for a conventional zone",
                                drive=self.name, zone=zone)
        if self._trace is not None:
            self._trace.append(TraceRecord(op, zone, zone * self.zone_size, 0,
                                           time.perf_counter()))
        arg = pack_zone_range(zone * self.zone_size // SECTOR, self.zone_size // SECTOR)
        try:
            fcntl.ioctl(self._fd, request, arg)
        except OSError as exc:
            at = zone * self.zone_size
            if exc.errno in (errno.ETOOMANYREFS, errno.EOVERFLOW):
                kind = "open" if exc.errno == errno.ETOOMANYREFS else "active"
                raise TooManyOpenZones(f"{op}: no {kind}-zone resource left", drive=self.name,
                                       zone=zone, offset=at, errno=exc.errno) from exc
            try:
                cond = self.zone_info(zone).condition
            except ZoneError:
                cond = None
            error: type[ZoneError] = ZoneError
            message = f"{op} failed: {exc.strerror}"
            if cond is ZoneCondition.OFFLINE:
                error, message = ZoneOfflineError, f"{op}: zone is OFFLINE"
            elif cond is ZoneCondition.READ_ONLY:
                error, message = ZoneReadOnlyError, f"{op}: zone is READ_ONLY"
            elif cond is ZoneCondition.FULL and op == "open":
                error, message = ZoneFullError, "cannot open a FULL zone"
            raise error(message, drive=self.name, zone=zone, offset=at, errno=exc.errno) from exc

    def reset(self, zone: int) -> None:
        self._zone_command("reset", BLKRESETZONE, zone)

    def open_zone(self, zone: int) -> None:
        self._zone_command("open", BLKOPENZONE, zone)

    open = DriveOrZoneOpen(open_drive, open_zone)

    def close(self, zone: int) -> None:
        self._zone_command("close", BLKCLOSEZONE, zone)

    def finish(self, zone: int) -> None:
        self._zone_command("finish", BLKFINISHZONE, zone)

    def flush(self) -> None:
        """``fdatasync`` on the device: the kernel issues a cache flush to the drive."""
        self._check_open()
        if self._trace is not None:
            self._trace.append(TraceRecord("flush", -1, 0, 0, time.perf_counter()))
        fileio.sync_data(self._fd)

    def close_drive(self) -> None:
        if self._closed:
            return
        fileio.sync_data(self._fd)
        self._closed = True
        os.close(self._fd)
        if self._bounce is not None:
            try:
                self._bounce.close()
            except BufferError:  # a view still held by a traceback: freed with it
                pass
            self._bounce = None

    # -- checks and tracing -----------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise DriveClosedError("the drive is closed", drive=self.name)

    def _check_zone(self, zone: int) -> None:
        if not 0 <= zone < self.zone_count:
            raise OutOfRangeError(f"zone {zone} not in 0..{self.zone_count - 1}",
                                  drive=self.name, zone=zone)

    def start_trace(self) -> None:
        self._trace = []

    def stop_trace(self) -> list[TraceRecord]:
        records, self._trace = self._trace or [], None
        return records

    def __repr__(self) -> str:
        return (f"LinuxZonedDrive({self.path!r}, zones={self.zone_count}x{self.zone_size}, "
                f"conventional={self.conventional_zones}, max_open={self.max_open_zones})")


def _ioctl_u32(fd: int, request: int) -> int:
    buf = bytearray(4)
    fcntl.ioctl(fd, request, buf, True)
    return U32.unpack(buf)[0]
