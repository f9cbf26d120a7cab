"""Authentication of the slice protocol: a mutual HMAC challenge-response on the
cluster secret, then a MAC and a sequence number on every frame header.

Handshake (each step one frame of ``wire``; nonces are 32 bytes from ``secrets``)::

    client -> server  HELLO      client nonce Nc
    server -> client  CHALLENGE  server nonce Ns, HMAC(K, "server" | Nc | Ns)
    client -> server  PROOF      HMAC(K, "client" | Nc | Ns)
    server -> client  WELCOME    first sealed frame (seq 0), arg = the server's max piece

``K`` is the cluster secret. Each side checks the other's proof with
``hmac.compare_digest`` before it sends anything else, so neither side
learns whether a guess was close, and a proof recorded from an earlier
connection is worthless: the other side's nonce is new. Both sides then derive
one key per direction, ``HMAC(K, "c2s" | Nc | Ns)`` and ``HMAC(K, "s2c" | Nc | Ns)``,
used only by this connection: a frame replayed into another connection, or
reflected back to its sender, fails its MAC.

After the handshake every frame header carries ``seq`` (0, 1, 2... per
direction) and a 16-byte HMAC-SHA256 of the other 56 header bytes under the
direction's key (``FrameSealer``/``FrameOpener``). A header with a wrong MAC is
forged; one with a good MAC but an unexpected ``seq`` is stale or replayed.
Both raise ``FrameRejected``, and the receiver closes the connection.

What it does not do: payloads are not authenticated or encrypted (TLS, when
configured with ``tls_server_context``/``tls_client_context``, does that), and
the secret is symmetric — anyone holding it is a
member of the cluster.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import ssl

from shinglefs.server.errors import AuthFailed, FrameError, FrameRejected, PeerClosed
from shinglefs.server.wire import (
    HEADER_SIZE,
    MAC_SIZE,
    NONCE_SIZE,
    PROOF_SIZE,
    SIGNED_SIZE,
    Header,
    Kind,
    Limits,
    decode_header,
    recv_exactly,
    send_frame,
    until,
)

MIN_SECRET_BYTES = 16
_LABEL = b"shinglefs/slice-protocol/1/"


def check_secret(secret: bytes) -> bytes:
    """The cluster secret as bytes; raises ``ValueError`` when it is too short to resist guessing."""
    if not isinstance(secret, bytes | bytearray) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"a cluster secret is at least {MIN_SECRET_BYTES} bytes")
    return bytes(secret)


def _mac(key: bytes, label: bytes, *parts: bytes | bytearray | memoryview) -> bytes:
    mac = hmac.new(key, _LABEL + label, hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()


def server_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return _mac(secret, b"server", client_nonce, server_nonce)


def client_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return _mac(secret, b"client", client_nonce, server_nonce)


def session_keys(secret: bytes, client_nonce: bytes, server_nonce: bytes) -> tuple[bytes, bytes]:
    """``(client-to-server key, server-to-client key)`` of one connection."""
    return (_mac(secret, b"c2s", client_nonce, server_nonce),
            _mac(secret, b"s2c", client_nonce, server_nonce))


class FrameSealer:
    """Stamps the frames one side sends: the next ``seq`` and the header MAC.

    Not thread-safe: the caller holds the connection's send lock, so frames
    leave in the order of their ``seq``."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._next = 0

    def seal(self, header: Header) -> bytes:
        """The packed header, numbered and authenticated."""
        signed = header.pack(seq=self._next)[:SIGNED_SIZE]
        self._next += 1
        return signed + hmac.digest(self._key, signed, "sha256")[:MAC_SIZE]


