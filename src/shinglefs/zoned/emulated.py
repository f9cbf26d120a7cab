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

import os
import random
import stat
import time

from shinglefs.errors import UsageError
from shinglefs.zoned import fileio
from shinglefs.zoned.directio import BOUNCE_BYTES, DIRECT_ENV, direct_writes_from_env
from shinglefs.zoned.emulated_io import EmulatedIO
from shinglefs.zoned.emulated_zones import EmulatedZones
from shinglefs.zoned.errors import DriveFormatError
from shinglefs.zoned.model import (
    BLOCK_SIZE,
    DEFAULT_ZONE_SIZE,
    DriveAbilities,
    DriveOrZoneOpen,
    TraceRecord,
    ZoneCondition,
)
from shinglefs.zoned.zonetable import Geometry, ZoneTable

__all__ = [
    "BOUNCE_BYTES",
    "DEFAULT_MAX_OPEN_ZONES",
    "DIRECT_ENV",
    "EmulatedZonedDrive",
    "default_conventional_zones",
    "direct_writes_from_env",
]

DEFAULT_MAX_OPEN_ZONES = 128
_TERMINAL = (ZoneCondition.READ_ONLY, ZoneCondition.OFFLINE)


def default_conventional_zones(zone_count: int) -> int:
    """About 1% of the zones, at least one when the drive has two or more (HC620: 524/55,880)."""
    return 0 if zone_count < 2 else max(1, zone_count // 100)


class EmulatedZonedDrive(EmulatedIO):
    """A host-managed SMR drive emulated on a file; see the module docstring for the model.

    Build with ``create`` (new drive) or ``open`` (existing one), not the constructor.
    Its code: zone state and commands in ``EmulatedZones`` (emulated_zones.py),
    data I/O in ``EmulatedIO`` (emulated_io.py); here construction, ``flush``,
    closing and the crash emulation (what survives a power cut).
    """

    kind = "emulated"
    abilities = DriveAbilities(readv=True, prefetch=True)

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
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                raise UsageError(
                    f"{path} already exists", hint="format never overwrites a drive: choose a new path for it"
                ) from None
            except OSError as exc:
                raise UsageError(f"cannot create {path}: {exc.strerror}") from None
            try:
                os.ftruncate(fd, geometry.capacity)
                fileio.sync_file(fd)
            except (OSError, OverflowError) as exc:  # EFBIG, ENOSPC; past the C long
                os.close(fd)
                os.unlink(path)
                why = exc.strerror if isinstance(exc, OSError) else "too large"
                raise UsageError(
                    f"cannot create {path} of {geometry.capacity} bytes: {why}",
                    hint="give a size the file system under it can hold") from None
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
            raise DriveFormatError(f"data file {path} not found", drive=name,
                                   hint="put the drive's image back at this path beside its "
                                   ".zones table") from None
        size = os.lseek(fd, 0, os.SEEK_END)
        if size < table.geometry.capacity:
            os.close(fd)
            table.close()
            raise DriveFormatError(
                f"data file holds {size} bytes; the zone table says {table.geometry.capacity}",
                drive=name,
                hint="the image was truncated or replaced: put the whole image back (a copy "
                "of a drive image must keep its size; `cp --sparse=always` does); if it is "
                "lost for good, move it aside and run `shinglefs drive replace META_URL "
                "DRIVE` (docs/cli.md)",
            )
        return cls(path, fd, table, wps, failed, name)

    @property
    def zone_table(self) -> ZoneTable:
        """The drive's persisted zone table (``<path>.zones``), for tools and tests."""
        return self._table

    # ``EmulatedZonedDrive.open(path)`` opens a drive; ``drive.open(zone)`` opens a zone.
    open = DriveOrZoneOpen(open_drive, EmulatedZones.open_zone)

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
            if self._direct is not None:
                self._direct.close()
                self._direct = None
            self._close_direct_reads()
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
