"""The slice protocol's frames: a fixed header, bounded fields, a bulk payload.

Every frame, in both directions, is one 72-byte header followed by
``payload_len`` bytes of payload::

    offset size  field
     0      4    magic        b"SHFW"
     4      1    version      PROTOCOL_VERSION
     5      1    kind         Kind (request, response or handshake step)
     6      2    flags        Flag bits; unknown bits are refused
     8      8    seq          per-direction frame counter, 0, 1, 2... (replay/stale check)
    16      8    request_id   chosen by the client, echoed by the response
    24      8    slice_id
    32      8    offset       byte offset in the slice; size hint (PLACE), time budget (SCRUB)
    40      8    arg          group (PUT, PLACE), length (READ), rate (SCRUB), result (answers)
    48      4    drive        drive id, -1 for "any / not given" (signed)
    52      4    payload_len  bytes that follow; bounded per kind (``Limits``)
    56     16    mac          HMAC-SHA256(direction key, header[0:56]) truncated to 16 bytes

All integers are little-endian. The MAC covers the header only: the payload
of a PUT or a READ answer is not authenticated by it (hashing every byte would
halve the throughput; TLS protects payloads in flight, see docs/network.md).

``decode_header`` checks everything that can be checked without a key: magic,
version, kind, flags, field ranges and the payload bound of the kind. It
raises ``FrameError`` and never anything else, whatever the 72 bytes are.
The MAC and ``seq`` are checked by ``auth.FrameSealer``.

Reading a frame never copies its payload: ``read_frame`` reads the header
into a reused buffer and the payload with ``recv_into`` straight into a
buffer of exactly ``payload_len`` bytes that is then handed on as is.
"""

from __future__ import annotations

import enum
import json
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

from shinglefs.server.errors import FrameError, PeerClosed
from shinglefs.store.api import MAX_SLICE_SIZE
from shinglefs.zoned.fileio import Payload

MAGIC = b"SHFW"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<4sBBHQQQQQiI16s")
HEADER_SIZE = HEADER.size  # 72
MAC_SIZE = 16
SIGNED_SIZE = HEADER_SIZE - MAC_SIZE
NO_DRIVE = -1
U63 = (1 << 63) - 1
NONCE_SIZE = 32
PROOF_SIZE = 32
IOV_MAX = 1024  # buffers one sendmsg takes (Linux UIO_MAXIOV)
# JSON bodies (stats, drive lists, errors) and flush's drive list stay small.
MAX_CONTROL_PAYLOAD = 1 << 20


class Kind(enum.IntEnum):
    """What a frame is. Requests are below 64, their responses are ``request | 64``."""

    HELLO = 1  # client -> server: client nonce
    CHALLENGE = 2  # server -> client: server nonce + server proof
    PROOF = 3  # client -> server: client proof
    WELCOME = 4  # server -> client: handshake done (first sealed frame)
    PING = 10
    PUT = 11  # payload: the piece; arg: lifetime group; flag DURABLE
    FLUSH = 12  # payload: JSON list of drive ids, or empty for all drives
    READ = 13  # arg: length
    LENGTH = 14
    DELETE = 15
    STATS = 16
    DRIVES = 17
    PLACE = 18  # arg: lifetime group; offset: size hint
    SCRUB = 19  # drive: the drive; arg: rate limit, bytes/s (0: none); offset: time budget, ms
    ERROR = 63  # sent as ERROR | 64 in answer to any request: JSON body of a typed error

    @property
    def response(self) -> int:
        return int(self) | RESPONSE_BIT


RESPONSE_BIT = 64
REQUESTS = frozenset({Kind.PING, Kind.PUT, Kind.FLUSH, Kind.READ, Kind.LENGTH,
                      Kind.DELETE, Kind.STATS, Kind.DRIVES, Kind.PLACE, Kind.SCRUB})
HANDSHAKE = frozenset({Kind.HELLO, Kind.CHALLENGE, Kind.PROOF, Kind.WELCOME})


class Flag(enum.IntFlag):
    DURABLE = 1  # PUT: acknowledge only after the piece is durable on its drive


