"""The on-drive record format: encode/decode round trips and every corruption detected."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shinglefs.store.record import (
    CRC_BLOCK,
    FLAG_GC_COPY,
    HEADER_BLOCK,
    HEADER_SIZE,
    MAX_RECORD_PAYLOAD,
    RecordDecodeError,
    RecordType,
    decode_header,
    encode_header,
    payload_block_crcs,
    record_footprint,
    verify_blocks,
)

u64 = st.integers(0, 2**64 - 1)


@given(sid=u64, off=st.integers(0, 2**26), group=u64, seq=u64,
       data=st.binary(min_size=0, max_size=3 * CRC_BLOCK // 64), flags=st.sampled_from([0, 1]))
def test_header_round_trips_every_field(sid, off, group, seq, data, flags):
    views = [memoryview(data)]
    crcs = payload_block_crcs(views, len(data))
    block = encode_header(RecordType.DATA, slice_id=sid, slice_offset=off, length=len(data),
                          group=group, seq=seq, crcs=crcs, flags=flags)
    assert len(block) == HEADER_BLOCK
    h = decode_header(block)
    assert (h.type, h.slice_id, h.slice_offset, h.length, h.group, h.seq, h.flags) == (
        RecordType.DATA, sid, off, len(data), group, seq, flags)
    assert h.is_gc_copy == bool(flags & FLAG_GC_COPY)
    assert verify_blocks(h, memoryview(data), 0) is None


def test_block_crcs_do_not_depend_on_how_the_payload_is_split():
    data = bytes(range(256)) * (3 * CRC_BLOCK // 256 + 17)
    whole = payload_block_crcs([memoryview(data)], len(data))
    cuts = [0, 1000, CRC_BLOCK - 1, CRC_BLOCK + 5, 2 * CRC_BLOCK, len(data)]
    pieces = [memoryview(data)[a:b] for a, b in itertools.pairwise(cuts)]
    assert payload_block_crcs(pieces, len(data)) == whole
    assert len(whole) == 4


@pytest.mark.parametrize("offset", range(HEADER_SIZE + 4))  # header + a one-entry table
def test_any_flipped_header_byte_is_detected(offset):
    data = b"x" * 5000
    block = encode_header(RecordType.DATA, slice_id=7, slice_offset=0, length=len(data),
                          group=3, seq=9, crcs=payload_block_crcs([memoryview(data)], len(data)))
    block[offset] ^= 0x40
    with pytest.raises(RecordDecodeError):
        decode_header(block)


def test_zeros_are_not_a_record():
    with pytest.raises(RecordDecodeError, match="zeros"):
        decode_header(bytes(HEADER_BLOCK))


def test_payload_corruption_is_located_to_its_block():
    data = bytearray(b"y" * (2 * CRC_BLOCK + 100))
    h = decode_header(encode_header(RecordType.DATA, slice_id=1, slice_offset=0,
                                    length=len(data), group=0, seq=1,
                                    crcs=payload_block_crcs([memoryview(data)], len(data))))
    data[CRC_BLOCK + 3] ^= 1
    assert verify_blocks(h, memoryview(data), 0) == CRC_BLOCK
    # Verifying only the last block does not see the damage in the middle one.
    assert verify_blocks(h, memoryview(data)[2 * CRC_BLOCK :], 2) is None


def test_footprint_is_header_block_plus_padded_payload():
    assert record_footprint(1) == 2 * 4096
    assert record_footprint(8 * 1024 * 1024) == 8 * 1024 * 1024 + 4096
    with pytest.raises(ValueError):
        encode_header(RecordType.DATA, slice_id=1, slice_offset=0,
                      length=MAX_RECORD_PAYLOAD + 1, group=0, seq=1, crcs=[])
