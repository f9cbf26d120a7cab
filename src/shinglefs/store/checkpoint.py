"""Index checkpoints and the zone generation table, on conventional space.

The checkpoint area is either the drive's conventional zones or a file on a
flash/conventional file system (``checkpoint_path``). It is laid out as::

    generation table   one u32 per zone (how often the store reset it), in
                       4 KiB blocks of 1020 entries + a crc32c each
    slot 0             a checkpoint
    slot 1             a checkpoint
    backup 0, backup 1 metadata backups (store/metabackup.py): 1/4 of the area

A checkpoint is a 4 KiB header -- magic b"SHCK", version, checkpoint number,
the log sequence number it covers, payload length, payload crc32c, header
crc32c -- followed by the payload: a JSON object (counters, group labels,
column lengths) and the raw index and zone-table columns. Checkpoints
alternate between the slots (number n goes to slot n % 2), each written only
after the drive was flushed and followed by a flush, so a torn checkpoint
leaves the previous one intact and loading picks the valid slot with the
higher number.

The generation table is how recovery knows which zones were reset since the
checkpoint without reading every zone: a reset bumps the zone's generation
(written and flushed) before the zone is reset. A block whose crc fails is
treated as "every zone in it changed" -- slower recovery, never a wrong one.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any

import crc32c
import numpy as np

from shinglefs.store.errors import StoreFormatError
from shinglefs.zoned.fileio import sync_data
from shinglefs.zoned.model import ZonedDrive

MAGIC = b"SHCK"
VERSION = 1
BLOCK = 4096
_HEADER = struct.Struct("<4sIQQQII")  # magic, version, number, covered seq, payload len, crc, hcrc
_GEN_PER_BLOCK = (BLOCK - 4) // 4
BACKUP_SHARE = 4  # 1/BACKUP_SHARE of the area (after the generation table): two backup slots


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One decoded checkpoint: ``covered_seq`` is the last log sequence it reflects."""

    number: int
    covered_seq: int
    meta: dict[str, Any]
    columns: dict[str, np.ndarray]
    size: int


def encode_checkpoint(number: int, covered_seq: int, meta: dict[str, Any],
                      columns: dict[str, np.ndarray]) -> list[Any]:
    """The pieces of a checkpoint (header block, JSON, columns, padding) to write as one I/O."""
    meta = dict(meta)
    meta["columns"] = [[name, str(col.dtype), int(col.size)] for name, col in columns.items()]
    blob = json.dumps(meta, separators=(",", ":")).encode()
    parts: list[Any] = [struct.pack("<I", len(blob)), blob]
    parts += [memoryview(np.ascontiguousarray(col)).cast("B")  # type: ignore[arg-type]
              for col in columns.values()]
    length = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
    crc = 0
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    header = bytearray(BLOCK)
    _HEADER.pack_into(header, 0, MAGIC, VERSION, number, covered_seq, length, crc, 0)
    struct.pack_into("<I", header, _HEADER.size - 4, crc32c.crc32c(header[: _HEADER.size - 4]))
    pad = (-length) % BLOCK
    return [header, *parts, bytes(pad)]


def decode_header(block: bytes | memoryview) -> tuple[int, int, int, int] | None:
    """``(number, covered_seq, payload length, payload crc)``, or None for no valid header."""
    magic, version, number, covered, length, crc, hcrc = _HEADER.unpack_from(block, 0)
    if magic != MAGIC or version != VERSION:
        return None
    if crc32c.crc32c(bytes(block[: _HEADER.size - 4])) != hcrc:
        return None
    return number, covered, length, crc


def decode_payload(number: int, covered: int, payload: memoryview) -> Checkpoint:
    (jlen,) = struct.unpack_from("<I", payload, 0)
    meta = json.loads(bytes(payload[4 : 4 + jlen]))
    pos = 4 + jlen
    columns: dict[str, np.ndarray] = {}
    for name, dtype, count in meta.pop("columns"):
        dt = np.dtype(dtype)
        nbytes = dt.itemsize * count
        columns[name] = np.frombuffer(payload[pos : pos + nbytes], dtype=dt).copy()
        pos += nbytes
    return Checkpoint(number, covered, meta, columns, payload.nbytes + BLOCK)


