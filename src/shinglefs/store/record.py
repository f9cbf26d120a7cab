"""The on-drive record: a 4 KiB header block, then the payload, padded to 4 KiB.

Layout of one record (all integers little-endian)::

    offset  size  field
    0       4     magic b"SHRC"
    4       1     format version (1)
    5       1     record type (1 data, 2 tombstone, 3 group delete)
    6       2     flags (bit 0: GC copy)
    8       8     slice id (data); number of ids (tombstone); 0 (group delete)
    16      8     offset of the payload within the slice (data)
    24      4     payload length in bytes (at most MAX_RECORD_PAYLOAD)
    28      1     crc block shift (18: one crc32c per 256 KiB of payload)
    29      3     reserved, zero
    32      8     lifetime group
    40      8     sequence number (drive-wide, increasing)
    48      4     header crc32c: over bytes 0..63 with this field zero, then the table
    52      12    reserved, zero
    64      4*n   block table: crc32c of each 256 KiB block of the payload
    ...           zero up to 4096
    4096    len   payload
    ...           zero padding to the next 4 KiB boundary

The header crc covers the header and the block table; the table covers the
payload block by block. A range read therefore verifies the header block and
only the payload blocks it touches, never the whole record. The payload starts
4 KiB aligned, so it can be read straight into a caller's buffer. The cost is
one 4 KiB block per record: 0.05 % of an 8 MiB record, and no more than an
inline 64-byte header would cost once the payload is padded to 4 KiB.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

BLOCK = 4096
HEADER_BLOCK = 4096
MAGIC = b"SHRC"
VERSION = 1
CRC_BLOCK_SHIFT = 18
CRC_BLOCK = 1 << CRC_BLOCK_SHIFT
MAX_RECORD_PAYLOAD = 64 * 1024 * 1024
FLAG_GC_COPY = 0x1

_HEADER = struct.Struct("<4sBBHQQIB3xQQI12x")
HEADER_SIZE = _HEADER.size  # 64
_CRC_OFFSET = 48
assert HEADER_SIZE == 64

_ZERO_BLOCK = bytes(BLOCK)


class RecordType(enum.IntEnum):
    DATA = 1
    TOMBSTONE = 2
    GROUP_DELETE = 3


class RecordDecodeError(ValueError):
    """A header block that is not a valid record (bad magic, version, crc or length).

    ``zeros`` is True when the block is all zeros where a header belongs: no
    record was ever written there (the clean end of a log), not a corrupt one.
    """

    def __init__(self, message: str, *, zeros: bool = False) -> None:
        super().__init__(message)
        self.zeros = zeros


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """A decoded record header; ``crcs`` holds one crc32c per CRC_BLOCK of payload."""

    type: RecordType
    flags: int
    slice_id: int
    slice_offset: int
    length: int
    group: int
    seq: int
    crcs: tuple[int, ...]

    @property
    def footprint(self) -> int:
        """Bytes the record occupies on the drive (header block + padded payload)."""
        return record_footprint(self.length)

    @property
    def is_gc_copy(self) -> bool:
        return bool(self.flags & FLAG_GC_COPY)


def align_up(n: int, to: int = BLOCK) -> int:
    return (n + to - 1) // to * to


def record_footprint(length: int) -> int:
    return HEADER_BLOCK + align_up(length)


def crc_blocks(length: int) -> int:
    return (length + CRC_BLOCK - 1) >> CRC_BLOCK_SHIFT


def payload_block_crcs(views: Sequence[memoryview], length: int) -> list[int]:
    """crc32c of each CRC_BLOCK of the concatenation of ``views`` (no copies)."""
    out: list[int] = []
    crc = 0
    filled = 0
    for view in views:
        pos = 0
        n = view.nbytes
        while pos < n:
            take = min(n - pos, CRC_BLOCK - filled)
            crc = crc32c.crc32c(view[pos : pos + take], crc)
            filled += take
            pos += take
            if filled == CRC_BLOCK:
                out.append(crc)
                crc = 0
                filled = 0
    if filled:
        out.append(crc)
    if len(out) != crc_blocks(length):
        raise ValueError(f"payload views hold {sum(v.nbytes for v in views)} bytes, not {length}")
    return out


def encode_header(
    rtype: RecordType, *, slice_id: int, slice_offset: int, length: int, group: int, seq: int,
    crcs: Sequence[int], flags: int = 0,
) -> bytearray:
    """The 4 KiB header block of a record whose payload has the given block crcs."""
    if length > MAX_RECORD_PAYLOAD:
        raise ValueError(f"record payload {length} exceeds {MAX_RECORD_PAYLOAD}")
    block = bytearray(HEADER_BLOCK)
    _HEADER.pack_into(block, 0, MAGIC, VERSION, int(rtype), flags, slice_id, slice_offset,
                      length, CRC_BLOCK_SHIFT, group, seq, 0)
    table_end = HEADER_SIZE + 4 * len(crcs)
    struct.pack_into(f"<{len(crcs)}I", block, HEADER_SIZE, *crcs)
    crc = crc32c.crc32c(memoryview(block)[:table_end])
    struct.pack_into("<I", block, _CRC_OFFSET, crc)
    return block


def decode_header(block: bytes | bytearray | memoryview) -> RecordHeader:
    """Decode and verify a header block; raises RecordDecodeError when it is not a record."""
    view = memoryview(block)
    if view.nbytes < HEADER_SIZE:
        raise RecordDecodeError("short header block")
    (magic, version, rtype, flags, slice_id, slice_offset, length, shift, group, seq,
     stored) = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        if any(view[:HEADER_SIZE]):
            raise RecordDecodeError("bad magic")
        raise RecordDecodeError("zeros (no record)", zeros=True)
    if version != VERSION:
        raise RecordDecodeError(f"unknown record version {version}")
    if shift != CRC_BLOCK_SHIFT or length > MAX_RECORD_PAYLOAD:
        raise RecordDecodeError(f"bad length {length} or crc block shift {shift}")
    try:
        kind = RecordType(rtype)
    except ValueError:
        raise RecordDecodeError(f"unknown record type {rtype}") from None
    nblocks = crc_blocks(length)
    table_end = HEADER_SIZE + 4 * nblocks
    if view.nbytes < table_end:
        raise RecordDecodeError("short header block")
    crc = crc32c.crc32c(view[:_CRC_OFFSET])
    crc = crc32c.crc32c(b"\0\0\0\0", crc)
    crc = crc32c.crc32c(view[_CRC_OFFSET + 4 : table_end], crc)
    if crc != stored:
        raise RecordDecodeError("header crc mismatch")
    crcs = struct.unpack_from(f"<{nblocks}I", view, HEADER_SIZE)
    return RecordHeader(kind, flags, slice_id, slice_offset, length, group, seq, crcs)


def verify_blocks(header: RecordHeader, payload: memoryview, first_block: int) -> int | None:
    """Check ``payload`` (whole crc blocks from ``first_block``; the record's last may be short).

    Returns None when every block matches, else the byte offset within the
    payload of the first bad block.
    """
    pos = 0
    index = first_block
    n = payload.nbytes
    while pos < n:
        take = min(CRC_BLOCK, n - pos)
        if crc32c.crc32c(payload[pos : pos + take]) != header.crcs[index]:
            return index * CRC_BLOCK
        pos += take
        index += 1
    return None


def padding(length: int) -> memoryview:
    """Zeros that pad a payload of ``length`` bytes to the next 4 KiB boundary."""
    return memoryview(_ZERO_BLOCK)[: align_up(length) - length]
