"""Hypothesis against the frame decoder and the header MAC: whatever the bytes,
the decoder answers a bounded header or FrameError, and a sealed header with any
byte changed is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shinglefs.server.auth import FrameOpener, FrameSealer
from shinglefs.server.errors import FrameError, FrameRejected
from shinglefs.server.wire import (
    HEADER_SIZE,
    KNOWN_FLAGS,
    NO_DRIVE,
    U63,
    Header,
    Kind,
    Limits,
    decode_header,
    payload_bound,
)
from shinglefs.store.api import MAX_SLICE_SIZE

LIMITS = Limits(max_piece=4 * 1024 * 1024)


def _check_bounded(header: Header) -> None:
    assert header.payload_len <= payload_bound(header.kind, LIMITS)
    assert header.flags & ~KNOWN_FLAGS == 0
    assert header.drive >= NO_DRIVE
    for value in (header.seq, header.request_id, header.slice_id, header.offset, header.arg):
        assert 0 <= value <= U63
    if header.kind == Kind.READ:
        assert header.arg <= LIMITS.max_piece
        assert header.offset + header.arg <= MAX_SLICE_SIZE


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE))
def test_any_bytes_decode_bounded_or_raise_frame_error(raw: bytes) -> None:
    try:
        header = decode_header(raw, LIMITS)
    except FrameError:
        return
    _check_bounded(header)


headers = st.builds(
    Header,
    kind=st.sampled_from([int(k) for k in Kind if k != Kind.ERROR]
                         + [k.response for k in Kind if 10 <= k < 63]),
    flags=st.sampled_from([0, KNOWN_FLAGS]),
    seq=st.just(0),
    request_id=st.integers(0, U63),
    slice_id=st.integers(0, U63),
    offset=st.integers(0, MAX_SLICE_SIZE),
    arg=st.integers(0, U63),
    drive=st.integers(NO_DRIVE, 2**31 - 1),
    payload_len=st.integers(0, 2**32 - 1),
)


@settings(max_examples=300, deadline=None)
@given(headers, st.integers(0, HEADER_SIZE - 1), st.integers(1, 255))
def test_a_changed_byte_is_refused(header: Header, position: int, flip: int) -> None:
    """Any header that decodes is accepted sealed, and refused with one byte changed."""
    try:
        decode_header(header.pack(), LIMITS)
    except FrameError:
        return
    key = b"k" * 32
    sealed = bytearray(FrameSealer(key).seal(header))
    FrameOpener(key).check(decode_header(sealed, LIMITS), sealed)
    sealed[position] ^= flip
    with pytest.raises((FrameError, FrameRejected)):
        FrameOpener(key).check(decode_header(sealed, LIMITS), sealed)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=HEADER_SIZE - 1))
def test_a_short_header_is_a_frame_error(raw: bytes) -> None:
    with pytest.raises(FrameError):
        decode_header(raw, LIMITS)