KNOWN_FLAGS = int(Flag.DURABLE)


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds every peer enforces on what it receives.

    ``max_piece``: the largest PUT payload and READ length (a slice is at most
    ``MAX_SLICE_SIZE``). ``max_in_flight`` / ``max_in_flight_bytes``: requests
    and payload bytes one connection may have outstanding at the server before
    it stops reading that connection (back-pressure through TCP).
    """

    max_piece: int = MAX_SLICE_SIZE
    max_in_flight: int = 64
    max_in_flight_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Header:
    """One decoded frame header (see the module docstring for the fields)."""

    kind: int
    flags: int = 0
    seq: int = 0
    request_id: int = 0
    slice_id: int = 0
    offset: int = 0
    arg: int = 0
    drive: int = NO_DRIVE
    payload_len: int = 0
    mac: bytes = bytes(MAC_SIZE)

    @property
    def is_response(self) -> bool:
        return bool(self.kind & RESPONSE_BIT)

    @property
    def request_kind(self) -> Kind:
        return Kind(self.kind & ~RESPONSE_BIT)

    def pack(self, seq: int | None = None) -> bytes:
        """The 72 header bytes (``seq``: instead of this header's own)."""
        return HEADER.pack(MAGIC, PROTOCOL_VERSION, self.kind, self.flags,
                           self.seq if seq is None else seq, self.request_id, self.slice_id,
                           self.offset, self.arg, self.drive, self.payload_len, self.mac)


def payload_bound(kind: int, limits: Limits) -> int:
    """The largest payload a frame of ``kind`` may carry."""
    if kind in (Kind.PUT, Kind.READ.response):
        return limits.max_piece
    if kind == Kind.HELLO:
        return NONCE_SIZE
    if kind == Kind.CHALLENGE:
        return NONCE_SIZE + PROOF_SIZE
    if kind == Kind.PROOF:
        return PROOF_SIZE
    if kind & ~RESPONSE_BIT in (Kind.FLUSH, Kind.STATS, Kind.DRIVES, Kind.ERROR):
        return MAX_CONTROL_PAYLOAD
    if kind == Kind.SCRUB.response:  # the request's parameters are in its (MACed) header
        return MAX_CONTROL_PAYLOAD
    return 0


# Every kind a frame may carry: the handshake steps, the requests, their answers.
VALID_KINDS = frozenset({int(k) for k in HANDSHAKE | REQUESTS}
                        | {k | RESPONSE_BIT for k in REQUESTS} | {Kind.ERROR | RESPONSE_BIT})


def decode_header(raw: bytes | bytearray | memoryview, limits: Limits) -> Header:
    """Decode and bound-check 72 header bytes; raises ``FrameError`` only."""
    if len(raw) != HEADER_SIZE:
        raise FrameError(f"a frame header is {HEADER_SIZE} bytes, got {len(raw)}")
    (magic, version, kind, flags, seq, request_id, slice_id, offset, arg, drive,
     payload_len, mac) = HEADER.unpack(raw)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}")
    if version != PROTOCOL_VERSION:
        raise FrameError(f"protocol version {version}, this side speaks {PROTOCOL_VERSION}")
    if kind not in VALID_KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if flags & ~KNOWN_FLAGS:
        raise FrameError(f"unknown flags {flags:#x}")
    for name, value in (("seq", seq), ("request_id", request_id), ("slice_id", slice_id),
                        ("offset", offset), ("arg", arg)):
        if value > U63:
            raise FrameError(f"{name} {value} is out of range")
    if drive < NO_DRIVE:
        raise FrameError(f"drive {drive} is out of range")
    bound = payload_bound(kind, limits)
    if payload_len > bound:
        raise FrameError(f"payload of {payload_len} bytes for kind {kind}, at most {bound}")
    end = offset + (payload_len if kind == Kind.PUT else arg if kind == Kind.READ else 0)
    if kind in (Kind.PUT, Kind.READ) and end > MAX_SLICE_SIZE:
        raise FrameError(f"range at {offset} is past the largest slice ({MAX_SLICE_SIZE})")
    if kind == Kind.READ and arg > limits.max_piece:
        raise FrameError(f"read of {arg} bytes, at most {limits.max_piece}")
    return Header(kind, flags, seq, request_id, slice_id, offset, arg, drive, payload_len,
                  bytes(mac))


