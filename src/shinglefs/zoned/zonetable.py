"""The persisted zone table of an emulated drive: geometry plus durable write pointers.

A small fixed-size sidecar file (``<data path>.zones``) laid out as::

    header   4 KiB   magic "SHGLZTBL", version, geometry, crc32c of the fields;
                     at byte 512 the drive's identity block (see below)
    slot A   n KiB   generation u64, crc32c u32, zone count u32, one u64 per zone
    slot B   n KiB   same

Each zone entry packs ``(condition << 56) | write pointer offset within the
zone``; only the terminal conditions READ_ONLY and OFFLINE are stored (every
other condition is derived from the write pointer on open, as a real drive
does after power-on: open zones come back CLOSED).

Updates alternate between the two slots, each written in place and followed
by ``fdatasync``; a slot is valid when its crc32c matches, and the valid slot
with the highest generation wins. A torn slot write therefore leaves the
previous table intact: updates are atomic without a rename.

The identity block (byte 512 of the header, inside one 512-byte sector so a
torn write cannot mix two identities) names the file system the drive belongs
to and the drive itself: magic "SHGLDRID", the file system's uuid, the
drive's uuid (16 bytes each) and a crc32c. ``format`` writes it once; a table
without one (created before identities existed, or never formatted) reads as
``None``. Older builds ignore the block, so adding it changes no version.
"""

from __future__ import annotations

import os
import struct
import uuid as _uuid
from array import array
from dataclasses import dataclass

import crc32c

from shinglefs.zoned.errors import DriveFormatError
from shinglefs.zoned.fileio import sync_data, sync_dir, sync_file
from shinglefs.zoned.model import ZoneCondition

MAGIC = b"SHGLZTBL"
VERSION = 1
HEADER_SIZE = 4096
_HEADER = struct.Struct("<8sIIQQQII")  # magic, version, flags, zone_size, zone_count, conv, max_open, block
_CRC = struct.Struct("<I")
_SLOT_HEADER = struct.Struct("<QII")  # generation, crc32c, zone count
_WP_MASK = (1 << 56) - 1
_STORED_CONDITIONS = (ZoneCondition.READ_ONLY, ZoneCondition.OFFLINE)
IDENTITY_MAGIC = b"SHGLDRID"
IDENTITY_OFFSET = 512
_IDENTITY = struct.Struct("<8s16s16s")  # magic, file system uuid, drive uuid; then crc32c


@dataclass(frozen=True, slots=True)
class DriveIdentity:
    """Which file system a drive belongs to, and which of its drives it is (uuid strings)."""

    filesystem: str
    drive: str

    def encode(self) -> bytes:
        fields = _IDENTITY.pack(IDENTITY_MAGIC, _uuid.UUID(self.filesystem).bytes,
                                _uuid.UUID(self.drive).bytes)
        return fields + _CRC.pack(crc32c.crc32c(fields))

    @classmethod
    def decode(cls, raw: bytes) -> DriveIdentity | None:
        """The identity in ``raw``, or None when there is none; raises ValueError if torn."""
        if len(raw) < _IDENTITY.size + 4 or raw[:8] != IDENTITY_MAGIC:
            return None
        fields = raw[: _IDENTITY.size]
        (crc,) = _CRC.unpack_from(raw, _IDENTITY.size)
        if crc32c.crc32c(fields) != crc:
            raise ValueError("identity block fails its checksum")
        _magic, fs, drive = _IDENTITY.unpack(fields)
        return cls(str(_uuid.UUID(bytes=fs)), str(_uuid.UUID(bytes=drive)))


@dataclass(frozen=True, slots=True)
class Geometry:
    """What a drive was created with; fixed for its lifetime."""

    zone_size: int
    zone_count: int
    conventional_zones: int
    max_open_zones: int
    block_size: int

    @property
    def capacity(self) -> int:
        return self.zone_size * self.zone_count


def _slot_size(zone_count: int) -> int:
    raw = _SLOT_HEADER.size + 8 * zone_count
    return (raw + 4095) // 4096 * 4096