class CheckpointArea:
    """Random-access conventional space for the generation table and two checkpoint slots."""

    def __init__(self, drive: ZonedDrive, zone_count: int, *, path: str | None = None,
                 area_zones: int | None = None) -> None:
        self.drive = drive
        self.zone_count = zone_count
        self.gen_blocks = (zone_count + _GEN_PER_BLOCK - 1) // _GEN_PER_BLOCK
        self.gen_bytes = self.gen_blocks * BLOCK
        self.path = path
        self._fd: int | None = None
        if path is not None:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            self.base = 0
            self.slot_size = 1 << 40  # a sparse file: no practical limit
            self.backup_slot_size = 1 << 40
        else:
            zones = drive.conventional_zones if area_zones is None else area_zones
            conv = zones * drive.zone_size
            if conv < self.gen_bytes + 2 * 2 * BLOCK:
                raise StoreFormatError(
                    f"{zones} conventional zones cannot hold checkpoints",
                    drive=drive.name,
                    hint="format a drive with conventional zones (a larger drive has more)",
                )
            self.base = 0
            usable = conv - self.gen_bytes
            self.backup_slot_size = usable // BACKUP_SHARE // 2 // BLOCK * BLOCK
            self.slot_size = (usable - 2 * self.backup_slot_size) // 2 // BLOCK * BLOCK
        self.bytes_written = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- raw access ----------------------------------------------------------------------
    def _write(self, offset: int, parts: list[Any]) -> None:
        total = sum(memoryview(p).nbytes for p in parts)
        self.bytes_written += total
        if self._fd is not None:
            views = [memoryview(p).cast("B") for p in parts]
            written = 0
            while views:
                n = os.pwritev(self._fd, views[:512], offset + written)
                written += n
                drop = n
                while views and drop >= views[0].nbytes:
                    drop -= views[0].nbytes
                    views.pop(0)
                if drop:
                    views[0] = views[0][drop:]
            return
        # Conventional zones: one write per zone touched (a write never crosses a zone).
        zs = self.drive.zone_size
        pos = self.base + offset
        views = [memoryview(p).cast("B") for p in parts]
        while views:
            zone = pos // zs
            room = (zone + 1) * zs - pos
            batch: list[memoryview] = []
            while views and room:
                v = views[0]
                if v.nbytes <= room:
                    batch.append(v)
                    room -= v.nbytes
                    views.pop(0)
                else:
                    batch.append(v[:room])
                    views[0] = v[room:]
                    room = 0
            n = sum(b.nbytes for b in batch)
            self.drive.write(zone, pos, batch)
            pos += n

    def _read(self, offset: int, length: int) -> bytearray:
        if self._fd is not None:
            buf = bytearray(length)
            got = os.preadv(self._fd, [buf], offset)
            if got < length:
                buf[got:] = bytes(length - got)
            return buf
        padded = bytearray((length + BLOCK - 1) // BLOCK * BLOCK)
        self.drive.readinto(self.base + offset, memoryview(padded))
        del padded[length:]
        return padded

    def sync(self) -> None:
        if self._fd is not None:
            sync_data(self._fd)
        else:
            self.drive.flush()

    # -- generation table ----------------------------------------------------------------
    def read_generations(self) -> tuple[np.ndarray, np.ndarray]:
        """``(generations, valid)``: per zone its reset count and whether its block was intact."""
        raw = self._read(0, self.gen_bytes)
        gens = np.zeros(self.gen_blocks * _GEN_PER_BLOCK, np.uint32)
        valid = np.zeros(gens.size, bool)
        for b in range(self.gen_blocks):
            block = memoryview(raw)[b * BLOCK : (b + 1) * BLOCK]
            (crc,) = struct.unpack_from("<I", block, BLOCK - 4)
            if crc32c.crc32c(block[: BLOCK - 4]) == crc:
                gens[b * _GEN_PER_BLOCK : (b + 1) * _GEN_PER_BLOCK] = np.frombuffer(
                    block[: BLOCK - 4], np.uint32)
                valid[b * _GEN_PER_BLOCK : (b + 1) * _GEN_PER_BLOCK] = True
        return gens[: self.zone_count], valid[: self.zone_count]

    def write_generations(self, gens: np.ndarray, zones: list[int] | None = None) -> None:
        """Write the blocks holding ``zones`` (all blocks when None); not flushed."""
        blocks = (range(self.gen_blocks) if zones is None
                  else sorted({z // _GEN_PER_BLOCK for z in zones}))
        for b in blocks:
            block = bytearray(BLOCK)
            chunk = gens[b * _GEN_PER_BLOCK : (b + 1) * _GEN_PER_BLOCK].astype(np.uint32)
            block[: chunk.nbytes] = chunk.tobytes()
            struct.pack_into("<I", block, BLOCK - 4, crc32c.crc32c(memoryview(block)[: BLOCK - 4]))
            self._write(b * BLOCK, [block])

    # -- checkpoint slots ----------------------------------------------------------------
    def _slot_offset(self, slot: int) -> int:
        return self.gen_bytes + slot * self.slot_size

    def write_checkpoint(self, number: int, parts: list[Any]) -> int:
        """Write checkpoint ``number`` into slot ``number % 2``; returns its size. Not flushed."""
        size = sum(memoryview(p).nbytes for p in parts)
        if size > self.slot_size:
            raise StoreFormatError(
                f"index checkpoint of {size} bytes exceeds its {self.slot_size}-byte slot",
                drive=self.drive.name,
                hint="format a drive with more conventional zones (a larger drive has more)",
            )
        self._write(self._slot_offset(number % 2), parts)
        return size

    def slot_numbers(self) -> list[tuple[int, int]]:
        """``(number, covered_seq)`` of each slot whose header is valid (payload unchecked)."""
        out = []
        for slot in (0, 1):
            head = decode_header(memoryview(self._read(self._slot_offset(slot), BLOCK)))
            if head is not None:
                out.append((head[0], head[1]))
        return out

    # -- metadata backup slots (their format is store/metabackup.py's) -------------------
    def _backup_offset(self, slot: int) -> int:
        return self.gen_bytes + 2 * self.slot_size + slot * self.backup_slot_size

    def write_backup(self, slot: int, offset: int, parts: list[Any]) -> None:
        """Write ``parts`` at ``offset`` of metadata backup slot ``slot`` (0/1). Not flushed."""
        size = sum(memoryview(p).nbytes for p in parts)
        if offset + size > self.backup_slot_size:
            raise StoreFormatError(
                f"metadata backup of {offset + size} bytes exceeds its "
                f"{self.backup_slot_size}-byte slot", drive=self.drive.name,
                hint="create the drive with more conventional zones")
        self._write(self._backup_offset(slot) + offset, parts)

    def read_slot(self, slot: int, length: int) -> bytearray:
        """The first ``length`` bytes of checkpoint slot ``slot`` as stored (unverified)."""
        return self._read(self._slot_offset(slot), length)

    def read_backup(self, slot: int, offset: int, length: int) -> bytearray:
        """``length`` bytes from ``offset`` of metadata backup slot ``slot``."""
        return self._read(self._backup_offset(slot) + offset, length)

    def load_best(self) -> tuple[Checkpoint | None, list[str]]:
        """The valid checkpoint with the highest number, and notes on slots rejected."""
        found: list[tuple[int, int, int, int, int]] = []
        notes: list[str] = []
        for slot in (0, 1):
            head = decode_header(memoryview(self._read(self._slot_offset(slot), BLOCK)))
            if head is None:
                notes.append(f"checkpoint slot {slot}: no valid header")
                continue
            if head[2] > self.slot_size - BLOCK:
                notes.append(f"checkpoint slot {slot}: bad length {head[2]}")
                continue
            found.append((head[0], slot, *head[1:]))
        for number, slot, covered, length, crc in sorted(found, reverse=True):
            payload = self._read(self._slot_offset(slot) + BLOCK, length)
            if crc32c.crc32c(payload) != crc:
                notes.append(f"checkpoint {number} (slot {slot}): payload crc mismatch, skipped")
                continue
            return decode_payload(number, covered, memoryview(payload)), notes
        return None, notes
