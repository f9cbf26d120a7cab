"""Metadata backups in a drive's checkpoint area: two checksummed slots per drive.

The store does not know what a backup holds (the client writes a compressed
metadata dump, ``shinglefs.meta.dump``); it keeps the bytes where a lost
metadata database can be rebuilt from: the drive's own conventional space,
next to the index checkpoints (``CheckpointArea``, a quarter of the area after
the generation table; docs/slice-log.md).

A slot is a 4 KiB header -- magic ``SHMB``, version, backup number, creation
time, payload length, payload crc32c, a label (the file system's uuid) and a
header crc32c -- followed by the payload. Backup *n* goes to slot *n* mod 2.
Writing one first invalidates the slot's header and flushes, then writes the
payload in pieces of ``PIECE_BYTES`` (each under the slice log's ``io_lock``,
so the drive's writer waits for one piece at most), flushes, and writes the
header last, followed by a flush: a torn backup leaves the other slot intact,
and a header is only ever valid over a complete payload.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

import crc32c

from shinglefs.store.checkpoint import BLOCK
from shinglefs.store.errors import StoreError
from shinglefs.store.log import SliceLog

MAGIC = b"SHMB"
VERSION = 1
LABEL_BYTES = 64
PIECE_BYTES = 8 * 1024 * 1024
# magic, version, number, created_ns, payload length, payload crc, label, header crc
_HEADER = struct.Struct(f"<4sIQQQI{LABEL_BYTES}sI")


class BackupError(StoreError):
    """A metadata backup could not be written or read back intact."""

    exit_code = 3


@dataclass(frozen=True, slots=True)
class BackupSlot:
    """A valid backup header found on a drive (the payload is checked when read)."""

    drive: str
    slot: int
    number: int
    created_ns: int
    length: int
    crc: int
    label: str


def _encode_header(number: int, created_ns: int, length: int, crc: int, label: str) -> bytearray:
    block = bytearray(BLOCK)
    raw_label = label.encode()[:LABEL_BYTES]
    _HEADER.pack_into(block, 0, MAGIC, VERSION, number, created_ns, length, crc, raw_label, 0)
    struct.pack_into("<I", block, _HEADER.size - 4, crc32c.crc32c(block[: _HEADER.size - 4]))
    return block


def _decode_header(drive: str, slot: int, block: bytes | bytearray) -> BackupSlot | None:
    magic, version, number, created, length, crc, label, hcrc = _HEADER.unpack_from(block, 0)
    if magic != MAGIC or version != VERSION:
        return None
    if crc32c.crc32c(bytes(block[: _HEADER.size - 4])) != hcrc:
        return None
    return BackupSlot(drive, slot, number, created, length, crc,
                      label.rstrip(b"\0").decode(errors="replace"))


def backup_slots(log: SliceLog) -> list[BackupSlot]:
    """The slots of this drive holding a valid backup header, newest first."""
    found = []
    for slot in (0, 1):
        head = _decode_header(log.name, slot, log.area.read_backup(slot, 0, BLOCK))
        if head is not None and head.length <= log.area.backup_slot_size - BLOCK:
            found.append(head)
    return sorted(found, key=lambda b: b.number, reverse=True)


def write_backup(log: SliceLog, source: BinaryIO, *, number: int, created_ns: int,
                 label: str) -> BackupSlot:
    """Copy ``source`` (read to its end) into slot ``number % 2`` of the drive.

    Durable when it returns. Raises ``BackupError`` when the payload does not
    fit the slot, before the slot is touched (both slots keep what they held),
    and the drive's errors as ``StoreIOError``.
    """
    area = log.area
    slot = number % 2
    size = source.seek(0, io.SEEK_END)
    if size > area.backup_slot_size - BLOCK:
        raise BackupError(
            f"the metadata backup ({size} bytes) does not fit the "
            f"{area.backup_slot_size - BLOCK}-byte backup slot",
            drive=log.name, hint="dump the metadata with `shinglefs dump` instead")
    with log.io_lock:
        area.write_backup(slot, 0, [bytes(BLOCK)])  # invalid until complete
        area.sync()
    length = crc = 0
    source.seek(0)
    while True:
        piece = source.read(PIECE_BYTES)
        if not piece:
            break
        if length + len(piece) > area.backup_slot_size - BLOCK:
            raise BackupError(
                f"metadata backup does not fit the {area.backup_slot_size}-byte backup slot",
                drive=log.name, hint="dump the metadata with `shinglefs dump` instead")
        crc = crc32c.crc32c(piece, crc)
        pad = bytes((-len(piece)) % BLOCK)
        with log.io_lock:
            area.write_backup(slot, BLOCK + length, [piece, pad])
        length += len(piece)
    with log.io_lock:
        area.sync()
        area.write_backup(slot, 0, [_encode_header(number, created_ns, length, crc, label)])
        area.sync()
    return BackupSlot(log.name, slot, number, created_ns, length, crc, label)


def read_backup(log: SliceLog, slot: BackupSlot, sink: BinaryIO) -> None:
    """Write the payload of ``slot`` to ``sink``, verifying its crc32c.

    Raises ``BackupError`` if the payload does not match its header (the
    caller falls back to an older slot or another drive).
    """
    crc = 0
    pos = 0
    while pos < slot.length:
        take = min(PIECE_BYTES, slot.length - pos)
        piece = log.area.read_backup(slot.slot, BLOCK + pos, take)
        crc = crc32c.crc32c(piece, crc)
        sink.write(piece)
        pos += take
    if crc != slot.crc:
        raise BackupError(f"metadata backup {slot.number} in slot {slot.slot}: payload crc "
                          "mismatch", drive=log.name)


def newest_backup(logs: Iterable[SliceLog]) -> list[tuple[SliceLog, BackupSlot]]:
    """Every valid backup header on ``logs``, newest (highest number) first."""
    found = [(log, slot) for log in logs for slot in backup_slots(log)]
    return sorted(found, key=lambda f: (f[1].number, f[1].created_ns), reverse=True)