class ZoneTable:
    """The open sidecar: read once on open, rewritten (one slot) on every change."""

    def __init__(self, path: str, fd: int, geometry: Geometry, generation: int, drive: str) -> None:
        self.path = path
        self.geometry = geometry
        self._fd = fd
        self._generation = generation
        self._slot_size = _slot_size(geometry.zone_count)
        self._drive = drive

    @property
    def generation(self) -> int:
        """The number of the newest saved table; it lives in slot ``generation % 2``."""
        return self._generation

    # -- creation and loading ------------------------------------------------------------
    @classmethod
    def create(cls, path: str, geometry: Geometry, drive: str) -> ZoneTable:
        """Write a fresh table (every zone EMPTY) atomically: temp file, fsync, rename."""
        fields = _HEADER.pack(
            MAGIC, VERSION, 0, geometry.zone_size, geometry.zone_count,
            geometry.conventional_zones, geometry.max_open_zones, geometry.block_size,
        )
        header = bytearray(HEADER_SIZE)
        header[: len(fields)] = fields
        header[len(fields) : len(fields) + 4] = _CRC.pack(crc32c.crc32c(fields))
        slot_size = _slot_size(geometry.zone_count)
        tmp = f"{path}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.pwrite(fd, bytes(header), 0)
            os.ftruncate(fd, HEADER_SIZE + 2 * slot_size)
            table = cls(tmp, fd, geometry, 0, drive)
            table._write_slot([0] * geometry.zone_count)
            sync_file(fd)
            os.rename(tmp, path)
            sync_dir(os.path.dirname(os.path.abspath(path)))
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        table.path = path
        return table

    @classmethod
    def load(cls, path: str, drive: str) -> tuple[ZoneTable, list[int], list[ZoneCondition | None]]:
        """Open ``path``; return the table, durable write pointer offsets and stored conditions.

        Raises DriveFormatError when the file is missing, its header is corrupt
        or of another version, or neither slot is valid.
        """
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise DriveFormatError(
                f"zone table {path} not found", drive=drive,
                hint="check the drive path; a drive is made by `shinglefs format`",
            ) from None
        try:
            header = os.pread(fd, HEADER_SIZE, 0)
            if len(header) < _HEADER.size + 4:
                raise DriveFormatError(f"zone table {path} is truncated", drive=drive)
            fields = header[: _HEADER.size]
            (crc,) = _CRC.unpack_from(header, _HEADER.size)
            magic, version, _flags, zsize, zcount, conv, max_open, block = _HEADER.unpack(fields)
            if magic != MAGIC:
                raise DriveFormatError(f"{path} is not a ShingleFS zone table", drive=drive)
            if crc32c.crc32c(fields) != crc:
                raise DriveFormatError(f"zone table {path} header fails its checksum", drive=drive)
            if version != VERSION:
                raise DriveFormatError(
                    f"zone table {path} has version {version}; this build reads {VERSION}",
                    drive=drive,
                )
            geometry = Geometry(zsize, zcount, conv, max_open, block)
            slot_size = _slot_size(zcount)
            best: tuple[int, array] | None = None
            for slot in range(2):
                raw = os.pread(fd, slot_size, HEADER_SIZE + slot * slot_size)
                if len(raw) < _SLOT_HEADER.size + 8 * zcount:
                    continue
                generation, crc, count = _SLOT_HEADER.unpack_from(raw, 0)
                body = raw[_SLOT_HEADER.size : _SLOT_HEADER.size + 8 * zcount]
                if count != zcount or crc32c.crc32c(struct.pack("<Q", generation) + body) != crc:
                    continue
                if best is None or generation > best[0]:
                    entries = array("Q")
                    entries.frombytes(body)
                    if entries.itemsize != 8:  # pragma: no cover - exotic platforms
                        raise DriveFormatError("unsupported platform word size", drive=drive)
                    best = (generation, entries)
            if best is None:
                raise DriveFormatError(f"zone table {path}: both slots are corrupt", drive=drive)
        except BaseException:
            os.close(fd)
            raise
        generation, entries = best
        wps = [int(e) & _WP_MASK for e in entries]
        conds: list[ZoneCondition | None] = []
        for e in entries:
            code = int(e) >> 56
            conds.append(ZoneCondition(code) if code in _STORED_CONDITIONS else None)
        return cls(path, fd, geometry, generation, drive), wps, conds

    # -- identity ------------------------------------------------------------------------
    @staticmethod
    def read_identity(path: str, drive: str) -> DriveIdentity | None:
        """The identity block of the table at ``path`` (None when it has none).

        Reads only; safe while another process has the drive open. Raises
        DriveFormatError when the table is missing or its identity block is torn.
        """
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise DriveFormatError(f"zone table {path} not found", drive=drive,
                                   hint="check the drive path; a drive is made by `shinglefs "
                                   "format`") from None
        try:
            raw = os.pread(fd, _IDENTITY.size + 4, IDENTITY_OFFSET)
        finally:
            os.close(fd)
        try:
            return DriveIdentity.decode(raw)
        except ValueError:
            raise DriveFormatError(f"zone table {path}: the drive identity fails its checksum",
                                   drive=drive) from None

    @staticmethod
    def write_identity(path: str, identity: DriveIdentity, drive: str) -> None:
        """Durably write ``identity`` into the table at ``path`` (replacing any earlier one)."""
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise DriveFormatError(f"zone table {path} not found", drive=drive) from None
        try:
            os.pwrite(fd, identity.encode(), IDENTITY_OFFSET)
            sync_data(fd)
        finally:
            os.close(fd)

    # -- updates -------------------------------------------------------------------------
    @staticmethod
    def encode(wp_offset: int, condition: ZoneCondition | None) -> int:
        """One zone's entry: its write pointer offset, plus the condition if terminal."""
        if condition in _STORED_CONDITIONS:
            return int(condition) << 56 | wp_offset
        return wp_offset

    def save(self, wp_offsets: list[int], conditions: list[ZoneCondition | None]) -> None:
        """Durably replace the table: ``wp_offsets`` relative to each zone's start."""
        self.save_entries(
            array("Q", [self.encode(wp, c) for wp, c in zip(wp_offsets, conditions, strict=True)])
        )

    def save_entries(self, entries: array | list[int]) -> None:
        """Durably replace the table with already encoded ``entries`` (one per zone)."""
        self._write_slot(entries)

    def _write_slot(self, entries: array | list[int]) -> None:
        generation = self._generation + 1
        body = (entries if isinstance(entries, array) else array("Q", entries)).tobytes()
        crc = crc32c.crc32c(struct.pack("<Q", generation) + body)
        slot = generation % 2
        os.pwrite(
            self._fd,
            _SLOT_HEADER.pack(generation, crc, len(entries)) + body,
            HEADER_SIZE + slot * self._slot_size,
        )
        sync_data(self._fd)
        self._generation = generation

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
