"""The slice protocol against a live server on loopback: a real StorageNode over
emulated drives, served by SliceServer, used through RemoteNode or raw sockets."""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shinglefs.server.auth import (
    FrameOpener,
    FrameSealer,
    client_proof,
    server_handshake,
    session_keys,
)
from shinglefs.server.errors import (
    AuthFailed,
    ConnectionLost,
    RequestTimeout,
    ServerUnreachable,
    SliceMissing,
    UnknownDrive,
)
from shinglefs.server.node import StorageNode
from shinglefs.server.remote import RemoteNode
from shinglefs.server.service import SliceServer, _Connection
from shinglefs.server.wire import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    NONCE_SIZE,
    PROOF_SIZE,
    PROTOCOL_VERSION,
    Header,
    Kind,
    Limits,
    decode_header,
    read_frame,
)
from shinglefs.zoned.fileio import Payload

MiB = 1024 * 1024
SECRET = b"cluster secret of the tests, 32B"


def drive_specs(root: Path, count: int = 2) -> list[tuple[int, str]]:
    return [(i, f"emulated:{root}/d{i}.img:{256 * MiB}") for i in range(count)]


# One node and server for the module (formatting drives is the slow part);
# every test uses slice ids of its own.
@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageNode]:
    n = StorageNode.open(drive_specs(tmp_path_factory.mktemp("drives")), create=True,
                         zone_size=16 * MiB)
    yield n
    n.close()


@pytest.fixture(scope="module")
def server(node: StorageNode) -> Iterator[SliceServer]:
    with SliceServer(node, SECRET, handshake_timeout=1.0) as s:
        yield s


@pytest.fixture
def client(server: SliceServer) -> Iterator[RemoteNode]:
    with RemoteNode(server.address, SECRET, connections=3, timeout=20) as c:
        yield c


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (EOF or reset); waits at most 10 s."""
    sock.settimeout(10)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def raw_connect(server: SliceServer) -> socket.socket:
    return socket.create_connection(server.address, timeout=10)


def raw_handshake(sock: socket.socket, secret: bytes = SECRET,
                  nonce: bytes | None = None, proof: bytes | None = None) -> dict[str, bytes]:
    """The client's side of the handshake by hand; returns what it sent and the keys."""
    nc = nonce or os.urandom(NONCE_SIZE)
    hello = Header(Kind.HELLO, payload_len=NONCE_SIZE).pack() + nc
    sock.sendall(hello)
    header, body = read_frame(sock, bytearray(HEADER_SIZE), Limits())
    assert header.kind == Kind.CHALLENGE
    ns = bytes(body[:NONCE_SIZE])
    sent_proof = proof or client_proof(secret, nc, ns)
    proof_frame = Header(Kind.PROOF, payload_len=PROOF_SIZE).pack() + sent_proof
    sock.sendall(proof_frame)
    c2s, s2c = session_keys(secret, nc, ns)
    return {"hello": hello, "proof": sent_proof, "nonce": nc, "c2s": c2s, "s2c": s2c}


def logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


# ---------------------------------------------------------------- requests
def test_pieces_round_trip_bit_exact(client: RemoteNode, node: StorageNode) -> None:
    data = {sid: os.urandom(5 * MiB + 123) for sid in (11, 12, 13)}
    futures = []
    for sid, blob in data.items():  # pipelined: every piece in flight before any answer
        for off in range(0, len(blob), 2 * MiB):
            futures.append(client.submit_write(sid, off, memoryview(blob)[off:off + 2 * MiB],
                                               group=sid % 2))
    drives = {f.result() for f in futures}
    assert drives <= set(node.drive_ids)
    client.flush()
    for sid, blob in data.items():
        assert client.read(sid, 0, len(blob)) == blob
        assert client.read(sid, 3 * MiB - 7, 1000) == blob[3 * MiB - 7:3 * MiB + 993]
        assert client.read(sid, len(blob) - 10, MiB) == blob[-10:]  # short at the end
        assert client.length(sid) == len(blob)
        assert node.read(sid, 0, len(blob)) == blob  # really on the node's drives
    client.delete(11)
    with pytest.raises(SliceMissing) as missing:
        client.read(11, 0, 1)
    assert missing.value.slice_id == 11
    client.delete(11)  # idempotent


