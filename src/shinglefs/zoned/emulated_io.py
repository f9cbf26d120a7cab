"""Data I/O of an emulated drive: sequential and conventional writes, vectored reads, hints.

``EmulatedIO`` sits between ``EmulatedZones`` (emulated_zones.py: the rules
and zone state it checks against) and ``EmulatedZonedDrive`` (emulated.py).
Writes are checked against every rule before a byte moves, and traced after;
they go around the page cache (``DirectWriter``) where the file allows it.
Reads snapshot the write pointers first: bytes past a write pointer read as
zeros, never as stale garbage.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Sequence

from shinglefs.zoned import fileio
from shinglefs.zoned.directio import ALIGN, page_aligned
from shinglefs.zoned.emulated_zones import EmulatedZones
from shinglefs.zoned.errors import (
    OutOfRangeError,
    UnalignedIOError,
    WritePointerViolation,
    ZoneBoundaryError,
    ZoneError,
    ZoneFullError,
    ZoneOfflineError,
)
from shinglefs.zoned.model import Buffer, TraceRecord, ZoneCondition


class EmulatedIO(EmulatedZones):
    """Writes and reads of an emulated drive (see the module docstring)."""

    @property
    def writes_direct(self) -> bool:
        """True while writes go around the page cache (O_DIRECT); False once refused or never on."""
        return self._direct is not None


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
            self._check_image()
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
            if self._direct is not None:
                if self._direct.write(views, offset, length):
                    return
                self._direct = None  # O_DIRECT refused: buffered from now on
            fileio.pwritev_all(self._fd, views, offset)
        except OSError as exc:
            raise ZoneError(
                f"write failed: {exc.strerror}", drive=self.name, zone=zone, offset=offset,
                errno=exc.errno,
            ) from exc

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
            if not self._read_direct(views, offset):
                _preadv(self._fd, views, offset)
        except OSError as exc:
            raise ZoneError(
                f"read failed: {exc.strerror}", drive=self.name, zone=first, offset=offset,
                errno=exc.errno,
            ) from exc
        for a, b in zero_ranges:
            _zero_span(views, a, b)
        return length

    def _read_direct(self, views: list[memoryview], offset: int) -> bool:
        """Read around the page cache when the drive may and every view is
        page-aligned (directio.py); False when not done (the caller reads
        buffered). A file that refuses a direct read (EINVAL) is read
        buffered from then on."""
        fd = self._direct_reads
        if fd is None or not self._reads_direct or offset % ALIGN or not page_aligned(views):
            return False
        try:
            _preadv(fd, views, offset)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._reads_direct = False  # its descriptor closes with the drive
            return False
        return True

    def _close_direct_reads(self) -> None:
        """Close the direct-read descriptor (the drive closing). Idempotent."""
        fd, self._direct_reads = self._direct_reads, None
        self._reads_direct = False
        if fd is not None:
            os.close(fd)

    @property
    def reads_direct(self) -> bool:
        """True while page-aligned reads go around the page cache (O_DIRECT)."""
        return self._reads_direct

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


def _preadv(fd: int, views: list[memoryview], offset: int) -> None:
    """Fill ``views`` back to back from ``offset`` of ``fd`` (one buffer: the
    simpler loop)."""
    if len(views) == 1:
        fileio.preadv_all(fd, views[0], offset)
    else:
        fileio.preadv_views_all(fd, views, offset)


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