def until(sock: socket.socket, deadline: float) -> None:
    """Give ``sock`` the time left until ``deadline`` (``time.monotonic``) as its
    timeout; ``TimeoutError`` when none is left. A socket's own timeout bounds
    each call, so a peer that sends a byte now and then would restart it: a
    loop of calls that must end by a deadline sets it before each one."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    sock.settimeout(left)


def recv_exactly(sock: socket.socket, buf: bytearray | memoryview,
                 deadline: float | None = None) -> None:
    """Fill ``buf`` from ``sock`` with ``recv_into`` (no copy). Raises ``PeerClosed``
    when the peer closes first (``truncated`` tells whether some bytes came).
    ``deadline`` (``time.monotonic``): all of ``buf`` must have come by then,
    however the peer spaces its bytes, else ``TimeoutError``; it sets the
    socket's timeout (``until``), which the caller restores.

    A plain socket is asked for the whole rest at once (``MSG_WAITALL``): a 4 MiB
    piece arrives in one or a few system calls instead of one per burst the
    kernel queued, each of which took the GIL back (``bench wire``, 4 MiB
    pieces over 4 connections: 2,403 -> 2,695 MiB/s, median of 4). TLS
    sockets take no flags."""
    view = memoryview(buf).cast("B")
    got = 0
    total = len(view)
    flags = socket.MSG_WAITALL if type(sock) is socket.socket else 0
    while got < total:
        if deadline is not None:
            until(sock, deadline)
        n = sock.recv_into(view[got:], total - got, flags)
        if n == 0:
            raise PeerClosed(truncated=got > 0)
        got += n


def read_frame(sock: socket.socket, header_buf: bytearray,
               limits: Limits) -> tuple[Header, bytearray]:
    """Read one frame: the header into ``header_buf``, the payload into a fresh
    buffer of exactly its length. Raises ``FrameError`` for a malformed header,
    ``PeerClosed`` at the end of the stream, ``OSError`` from the socket."""
    recv_exactly(sock, header_buf)
    header = decode_header(header_buf, limits)
    payload = bytearray(header.payload_len)
    if header.payload_len:
        try:
            recv_exactly(sock, payload)
        except PeerClosed:
            raise PeerClosed(truncated=True) from None
    return header, payload


def send_frame(sock: socket.socket, header_bytes: bytes,
               payload: bytes | bytearray | memoryview | Payload = b"") -> None:
    """Send a packed header and its payload; a large payload goes out from its own
    buffer(s) — a ``Payload``'s views one after another — never joined. The
    caller holds the connection's send lock."""
    views = payload.views if isinstance(payload, Payload) else [memoryview(payload)]
    size = sum(v.nbytes for v in views)
    if size <= 64 * 1024:
        sock.sendall(header_bytes + b"".join(views) if size else header_bytes)
        return
    if type(sock) is socket.socket:  # TLS sockets have no sendmsg
        _send_gathered(sock, [memoryview(header_bytes), *views])
        return
    sock.sendall(header_bytes)
    for view in views:
        sock.sendall(view)


def _send_gathered(sock: socket.socket, views: list[memoryview]) -> None:
    """``sendall`` of several buffers, gathered by ``sendmsg``: a header and its
    payload leave in one system call (one wake-up of the receiver, not two),
    nothing joined."""
    while views:
        sent = sock.sendmsg(views[:IOV_MAX])
        while views and sent >= views[0].nbytes:
            sent -= views.pop(0).nbytes
        if sent:
            views[0] = views[0].cast("B")[sent:]


def encode_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def decode_json(payload: bytes | bytearray | memoryview) -> Any:
    """Parse a JSON body; a body that is not JSON, or nests deeper than the
    parser recurses (``RecursionError``: ``b"[" * 200000``), is a ``FrameError``."""
    try:
        return json.loads(bytes(payload)) if payload else None
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"a control body is not JSON: {exc}") from None
    except RecursionError:
        raise FrameError("a control body nests too deep to parse") from None