@pytest.mark.parametrize("sizes", [(100, 200, 300), (MiB, 3 * MiB + 5, 17)])
def test_a_piece_of_several_buffers_is_sent_unjoined_and_stored_in_order(
        client: RemoteNode, sizes: tuple[int, ...]) -> None:
    parts = [os.urandom(n) for n in sizes]
    sid = 900 + len(sizes) + sizes[0] % 7
    client.write(sid, 0, Payload(parts), group=1)  # a writer's pending buffers, as they are
    assert client.read(sid, 0, sum(sizes)) == b"".join(parts)


def test_node_calls_mirror_storage_node(client: RemoteNode, node: StorageNode) -> None:
    assert client.drive_ids == node.drive_ids
    drive = client.place(77, group=5, size_hint=MiB)
    assert drive in node.drive_ids
    assert client.write(77, 0, b"x" * 4096, group=5, durable=True) == drive
    assert client.write(78, 0, b"y" * 10, group=6, drive_id=1) == 1
    client.flush([0, 1])
    stats = client.stats()
    local = node.stats()
    assert stats.capacity_bytes == local.capacity_bytes
    assert [d.drive_id for d in stats.drives] == node.drive_ids
    assert stats.user_bytes_written == local.user_bytes_written >= 4106
    with pytest.raises(UnknownDrive) as unknown:
        client.read(77, 0, 1, drive_id=9)
    assert unknown.value.drive_id == 9
    client.ping()


def test_pipelined_concurrent_clients(server: SliceServer) -> None:
    blobs = {(c, s): os.urandom(3 * MiB) for c in range(4) for s in range(4)}
    errors: list[BaseException] = []

    def writer(c: int) -> None:
        try:
            with RemoteNode(server.address, SECRET, connections=2, timeout=20) as rn:
                futures = [rn.submit_write(1000 * c + s, off, blobs[c, s][off:off + MiB], 1)
                           for s in range(4) for off in range(0, 3 * MiB, MiB)]
                for f in futures:
                    f.result()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with RemoteNode(server.address, SECRET, connections=4) as reader:
        reads = {key: reader.submit_read(1000 * key[0] + key[1], 0, 3 * MiB) for key in blobs}
        for key, future in reads.items():
            assert future.result() == blobs[key]


# ---------------------------------------------------------------- authentication
def test_wrong_secret_is_refused_and_logged(server: SliceServer,
                                            caplog: pytest.LogCaptureFixture) -> None:
    with RemoteNode(server.address, b"another secret of 32 bytes......") as stranger, \
            pytest.raises(AuthFailed):
        stranger.ping()
    # a client that ignores the server's proof and answers with a guess
    with raw_connect(server) as sock:
        raw_handshake(sock, secret=b"a wrong guess at the secret.....")
        assert closed_by_peer(sock)
    assert logged(caplog, "AuthFailed: the client's proof is wrong")


def test_replayed_handshake_is_refused(server: SliceServer, client: RemoteNode,
                                       caplog: pytest.LogCaptureFixture) -> None:
    with raw_connect(server) as first:
        recorded = raw_handshake(first)
        header, _ = read_frame(first, bytearray(HEADER_SIZE), Limits())
        assert header.kind == Kind.WELCOME  # the recorded exchange was accepted
    with raw_connect(server) as second:  # same nonce, same proof: the server's nonce is new
        raw_handshake(second, nonce=recorded["nonce"], proof=recorded["proof"])
        assert closed_by_peer(second)
    assert logged(caplog, "AuthFailed")
    client.ping()


def test_replayed_or_forged_frame_is_refused(server: SliceServer, client: RemoteNode,
                                             caplog: pytest.LogCaptureFixture) -> None:
    with raw_connect(server) as sock:
        keys = raw_handshake(sock)
        read_frame(sock, bytearray(HEADER_SIZE), Limits())  # WELCOME
        ping = FrameSealer(keys["c2s"]).seal(Header(Kind.PING, request_id=1, arg=42))
        sock.sendall(ping)
        answer, _ = read_frame(sock, bytearray(HEADER_SIZE), Limits())
        assert answer.kind == Kind.PING.response and answer.arg == 42
        sock.sendall(ping)  # the same frame again
        assert closed_by_peer(sock)
    assert logged(caplog, "out of sequence")
    with raw_connect(server) as sock:
        raw_handshake(sock)
        read_frame(sock, bytearray(HEADER_SIZE), Limits())
        sock.sendall(Header(Kind.PING, request_id=1).pack())  # no MAC
        assert closed_by_peer(sock)
    assert logged(caplog, "bad MAC")
    client.ping()


