"""The zone model: types, conditions, zone descriptors and the drive interface.

Positions are absolute byte offsets on the drive (the kernel uses 512 B
sectors; backends convert). Every backend enforces the same rules, so the
layers above can rely on them whatever the drive:

- a sequential zone accepts a write only exactly at its write pointer;
- a write never crosses a zone boundary;
- writes and reads are aligned to ``block_size`` (4 KiB) in offset and length;
- writes to FULL, READ_ONLY or OFFLINE zones fail; reads of OFFLINE zones fail;
- at most ``max_open_zones`` sequential zones are open (implicitly or
  explicitly) at once (0 = no limit); a write to an EMPTY or CLOSED zone opens
  it implicitly. When opening one more zone (by a write or by ``open``) would
  exceed the limit, the drive first implicitly closes the least recently
  written IMPLICIT_OPEN zone (ZBC); it fails with ``TooManyOpenZones``
  (ETOOMANYREFS) only when every open zone is explicitly open.

Durability: ``write``/``append`` return when the bytes are in the drive's
volatile cache; ``flush`` makes every earlier write durable; ``reset`` is
durable when it returns. After a crash the write pointer of a zone never
points past bytes that were not durable, except that the last write before a
power cut may survive as a block prefix (a torn write: see docs/drives.md);
bytes past a write pointer read as zeros.
"""

from __future__ import annotations

import enum
import mmap
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

from shinglefs.zoned.errors import ZoneTypeError

# Anything exposing the buffer protocol as bytes (collections.abc.Buffer is 3.12+).
Buffer = bytes | bytearray | memoryview | mmap.mmap

BLOCK_SIZE = 4096
DEFAULT_ZONE_SIZE = 256 * 1024 * 1024


class ZoneType(enum.IntEnum):
    """Zone types as numbered in linux/blkzoned.h."""

    CONVENTIONAL = 0x1
    SEQUENTIAL_WRITE_REQUIRED = 0x2
    SEQUENTIAL_WRITE_PREFERRED = 0x3


class ZoneCondition(enum.IntEnum):
    """Zone conditions as numbered in linux/blkzoned.h."""

    NOT_WP = 0x0
    EMPTY = 0x1
    IMPLICIT_OPEN = 0x2
    EXPLICIT_OPEN = 0x3
    CLOSED = 0x4
    READ_ONLY = 0xD
    FULL = 0xE
    OFFLINE = 0xF

    @property
    def is_open(self) -> bool:
        return self in (ZoneCondition.IMPLICIT_OPEN, ZoneCondition.EXPLICIT_OPEN)


