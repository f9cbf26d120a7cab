"""A conventional drive (flash or CMR) on a file: every zone CONVENTIONAL.

Same read/write interface as the zoned backends, so the slice store can put
its hot tier on flash: zones are only an address partition here (default
256 MiB each), writes may land anywhere (4 KiB aligned, never across a zone),
and overwrites in place are allowed. There are no write pointers, so the
sequential-zone commands (append, reset, open, close, finish) raise
``ZoneTypeError``; ``discard`` frees a range instead (a TRIM).

Durability: ``write`` returns with the bytes in the page cache; ``flush`` is
``fdatasync``. After a crash an unflushed write may be present, absent or (per
4 KiB block) partly present: callers checksum what they write.

Geometry (zone size and count) is kept in the same ``<path>.zones`` table the
emulated drive uses, so ``ConventionalDrive.open(path)`` needs nothing else.
``path`` may be a directory, in which case the data file is ``<dir>/drive.img``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

from shinglefs.errors import UsageError
from shinglefs.zoned import fileio
from shinglefs.zoned.errors import (
    DriveClosedError,
    DriveFormatError,
    OutOfRangeError,
    UnalignedIOError,
    ZoneBoundaryError,
    ZoneError,
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

DIRECTORY_DATA_FILE = "drive.img"


def _data_path(path: str | os.PathLike[str]) -> str:
    path = os.fspath(path)
    return os.path.join(path, DIRECTORY_DATA_FILE) if os.path.isdir(path) else path


class ConventionalDrive(ZonedDrive):
    """A flash or CMR drive on a file; see the module docstring. Thread-safe."""

    kind = "conventional"
    is_zoned = False
    abilities = DriveAbilities(discard=True)
    max_open_zones = 0

    def __init__(self, path: str, fd: int, geometry: Geometry, name: str) -> None:
        self.path = path
        self.name = name
        self.zone_size = geometry.zone_size
        self.zone_count = geometry.zone_count
        self.conventional_zones = geometry.zone_count
        self.block_size = geometry.block_size
        self._fd = fd
        self._closed = False
        self._lock = threading.Lock()
        self._trace: list[TraceRecord] | None = None

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        size: int | None = None,
        zone_count: int | None = None,
        zone_size: int = DEFAULT_ZONE_SIZE,
        block_size: int = BLOCK_SIZE,
        name: str | None = None,
    ) -> ConventionalDrive:
        """Create a sparse drive file of ``size`` bytes (whole zones) or ``zone_count`` zones."""
        data = _data_path(path)
        if zone_size <= 0 or block_size <= 0 or zone_size % block_size:
            raise UsageError(
                f"zone size {zone_size} is not a positive multiple of the block size {block_size}"
            )
        if zone_count is None:
            if size is None:
                raise UsageError("give the drive a size or a zone_count")
            zone_count = size // zone_size
        if zone_count < 1:
            raise UsageError(
                f"a drive needs at least one zone of {zone_size} bytes",
                hint="give a larger size or a smaller zone size",
            )
        geometry = Geometry(zone_size, zone_count, zone_count, 0, block_size)
        name = name or os.path.basename(os.fspath(path).rstrip("/"))
        try:
            fd = os.open(data, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise UsageError(
                f"{data} already exists", hint="format never overwrites a drive: choose a new path for it"
            ) from None
        except OSError as exc:
            raise UsageError(f"cannot create {data}: {exc.strerror}") from None
        try:
            os.ftruncate(fd, geometry.capacity)
            fileio.sync_file(fd)
            ZoneTable.create(data + ".zones", geometry, name).close()
        except BaseException:
            os.close(fd)
            os.unlink(data)
            raise
        return cls(data, fd, geometry, name)

    @classmethod
    def open_drive(
        cls, path: str | os.PathLike[str], *, name: str | None = None
    ) -> ConventionalDrive:
        """Open an existing drive created by ``create``."""
        data = _data_path(path)
        name = name or os.path.basename(os.fspath(path).rstrip("/"))
        table, _, _ = ZoneTable.load(data + ".zones", name)
        table.close()
        geometry = table.geometry
        if geometry.conventional_zones != geometry.zone_count:
            raise DriveFormatError(
                f"{data} is a zoned drive, not a conventional one", drive=name,
                hint="open it as emulated (smr:) instead",
            )
        try:
            fd = os.open(data, os.O_RDWR)
        except FileNotFoundError:
            raise DriveFormatError(f"data file {data} not found", drive=name,
                                   hint="put the drive's data file back at this path beside "
                                   "its .zones table") from None
        if os.lseek(fd, 0, os.SEEK_END) < geometry.capacity:
            os.close(fd)
            raise DriveFormatError("data file is shorter than its zone table says", drive=name,
                                   hint="the file was truncated or replaced: put the whole file "
                                   "back (a copy must keep its size; `cp --sparse=always` does)")
        return cls(data, fd, geometry, name)

    # -- descriptors ----------------------------------------------------------------------
    def report_zones(self, start_zone: int = 0, count: int | None = None) -> list[ZoneInfo]:
        self._check_open()
        self._check_zone(start_zone)
        end = self.zone_count if count is None else min(self.zone_count, start_zone + count)
        zs = self.zone_size
        return [
            ZoneInfo(z, z * zs, zs, zs, z * zs, ZoneType.CONVENTIONAL, ZoneCondition.NOT_WP)
            for z in range(start_zone, end)
        ]

    # -- I/O ------------------------------------------------------------------------------
    def write(self, zone: int, offset: int, data: Buffer | Sequence[Buffer]) -> None:
        self._check_open()
        self._check_zone(zone)
        views = fileio.as_views(data)
        length = sum(v.nbytes for v in views)
        bs = self.block_size
        if offset % bs or length % bs:
            raise UnalignedIOError(
                f"write of {length} bytes is not aligned to {bs} bytes",
                drive=self.name, zone=zone, offset=offset,
            )
        start = zone * self.zone_size
        end = start + self.zone_size
        if not start <= offset or offset + length > end:
            raise ZoneBoundaryError(
                f"write of {length} bytes does not fit in the zone [{start}, {end})",
                drive=self.name, zone=zone, offset=offset,
            )
        if self._trace is not None:
            self._trace.append(TraceRecord("write", zone, offset, length, time.perf_counter()))
        try:
            fileio.pwritev_all(self._fd, views, offset)
        except OSError as exc:
            raise ZoneError(f"write failed: {exc.strerror}", drive=self.name, zone=zone,
                            offset=offset, errno=exc.errno) from exc

    def read(self, offset: int, length: int) -> bytes:
        self._check_open()
        self._check_read(offset, length)
        if self._trace is not None:
            self._trace.append(TraceRecord("read", offset // self.zone_size, offset, length,
                                           time.perf_counter()))
        if length < 0x7FFFF000:
            try:
                data = os.pread(self._fd, length, offset)
            except OSError as exc:
                raise ZoneError(f"read failed: {exc.strerror}", drive=self.name,
                                zone=offset // self.zone_size, offset=offset,
                                errno=exc.errno) from exc
            if len(data) == length:
                return data
        buffer = bytearray(length)
        self._readinto(offset, memoryview(buffer))
        return bytes(buffer)

    def readinto(self, offset: int, buffer: memoryview) -> int:
        self._check_open()
        view = memoryview(buffer)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        self._check_read(offset, view.nbytes)
        if self._trace is not None:
            self._trace.append(TraceRecord("read", offset // self.zone_size, offset, view.nbytes,
                                           time.perf_counter()))
        return self._readinto(offset, view)

    def _readinto(self, offset: int, view: memoryview) -> int:
        try:
            return fileio.preadv_all(self._fd, view, offset)
        except OSError as exc:
            raise ZoneError(f"read failed: {exc.strerror}", drive=self.name,
                            zone=offset // self.zone_size, offset=offset,
                            errno=exc.errno) from exc

    def discard(self, offset: int, length: int) -> None:
        """Free ``[offset, offset+length)`` (a TRIM): it reads as zeros; volatile until flush."""
        self._check_open()
        self._check_read(offset, length)
        fileio.discard(self._fd, offset, length)

    def _check_open(self) -> None:
        if self._closed:
            raise DriveClosedError("the drive is closed", drive=self.name)

    def _check_zone(self, zone: int) -> None:
        if not 0 <= zone < self.zone_count:
            raise OutOfRangeError(
                f"zone {zone} not in 0..{self.zone_count - 1}", drive=self.name, zone=zone
            )

    def _check_read(self, offset: int, length: int) -> None:
        bs = self.block_size
        if offset % bs or length % bs:
            raise UnalignedIOError(
                f"I/O of {length} bytes is not aligned to {bs} bytes",
                drive=self.name, zone=offset // self.zone_size, offset=offset,
            )
        if offset < 0 or length < 0 or offset + length > self.capacity:
            raise OutOfRangeError(
                f"I/O of {length} bytes is outside the drive (capacity {self.capacity})",
                drive=self.name, offset=offset,
            )

    # -- zone commands: not defined on conventional zones -------------------------------
    def _no_zone_command(self, op: str, zone: int) -> ZoneTypeError:
        self._check_open()
        self._check_zone(zone)
        return ZoneTypeError(
            f"{op} is not defined for a conventional zone", drive=self.name, zone=zone,
            hint="conventional drives take writes anywhere; use discard to free space",
        )

    def append(self, zone: int, data: Buffer | Sequence[Buffer]) -> int:
        raise self._no_zone_command("append", zone)

    def reset(self, zone: int) -> None:
        raise self._no_zone_command("reset", zone)

    def open_zone(self, zone: int) -> None:
        raise self._no_zone_command("open", zone)

    open = DriveOrZoneOpen(open_drive, open_zone)

    def close(self, zone: int) -> None:
        raise self._no_zone_command("close", zone)

    def finish(self, zone: int) -> None:
        raise self._no_zone_command("finish", zone)

    # -- durability and lifetime ----------------------------------------------------------
    def flush(self) -> None:
        """``fdatasync``: every completed write is durable when this returns."""
        self._check_open()
        if self._trace is not None:
            self._trace.append(TraceRecord("flush", -1, 0, 0, time.perf_counter()))
        fileio.sync_data(self._fd)

    def close_drive(self) -> None:
        """Flush and release the file; further calls raise DriveClosedError. Idempotent."""
        with self._lock:
            if self._closed:
                return
            fileio.sync_data(self._fd)
            self._closed = True
            os.close(self._fd)

    def start_trace(self) -> None:
        self._trace = []

    def stop_trace(self) -> list[TraceRecord]:
        records, self._trace = self._trace or [], None
        return records

    def __repr__(self) -> str:
        return f"ConventionalDrive({self.path!r}, zones={self.zone_count}x{self.zone_size})"