def test_silent_peer_is_dropped_after_the_handshake_timeout(server: SliceServer,
                                                            client: RemoteNode) -> None:
    with raw_connect(server) as sock:
        assert closed_by_peer(sock)
    client.ping()


# ---------------------------------------------------------------- hostile frames
def _frame(kind: int = Kind.HELLO, payload_len: int = NONCE_SIZE, magic: bytes = MAGIC,
           version: int = PROTOCOL_VERSION, flags: int = 0) -> bytes:
    return HEADER.pack(magic, version, kind, flags, 0, 0, 0, 0, 0, -1, payload_len, bytes(16))


HOSTILE = {  # what the client sends first -> the typed error the server logs
    "bad magic": (_frame(magic=b"HTTP"), "FrameError: bad magic"),
    "other version": (_frame(version=9), "FrameError: protocol version 9"),
    "unknown kind": (_frame(kind=200), "FrameError: unknown frame kind 200"),
    "unknown flags": (_frame(flags=0x80), "FrameError: unknown flags"),
    "oversized payload": (_frame(payload_len=1 << 31), "FrameError: payload of 2147483648"),
    "request before handshake": (_frame(kind=Kind.PUT, payload_len=10),
                                 "FrameError: handshake expected HELLO"),
    "truncated header": (_frame()[:40], "AuthFailed: the peer closed the connection during "
                                        "the handshake (the peer closed the connection in the "
                                        "middle of a frame)"),
    "truncated payload": (_frame() + b"short", "in the middle of a frame"),
    "text": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(100), "FrameError: bad magic"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_frame_closes_only_its_connection(name: str, server: SliceServer,
                                                  client: RemoteNode,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    sid = 500 + sorted(HOSTILE).index(name)
    client.write(sid, 0, b"before", group=1)
    frame, error = HOSTILE[name]
    with raw_connect(server) as sock:
        sock.sendall(frame)
        if name.startswith("truncated"):
            sock.shutdown(socket.SHUT_WR)
        assert closed_by_peer(sock)
    assert logged(caplog, error)
    client.write(sid, 6, b" and after", group=1)  # the other client never noticed
    assert client.read(sid, 0, 100) == b"before and after"


def test_hostile_frame_after_the_handshake(server: SliceServer, client: RemoteNode,
                                           caplog: pytest.LogCaptureFixture) -> None:
    limits = Limits()
    for header in (Header(Kind.PUT, slice_id=1, payload_len=limits.max_piece + 1),
                   Header(Kind.READ, slice_id=1, arg=limits.max_piece + 1),
                   Header(Kind.PING.response, request_id=3)):
        with raw_connect(server) as sock:
            keys = raw_handshake(sock)
            read_frame(sock, bytearray(HEADER_SIZE), limits)
            raw = FrameSealer(keys["c2s"]).seal(header)
            sock.sendall(raw)
            assert closed_by_peer(sock)
    assert logged(caplog, "FrameError")
    client.ping()


# ---------------------------------------------------------------- a server that dies
SERVE = """
import sys, time
from shinglefs.server.node import StorageNode
from shinglefs.server.service import SliceServer
node = StorageNode.open([(0, sys.argv[1])], create=True, zone_size=16 << 20)
server = SliceServer(node, sys.argv[2].encode()).start()
print(server.address[1], flush=True)
time.sleep(600)
"""


def test_killed_server_gives_typed_errors_not_a_hang(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, f"emulated:{tmp_path}/d.img:{256 * MiB}", SECRET.decode()],
        stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with RemoteNode(("127.0.0.1", port), SECRET, connections=2, timeout=30) as rn:
            rn.write(1, 0, b"a" * MiB, group=1)
            piece = os.urandom(MiB)
            futures = [rn.submit_write(2 + i % 2, (i // 2) * MiB, piece, group=1)
                       for i in range(40)]
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            outcomes = []
            for f in futures:
                try:
                    f.result(timeout=60)
                    outcomes.append("stored")
                except ConnectionLost:
                    outcomes.append("lost")
            assert "lost" in outcomes
            with pytest.raises(ServerUnreachable):
                rn.read(1, 0, 10)
            with pytest.raises(ServerUnreachable, match="refused"):  # remembered: no new wait
                rn.length(2)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_decode_header_accepts_what_pack_makes() -> None:
    header = Header(Kind.READ, seq=3, request_id=9, slice_id=7, offset=MiB, arg=MiB, drive=1)
    assert decode_header(header.pack(), Limits()) == header


def test_readinto_fills_the_callers_buffer(client: RemoteNode) -> None:
    blob = os.urandom(2 * MiB + 17)
    client.write(21, 0, blob, group=1)
    buf = bytearray(MiB)
    assert client.readinto(21, MiB, buf) == MiB
    assert buf == blob[MiB:2 * MiB]
    tail = bytearray(100)
    assert client.submit_readinto(21, 2 * MiB, tail).result() == 17  # short at the end
    assert tail[:17] == blob[-17:]
    with pytest.raises(SliceMissing):
        client.readinto(22, 0, bytearray(10))


def test_an_answer_never_overtakes_the_rest_of_a_frame_sent_in_part(node: StorageNode) -> None:
    """The worker that made an answer sends it if the socket takes it at once;
    the unsent rest of a frame is queued for the writer thread. An answer made
    before the writer sent that rest must go behind it, whether the socket is
    full (before: queued in front of the rest) or has room again (before: sent
    inside the rest, where the client reads it as READ data)."""
    key = b"k" * 32
    server = SliceServer(node, SECRET)
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
    conn = _Connection(server, ours, "socketpair")
    conn._sealer = FrameSealer(key)
    bodies = [os.urandom(60_000), os.urandom(100), os.urandom(200)]
    try:
        conn._answer(Header(Kind.READ, request_id=1), Kind.READ.response, 0, bodies[0], 0)
        assert conn._outbox, "the socket took the whole frame: no rest to overtake"
        conn._answer(Header(Kind.READ, request_id=2), Kind.READ.response, 0, bodies[1], 0)
        head = theirs.recv(4096)  # room again: the next answer could be sent at once
        conn._answer(Header(Kind.READ, request_id=3), Kind.READ.response, 0, bodies[2], 0)
        writer = threading.Thread(target=conn._write_loop, daemon=True)
        writer.start()
        raw = bytearray(head)
        opener = FrameOpener(key)
        theirs.settimeout(10)
        while len(raw) < sum(HEADER_SIZE + len(b) for b in bodies):
            raw += theirs.recv(65536)
        at = 0
        for request_id, body in enumerate(bodies, 1):
            header = decode_header(raw[at:at + HEADER_SIZE], Limits())
            opener.check(header, raw[at:at + HEADER_SIZE])
            at += HEADER_SIZE
            assert (header.request_id, raw[at:at + header.payload_len]) == (request_id, body)
            at += header.payload_len
    finally:
        conn.close()
        server.close()
        theirs.close()


def test_answers_sent_by_workers_never_land_inside_another_frame(
        server: SliceServer, client: RemoteNode) -> None:
    """A worker sends a small answer itself when the socket takes it at once;
    the rest of one the socket took only in part waits for the writer thread.
    No other answer may be sent before that rest: a client that reads slowly,
    thousands of small READs answered by several read threads at once, and
    every frame's MAC, seq and bytes checked. The race of the test above under
    real threads; before the fix it failed about one run in five."""
    blob = os.urandom(4 * MiB)
    drive = client.write(60, 0, blob, group=1)
    rng = random.Random(60)
    ranges = [(rng.randrange(0, 4 * MiB - 65_000), rng.randrange(20_000, 65_000))
              for _ in range(1500)]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: partial sends
    sock.settimeout(30)
    sock.connect(server.address)
    keys = raw_handshake(sock)
    sealer, opener = FrameSealer(keys["c2s"]), FrameOpener(keys["s2c"])
    host, port = sock.getsockname()[:2]
    peer = f"{host}:{port}"
    with server._lock:  # the server's end of this connection: a small send buffer
        (conn,) = [c for c in server._connections if c.peer == peer]
    conn._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)

    def send_all() -> None:
        for i, (offset, length) in enumerate(ranges):
            sock.sendall(sealer.seal(Header(Kind.READ, request_id=i + 1, slice_id=60,
                                            offset=offset, arg=length, drive=drive)))

    sender = threading.Thread(target=send_all)
    sender.start()
    header_buf = bytearray(HEADER_SIZE)
    welcome, _ = read_frame(sock, header_buf, Limits())
    opener.check(welcome, header_buf)
    assert welcome.kind == Kind.WELCOME
    seen = set()
    try:
        for n in range(len(ranges)):
            if n % 8 == 0:
                time.sleep(0.3 if n == 0 else 0.01)  # read slowly: the server's socket fills
            header, body = read_frame(sock, header_buf, Limits())
            opener.check(header, header_buf)  # a frame inside another's rest: bad MAC
            assert header.kind == Kind.READ.response, bytes(body[:200])
            offset, length = ranges[header.request_id - 1]
            assert body == blob[offset:offset + length], f"request {header.request_id}"
            seen.add(header.request_id)
    finally:
        sender.join()
        sock.close()
    assert len(seen) == len(ranges)


def test_back_pressure_keeps_every_piece(node: StorageNode) -> None:
    """A connection allowed 2 requests / 2 MiB in flight still stores 24 pipelined pieces."""
    tight = Limits(max_in_flight=2, max_in_flight_bytes=2 * MiB)
    blob = os.urandom(6 * MiB)
    with SliceServer(node, SECRET, limits=tight) as server, \
            RemoteNode(server.address, SECRET, connections=1) as rn:
        futures = [rn.submit_write(30 + s, off, blob[off:off + MiB // 2], group=1)
                   for s in range(2) for off in range(0, 6 * MiB, MiB // 2)]
        for f in futures:
            f.result()
        assert rn.read(30, 0, 6 * MiB) == blob == rn.read(31, 0, 6 * MiB)


def test_a_cancelled_request_leaves_its_connection_serving(server: SliceServer) -> None:
    """A caller may cancel a request's future while it waits: its answer is then
    dropped, and the connection's reader goes on serving the others."""
    blob = os.urandom(MiB)
    with RemoteNode(server.address, SECRET, connections=1, timeout=10) as rn:
        won = []
        for i in range(8):  # each cancelled as soon as sent: before its answer, mostly
            future = rn.submit_write(40 + i, 0, blob, group=1)
            won.append(future.cancel())
            assert future.cancelled() == won[-1]
        # At least one answer arrives for a cancelled future (the server answers a
        # PUT in no less than ~0.1 ms; which side wins is the scheduler's call).
        assert sum(won) >= 1, won
        kept = rn.submit_write(48, 0, blob, group=1)
        assert kept.result(20) in server.node.drive_ids
        # A cancelled PUT is still stored; its dropped answer was the only word
        # of when, and 47 may be stored on the other drive just after 48.
        deadline = time.monotonic() + 10
        while True:
            try:
                assert rn.read(47, 0, MiB) == blob
                break
            except SliceMissing:
                assert time.monotonic() < deadline, "a cancelled PUT was never stored"
                time.sleep(0.005)
        rn.ping()
        pending = rn.submit_read(48, 0, MiB)
        pending.cancel()  # still outstanding when the connection closes below
    assert pending.cancelled()


def test_a_hung_server_gives_request_timeout(tmp_path: Path) -> None:
    """A server that authenticates and then never answers: the caller gets
    RequestTimeout, the requests beside it ConnectionLost, nobody hangs."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def authenticate_then_stall() -> None:
        sock, _ = listener.accept()
        accepted.append(sock)
        server_handshake(sock, SECRET, Limits())

    t = threading.Thread(target=authenticate_then_stall)
    t.start()
    try:
        with RemoteNode(listener.getsockname(), SECRET, connections=1, timeout=1.0) as rn:
            beside = rn.submit_write(1, 0, b"x", group=1)
            with pytest.raises(RequestTimeout):
                rn.ping()
            with pytest.raises(ConnectionLost):
                beside.result(timeout=10)
    finally:
        t.join()
        for sock in accepted:
            sock.close()
        listener.close()