class FrameOpener:
    """Checks the frames one side receives: MAC first (forged?), then ``seq`` (stale or replayed?)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._next = 0

    def check(self, header: Header, raw: bytes | bytearray | memoryview) -> None:
        """Accept ``header`` (decoded from the 72 bytes ``raw``) or raise ``FrameRejected``."""
        view = memoryview(raw)
        expected = hmac.digest(self._key, view[:SIGNED_SIZE], "sha256")[:MAC_SIZE]
        if not hmac.compare_digest(expected, view[SIGNED_SIZE:HEADER_SIZE]):
            raise FrameRejected(f"frame {header.seq} (kind {header.kind}) has a bad MAC: forged "
                                "or from another connection")
        if header.seq != self._next:
            raise FrameRejected(f"frame {header.seq} (kind {header.kind}) is out of sequence, "
                                f"expected {self._next}: stale or replayed")
        self._next += 1


def _expect(sock: socket.socket, kind: Kind, size: int, limits: Limits,
            header_buf: bytearray, deadline: float | None) -> tuple[Header, bytearray]:
    """Read one handshake step by ``deadline``; its kind and size are checked
    before its payload is read. ``PeerClosed`` when the peer closes first."""
    recv_exactly(sock, header_buf, deadline)
    header = decode_header(header_buf, limits)
    if header.kind != kind or header.payload_len != size:
        raise FrameError(f"handshake expected {kind.name} with {size} bytes, got kind "
                         f"{header.kind} with {header.payload_len}")
    payload = bytearray(size)
    try:
        recv_exactly(sock, payload, deadline)
    except PeerClosed:
        raise PeerClosed(truncated=True) from None
    return header, payload


def _send(sock: socket.socket, header_bytes: bytes, payload: bytes, deadline: float | None) -> None:
    """Send one handshake step, by ``deadline`` (``sendall`` counts its timeout
    for the whole call)."""
    if deadline is not None:
        until(sock, deadline)
    send_frame(sock, header_bytes, payload)


def client_handshake(sock: socket.socket, secret: bytes, limits: Limits,
                     deadline: float | None = None) -> tuple[FrameSealer, FrameOpener, int]:
    """Authenticate a fresh connection from the client side, all of it by
    ``deadline`` (``time.monotonic``; None: the socket's own timeout, per call).

    Returns ``(sealer, opener, server max piece)``. Raises ``AuthFailed`` when
    the server does not prove the cluster secret, ``FrameError`` on a
    malformed answer, ``PeerClosed`` when the server closes the connection
    before the WELCOME (it proved the secret, or did not get as far: it is
    full, stopping, or timed us out, not refusing our proof), ``OSError`` from
    the socket (``TimeoutError`` at the deadline). Leaves the socket's timeout
    set to what was left of the deadline."""
    header_buf = bytearray(HEADER_SIZE)
    nc = secrets.token_bytes(NONCE_SIZE)
    _send(sock, Header(Kind.HELLO, payload_len=NONCE_SIZE).pack(), nc, deadline)
    _, body = _expect(sock, Kind.CHALLENGE, NONCE_SIZE + PROOF_SIZE, limits, header_buf,
                      deadline)
    ns, proof = bytes(body[:NONCE_SIZE]), bytes(body[NONCE_SIZE:])
    if not hmac.compare_digest(proof, server_proof(secret, nc, ns)):
        raise AuthFailed("the server's proof is wrong: it does not hold this cluster secret")
    _send(sock, Header(Kind.PROOF, payload_len=PROOF_SIZE).pack(),
          client_proof(secret, nc, ns), deadline)
    c2s, s2c = session_keys(secret, nc, ns)
    opener = FrameOpener(s2c)
    welcome, _ = _expect(sock, Kind.WELCOME, 0, limits, header_buf, deadline)
    opener.check(welcome, header_buf)
    return FrameSealer(c2s), opener, welcome.arg


def server_handshake(sock: socket.socket, secret: bytes, limits: Limits,
                     deadline: float | None = None) -> tuple[FrameSealer, FrameOpener]:
    """Authenticate a fresh connection from the server side, all of it by
    ``deadline`` (``time.monotonic``: a peer that sends a byte now and then
    gets no more time; None: the socket's own timeout, per call).

    Returns ``(sealer, opener)`` with the WELCOME already sent. Raises
    ``AuthFailed`` for a wrong or replayed proof or a peer that closes during
    the handshake, ``FrameError`` for a malformed step, ``OSError`` from the
    socket (``TimeoutError`` at the deadline). The caller logs and closes."""
    header_buf = bytearray(HEADER_SIZE)
    try:
        _, nc = _expect(sock, Kind.HELLO, NONCE_SIZE, limits, header_buf, deadline)
        ns = secrets.token_bytes(NONCE_SIZE)
        _send(sock, Header(Kind.CHALLENGE, payload_len=NONCE_SIZE + PROOF_SIZE).pack(),
              ns + server_proof(secret, bytes(nc), ns), deadline)
        _, proof = _expect(sock, Kind.PROOF, PROOF_SIZE, limits, header_buf, deadline)
    except PeerClosed as exc:
        raise AuthFailed(f"the peer closed the connection during the handshake ({exc})") from None
    if not hmac.compare_digest(bytes(proof), client_proof(secret, bytes(nc), ns)):
        raise AuthFailed("the client's proof is wrong: another cluster secret, or a "
                         "handshake replayed from an earlier connection")
    c2s, s2c = session_keys(secret, bytes(nc), ns)
    sealer = FrameSealer(s2c)
    if deadline is not None:
        until(sock, deadline)
    send_frame(sock, sealer.seal(Header(Kind.WELCOME, arg=limits.max_piece)))
    return sealer, FrameOpener(c2s)


def tls_server_context(certfile: str, keyfile: str, cafile: str | None = None) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) for ``SliceServer(ssl_context=...)``.

    ``cafile``: also require and verify a client certificate signed by it
    (mutual TLS); the cluster-secret handshake runs inside TLS either way.
    Raises ``OSError``/``ssl.SSLError`` for unreadable or mismatched files."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    if cafile is not None:
        context.load_verify_locations(cafile)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def tls_client_context(cafile: str, certfile: str | None = None,
                       keyfile: str | None = None) -> ssl.SSLContext:
    """A client-side TLS context for ``RemoteNode(ssl_context=...)``: the server's
    certificate must chain to ``cafile`` and name the address dialled (or
    ``server_hostname``); ``certfile``/``keyfile``: our certificate for mutual TLS."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if certfile is not None:
        context.load_cert_chain(certfile, keyfile)
    return context