@dataclass(frozen=True, slots=True)
class ZoneInfo:
    """One zone as reported by ``report_zones``.

    ``start`` and ``write_pointer`` are absolute byte offsets; ``capacity`` is
    the writable length (may be below ``size`` on ZNS; equal on SMR). For a
    conventional zone ``write_pointer`` is meaningless and equals ``start``.
    """

    index: int
    start: int
    size: int
    capacity: int
    write_pointer: int
    type: ZoneType
    condition: ZoneCondition

    @property
    def written(self) -> int:
        """Bytes written in the zone (sequential zones)."""
        return self.write_pointer - self.start

    @property
    def remaining(self) -> int:
        """Bytes still writable before the zone is full (sequential zones)."""
        return self.start + self.capacity - self.write_pointer


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One traced drive operation, for the SMR timing model.

    ``op`` is one of "read", "write", "flush", "reset", "open", "close",
    "finish"; ``time`` is ``time.perf_counter()`` at issue.
    """

    op: str
    zone: int
    offset: int
    length: int
    time: float


@dataclass(frozen=True, slots=True)
class DriveAbilities:
    """Optional drive calls a backend implements natively (``ZonedDrive.abilities``).

    The calls themselves are part of every drive's interface; a flag says
    whether calling them is worth it. Callers test a flag, never ``getattr``.

    - ``readv``: ``readv`` fills several buffers with one vectored read (else
      it is one ``readinto`` per buffer).
    - ``prefetch``: ``prefetch`` queues a read-ahead of a range (else it does
      nothing).
    - ``discard``: ``discard`` frees a byte range, which then reads as zeros
      (a TRIM; else it raises ``ZoneTypeError``). The slice log needs it on a
      drive without write pointers, where it stands for a zone reset.
    """

    readv: bool = False
    prefetch: bool = False
    discard: bool = False


class DriveOrZoneOpen:
    """``Backend.open(path)`` on the class opens a drive; ``drive.open(zone)`` opens a zone.

    The ``ZonedDrive`` interface names the explicit OPEN ZONE command ``open``,
    and the backends' constructors are ``open(path)`` too; this descriptor
    dispatches on whether it is reached through the class or an instance.
    """

    def __init__(self, drive_opener: Any, zone_opener: Any) -> None:
        self._drive_opener = drive_opener
        self._zone_opener = zone_opener
        self.__doc__ = zone_opener.__doc__

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self._drive_opener.__get__(None, objtype)
        return self._zone_opener.__get__(obj, objtype)


class ZonedDrive(ABC):
    """A zoned (or conventional) drive; see the module docstring for the rules.

    Thread safety: every method may be called from any thread; a backend
    serialises state changes per zone. Raises only ``shinglefs.zoned.errors``
    types (each carrying drive, zone, offset and the Linux errno).
    """

    name: str
    zone_size: int
    zone_count: int
    conventional_zones: int
    max_open_zones: int
    block_size: int = BLOCK_SIZE
    #: backend name as used in drive specs ("emulated", "linux", "conventional")
    kind: str = "zoned"
    #: False when every zone is CONVENTIONAL (random aligned writes anywhere, no write pointers)
    is_zoned: bool = True
    #: which optional calls (``readv``, ``prefetch``, ``discard``) this backend implements
    #: natively; an instance may narrow them (an emulated drive reading around the
    #: page cache has no use for read-ahead hints)
    abilities: DriveAbilities = DriveAbilities()

    @property
    def capacity(self) -> int:
        return self.zone_size * self.zone_count

    def zone_of(self, offset: int) -> int:
        """Index of the zone holding byte ``offset``."""
        return offset // self.zone_size

    def zone_start(self, zone: int) -> int:
        return zone * self.zone_size

    @property
    def first_sequential_zone(self) -> int:
        """Index of the first sequential zone (conventional zones come first, as on HC620)."""
        return self.conventional_zones

    def open_zone(self, zone: int) -> None:
        """Same as ``open(zone)``: explicitly open ``zone``."""
        self.open(zone)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_drive()

    @abstractmethod
    def report_zones(self, start_zone: int = 0, count: int | None = None) -> list[ZoneInfo]:
        """Describe ``count`` zones from ``start_zone`` (all remaining when None)."""

    def zone_info(self, zone: int) -> ZoneInfo:
        return self.report_zones(zone, 1)[0]

    @abstractmethod
    def read(self, offset: int, length: int) -> bytes:
        """Read ``length`` bytes at ``offset``; may span zones; aligned to block_size.

        Bytes past a sequential zone's write pointer read as zeros (as on a
        real drive). Raises ZoneOfflineError for an OFFLINE zone.
        """

    @abstractmethod
    def readinto(self, offset: int, buffer: memoryview) -> int:
        """Read ``len(buffer)`` bytes at ``offset`` into ``buffer``; returns the count."""

    def readv(self, offset: int, buffers: Sequence[Buffer]) -> int:
        """Fill ``buffers`` back to back from ``offset``; returns the bytes read.

        The rules of ``readinto`` hold for the whole span. This default reads
        one buffer at a time; a backend with ``abilities.readv`` does one
        vectored read.
        """
        pos = offset
        for buffer in buffers:
            view = memoryview(buffer)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            pos += self.readinto(pos, view)
        return pos - offset

    def prefetch(self, offset: int, length: int) -> None:
        """Hint that ``[offset, offset + length)`` is read soon; returns at once, never fails.

        This default ignores the hint (``abilities.prefetch`` is False).
        """
        return None

    def discard(self, offset: int, length: int) -> None:
        """Free ``[offset, offset + length)``: it reads as zeros; volatile until ``flush``.

        Only a backend with ``abilities.discard`` implements it; this default
        raises ``ZoneTypeError``.
        """
        raise ZoneTypeError("this drive cannot discard a byte range", drive=self.name,
                            zone=self.zone_of(offset), offset=offset)

    @abstractmethod
    def write(self, zone: int, offset: int, data: Buffer | Sequence[Buffer]) -> None:
        """Write ``data`` (one buffer or a sequence written as one I/O) at ``offset``.

        For a sequential zone ``offset`` must equal its write pointer; the
        write must stay within ``zone`` and be block-aligned in offset and
        total length. Returns when the bytes are in the volatile cache.
        """

    @abstractmethod
    def append(self, zone: int, data: Buffer | Sequence[Buffer]) -> int:
        """Write ``data`` at the write pointer of sequential ``zone``; returns its offset."""

    @abstractmethod
    def reset(self, zone: int) -> None:
        """Make ``zone`` EMPTY (write pointer at its start); its data is gone."""

    @abstractmethod
    def open(self, zone: int) -> None:
        """Explicitly open ``zone`` (counts against max_open_zones)."""

    @abstractmethod
    def close(self, zone: int) -> None:
        """Close an open zone (it keeps its write pointer; EMPTY if nothing written)."""

    @abstractmethod
    def finish(self, zone: int) -> None:
        """Move the write pointer to the zone's end; the zone becomes FULL."""

    @abstractmethod
    def flush(self) -> None:
        """Make every earlier completed write durable."""

    @abstractmethod
    def close_drive(self) -> None:
        """Release the backing file or device; further calls fail."""

    # Tracing (off by default; cheap when off: one attribute test per I/O).
    @abstractmethod
    def start_trace(self) -> None:
        """Begin recording a ``TraceRecord`` per operation."""

    @abstractmethod
    def stop_trace(self) -> list[TraceRecord]:
        """Stop recording and return what was recorded since ``start_trace``."""
