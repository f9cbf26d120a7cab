"""Hypothesis against the frame decoder and the header MAC: whatever the bytes,
the decoder answers a bounded header or FrameError, and a sealed header with any
byte changed is refused; and against a live server, authenticated requests with
arbitrary fields are answered or close only their own connection."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shinglefs.server.auth import FrameOpener, FrameSealer, client_handshake
from shinglefs.server.errors import FrameError, FrameRejected, PeerClosed
from shinglefs.server.node import StorageNode
from shinglefs.server.remote import RemoteNode
from shinglefs.server.service import SliceServer
from shinglefs.server.wire import (
    HEADER_SIZE,
    KNOWN_FLAGS,
    NO_DRIVE,
    REQUESTS,
    U63,
    Header,
    Kind,
    Limits,
    decode_header,
    payload_bound,
    read_frame,
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


# ---------------------------------------------------------------- a live server
# Authenticated but hostile: requests with arbitrary fields and payloads, sealed
# correctly so they pass the MAC and reach the dispatcher and the node. Each is
# answered (its answer or an ERROR) or closes its own connection; the server
# keeps serving a well-behaved client. A node of its own: these requests
# delete and place arbitrary slices.
SECRET = b"cluster secret of the fuzz tests"
MiB = 1024 * 1024
_fresh = itertools.count(1000)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SliceServer, RemoteNode]]:
    root = tmp_path_factory.mktemp("fuzzdrives")
    node = StorageNode.open([(i, f"emulated:{root}/d{i}.img:{256 * MiB}") for i in range(2)],
                            create=True, zone_size=16 * MiB)
    with SliceServer(node, SECRET, handshake_timeout=2.0) as server, \
            RemoteNode(server.address, SECRET, connections=1, timeout=30) as client:
        yield server, client
    node.close()


requests = st.tuples(
    st.sampled_from(sorted(REQUESTS)),
    st.integers(0, 4),  # slice id: few, so that requests meet the same slices
    st.integers(0, 2 * MiB),  # offset
    st.integers(0, 2 * MiB),  # arg
    st.integers(NO_DRIVE, 3),  # drive, some unknown
    st.sampled_from([0, KNOWN_FLAGS]),
    st.one_of(st.binary(max_size=4096), st.just(b"[0,1]"), st.just(b"[7]"), st.just(b"null")),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(requests, min_size=1, max_size=4))
def test_hostile_requests_are_answered_or_close_their_connection(
        live: tuple[SliceServer, RemoteNode],
        batch: list[tuple[int, int, int, int, int, int, bytes]]) -> None:
    server, client = live
    with socket.create_connection(server.address, timeout=20) as sock:
        sealer, opener, _ = client_handshake(sock, SECRET, Limits())
        header_buf = bytearray(HEADER_SIZE)
        for rid, (kind, sid, offset, arg, drive, flags, body) in enumerate(batch):
            payload = body if kind in (Kind.PUT, Kind.FLUSH) else b""
            header = Header(kind, flags=flags, request_id=rid, slice_id=sid, offset=offset,
                            arg=arg, drive=drive, payload_len=len(payload))
            try:
                decode_header(header.pack(), Limits())
            except FrameError:
                continue  # the server would close at once: covered by the decoder tests
            sock.sendall(sealer.seal(header) + payload)
            try:
                answer, _ = read_frame(sock, header_buf, Limits())
            except (PeerClosed, ConnectionResetError):
                break  # refused: this connection only
            opener.check(answer, header_buf)
            assert answer.request_id == rid
            assert answer.kind in (Kind(kind).response, Kind.ERROR.response)
    sid = next(_fresh)  # the well-behaved client never noticed
    client.write(sid, 0, b"still served", group=1)
    assert client.read(sid, 0, 100) == b"still served"
