"""The slice protocol's time and resource bounds against hostile or failing peers:
real servers on loopback (a StorageNode over emulated drives), raw sockets for
the peer that misbehaves, RemoteNode for the client that must still be served."""

from __future__ import annotations

import json
import logging
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from tests.server.test_wire import SECRET, closed_by_peer, drive_specs, raw_handshake

from shinglefs.meta.api import MetaStore, ServerDrive
from shinglefs.server.auth import FrameOpener, FrameSealer, server_handshake
from shinglefs.server.cluster import ClusterNode
from shinglefs.server.errors import (
    AuthFailed,
    FrameError,
    RequestTimeout,
    ServerUnreachable,
    WireError,
)
from shinglefs.server.node import StorageNode
from shinglefs.server.process import cluster_key
from shinglefs.server.remote import RemoteNode
from shinglefs.server.service import SliceServer
from shinglefs.server.wire import (
    HEADER_SIZE,
    NONCE_SIZE,
    PROOF_SIZE,
    Header,
    Kind,
    Limits,
    read_frame,
)

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageNode]:
    n = StorageNode.open(drive_specs(tmp_path_factory.mktemp("drives"), count=1),
                         create=True, zone_size=16 * MiB)
    yield n
    n.close()


class Raw:
    """An authenticated connection driven by hand: frames sealed and opened here."""

    def __init__(self, server: SliceServer) -> None:
        self.sock = socket.create_connection(server.address, timeout=10)
        keys = raw_handshake(self.sock)
        self._buf = bytearray(HEADER_SIZE)
        welcome, _ = read_frame(self.sock, self._buf, Limits())
        self._opener = FrameOpener(keys["s2c"])
        self._opener.check(welcome, self._buf)
        self._sealer = FrameSealer(keys["c2s"])

    def send(self, header: Header, payload: bytes = b"") -> None:
        self.sock.sendall(self._sealer.seal(header) + payload)

    def answer(self) -> tuple[Header, bytearray]:
        header, body = read_frame(self.sock, self._buf, Limits())
        self._opener.check(header, self._buf)
        return header, body

    def close(self) -> None:
        self.sock.close()


def dribble(sock: socket.socket, data: bytes, every_s: float, give_up_s: float) -> float:
    """Send ``data`` a byte per ``every_s`` until the peer closes the connection;
    the seconds that took (``give_up_s`` if it never did)."""
    start = time.monotonic()
    for byte in data:
        if time.monotonic() - start > give_up_s:
            break
        try:
            sock.sendall(bytes([byte]))
            sock.settimeout(every_s)
            if sock.recv(1) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:  # reset, broken pipe, TLS alert: closed
            return time.monotonic() - start
    return give_up_s


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


# ---------------------------------------------------------------- the handshake
def test_a_dribbling_peer_is_dropped_within_the_handshake_timeout(
        node: StorageNode, caplog: pytest.LogCaptureFixture) -> None:
    """A peer without the secret that sends its HELLO a byte at a time, each
    sooner than the timeout after the last, still gets handshake_timeout in all."""
    hello = Header(Kind.HELLO, payload_len=NONCE_SIZE).pack() + os.urandom(NONCE_SIZE)
    with SliceServer(node, SECRET, handshake_timeout=0.5) as server, \
            socket.create_connection(server.address, timeout=10) as sock:
        # Bounds with room for a loaded machine: a per-receive timeout (the
        # bug) would keep a 104-byte HELLO at a byte per 0.1 s for 10.4 s.
        took = dribble(sock, hello, every_s=0.1, give_up_s=10.0)
        assert took < 5.0
        assert warnings_of(caplog, "AuthFailed: no handshake within 0.5 s")
        with RemoteNode(server.address, SECRET, connections=1, timeout=5) as client:
            client.ping()


def test_a_client_gets_server_unreachable_within_connect_timeout_from_a_dribbling_server(
        ) -> None:
    """A listener that sends its CHALLENGE a byte per 0.1 s: the client's whole
    handshake is bounded by connect_timeout, not each receive."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def dribble_challenge() -> None:
        sock, _ = listener.accept()
        with sock:
            read_frame(sock, bytearray(HEADER_SIZE), Limits())  # HELLO
            challenge = (Header(Kind.CHALLENGE, payload_len=NONCE_SIZE + PROOF_SIZE).pack()
                         + bytes(NONCE_SIZE + PROOF_SIZE))
            for byte in challenge:
                if stop.wait(0.1):
                    return
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    return

    thread = threading.Thread(target=dribble_challenge)
    thread.start()
    try:
        with RemoteNode(listener.getsockname(), SECRET, connections=1, timeout=5,
                        connect_timeout=0.5) as client:
            start = time.monotonic()
            with pytest.raises(ServerUnreachable):
                client.ping()
            # A per-receive bound (the bug) takes 13.6 s for the 136-byte CHALLENGE.
            assert time.monotonic() - start < 5.0
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_a_full_server_is_unreachable_to_a_client_not_a_wrong_secret(node: StorageNode) -> None:
    """A server at max_connections accepts and closes: the client hears
    ServerUnreachable (retried after retry_after), never AuthFailed."""
    with SliceServer(node, SECRET, max_connections=1) as server, \
            RemoteNode(server.address, SECRET, connections=1, timeout=5) as first, \
            RemoteNode(server.address, SECRET, connections=1, timeout=5) as second:
        first.ping()  # holds the one slot
        with pytest.raises(ServerUnreachable) as refused:
            second.ping()
        assert not isinstance(refused.value, AuthFailed)
        assert "max_connections" in str(refused.value)
        assert refused.value.hint is not None and "secret" not in refused.value.hint
        first.close()
        deadline = time.monotonic() + 5
        while server.connection_count:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(RemoteNode.retry_after)
        second.ping()  # the slot is free again


# ---------------------------------------------------------------- the acceptor
def test_the_acceptor_survives_a_connection_whose_thread_cannot_start(
        node: StorageNode, caplog: pytest.LogCaptureFixture) -> None:
    """No thread for a connection (a task limit): that connection is closed and
    its slot given back; the server goes on accepting."""
    with SliceServer(node, SECRET) as server:
        threading.stack_size(1 << 40)  # no thread can start until it is put back
        try:
            with socket.create_connection(server.address, timeout=10) as sock:
                assert closed_by_peer(sock)
        finally:
            threading.stack_size(0)
        assert server.connection_count == 0
        with RemoteNode(server.address, SECRET, connections=1, timeout=5) as client:
            client.ping()
    assert warnings_of(caplog, "cannot serve it: RuntimeError")  # logged before that accept


SERVE = """
import os, resource, sys
from shinglefs.server.node import StorageNode
from shinglefs.server.service import SliceServer
import logging
logging.basicConfig(level=logging.INFO)
node = StorageNode.open([(0, sys.argv[1])], create=True, zone_size=16 << 20)
server = SliceServer(node, sys.argv[2].encode(), handshake_timeout=1.0).start()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
print(server.address[1], soft, hard, server.max_connections, flush=True)
for line in sys.stdin:
    if line.strip() == "starve":  # no descriptor left: every accept fails with EMFILE
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
    else:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print("done", flush=True)
"""


def _serve(tmp_path: Path, limits: tuple[int, int] | None = None
           ) -> tuple[subprocess.Popen[str], list[int]]:
    def limit() -> None:
        if limits is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)

    log = open(tmp_path / "server.log", "w")  # noqa: SIM115  (closed with the process)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, f"emulated:{tmp_path}/d.img:{64 * MiB}", SECRET.decode()],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
        preexec_fn=limit)
    log.close()
    assert proc.stdout is not None
    return proc, [int(x) for x in proc.stdout.readline().split()]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_out_of_descriptors_the_acceptor_backs_off_and_logs_once(tmp_path: Path) -> None:
    """EMFILE on accept: no spinning, no traceback per turn; once descriptors
    are back the waiting connections and new ones are served."""
    proc, (port, *_) = _serve(tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    socks: list[socket.socket] = []
    try:
        proc.stdin.write("starve\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        before = _cpu_s(proc.pid)
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(10)]
        time.sleep(1.0)
        assert _cpu_s(proc.pid) - before < 0.3
        text = (tmp_path / "server.log").read_text()
        assert 1 <= text.count("Too many open files") <= 2
        assert "Traceback" not in text
        proc.stdin.write("feed\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        with RemoteNode(("127.0.0.1", port), SECRET, connections=1, timeout=5) as client:
            client.ping()
    finally:
        for sock in socks:
            sock.close()
        proc.kill()
        proc.wait()


def test_start_raises_the_descriptor_limit_and_fits_max_connections(tmp_path: Path) -> None:
    """Soft limit 64, hard 512: the server raises the soft limit to the hard one
    and serves fewer than its 1024 default connections, so that a full server
    refuses connections instead of running out of descriptors."""
    proc, (_, soft, hard, max_connections) = _serve(tmp_path, limits=(64, 512))
    try:
        assert (soft, hard) == (512, 512)
        assert 256 <= max_connections < 512 - 64
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- after the handshake
def test_a_put_whose_payload_stalls_gives_back_its_bytes_and_blocks_no_one(
        node: StorageNode, caplog: pytest.LogCaptureFixture) -> None:
    """A client stops mid-payload (its host died, say): within payload_timeout
    its connection is closed, its held bytes given back, and another client's
    PUT to the same drive is served meanwhile."""
    with SliceServer(node, SECRET, held_bytes=MiB, payload_timeout=0.5) as server, \
            RemoteNode(server.address, SECRET, connections=1, timeout=10) as client:
        stalled = Raw(server)
        try:
            stalled.send(Header(Kind.PUT, request_id=1, slice_id=9001, drive=0,
                                payload_len=MiB), b"x" * 1000)
            deadline = time.monotonic() + 5
            while server.held.held < MiB:  # its whole piece is held: the drive is full
                assert time.monotonic() < deadline
                time.sleep(0.01)
            start = time.monotonic()
            assert client.write(9002, 0, b"y" * 4096, group=1, drive_id=0) == 0
            assert time.monotonic() - start < 5.0  # not held until the client's timeout
            assert closed_by_peer(stalled.sock)
        finally:
            stalled.close()
        assert server.held.held == 0
        assert warnings_of(caplog, "payload did not come within 0.5 s")
        assert client.read(9002, 0, 4096) == b"y" * 4096


def test_idle_connections_are_kept_and_watched_by_tcp_keepalive(node: StorageNode) -> None:
    with SliceServer(node, SECRET) as server, \
            RemoteNode(server.address, SECRET, connections=1, timeout=5) as client:
        client.ping()
        conns = list(server._connections)
        assert len(conns) == 1
        sock = conns[0]._sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) <= 120


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_put_for_an_unknown_drive_holds_no_bytes_and_no_buffer(node: StorageNode) -> None:
    """The drive of a PUT is checked before anything is held or allocated: its
    payload is read in small chunks and dropped, the answer is UnknownDrive,
    and the connection goes on."""
    piece = Limits().max_piece
    with SliceServer(node, SECRET, held_bytes=MiB) as server:
        raw = Raw(server)
        try:
            before = _rss()
            raw.send(Header(Kind.PUT, request_id=1, slice_id=9100, drive=100000,
                            payload_len=piece), bytes(MiB))
            time.sleep(0.2)  # the server has read the header and the first MiB
            assert server.held.held == 0
            assert _rss() - before < piece // 2  # no buffer of the piece's size
            raw.sock.sendall(bytes(piece - MiB))
            answer, body = raw.answer()
            assert answer.kind == Kind.ERROR.response and answer.request_id == 1
            assert json.loads(body)["type"] == "UnknownDrive"
            assert 100000 not in server.held._by_drive
            raw.send(Header(Kind.PING, request_id=2, arg=7))
            assert raw.answer()[0].arg == 7
        finally:
            raw.close()


# ---------------------------------------------------------------- JSON bodies
def test_a_deeply_nested_flush_body_is_a_frame_error(
        node: StorageNode, caplog: pytest.LogCaptureFixture) -> None:
    with SliceServer(node, SECRET) as server:
        raw = Raw(server)
        try:
            for request_id, body in ((1, b"[" * 200000), (2, b"[true]"), (3, b"[false, 0]")):
                raw.send(Header(Kind.FLUSH, request_id=request_id, payload_len=len(body)), body)
                answer, error = raw.answer()
                assert answer.kind == Kind.ERROR.response
                assert json.loads(error)["type"] == "FrameError"
            raw.send(Header(Kind.FLUSH, request_id=4, payload_len=3), b"[0]")
            assert raw.answer()[0].kind == Kind.FLUSH.response  # the connection goes on
        finally:
            raw.close()
    assert warnings_of(caplog, "FrameError: a control body nests too deep")
    assert not [r for r in caplog.records if r.exc_info]


def test_a_deeply_nested_error_answer_is_a_frame_error_on_the_client() -> None:
    """A server whose ERROR body nests too deep: the caller gets FrameError (a
    NodeError: a cluster client fails over), not RecursionError."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def answer_with_deep_error() -> None:
        sock, _ = listener.accept()
        accepted.append(sock)
        sealer, opener = server_handshake(sock, SECRET, Limits())
        buf = bytearray(HEADER_SIZE)
        request, _ = read_frame(sock, buf, Limits())
        opener.check(request, buf)
        body = b"[" * 100000
        sock.sendall(sealer.seal(Header(Kind.ERROR.response, request_id=request.request_id,
                                        payload_len=len(body))) + body)

    thread = threading.Thread(target=answer_with_deep_error)
    thread.start()
    try:
        with RemoteNode(listener.getsockname(), SECRET, connections=1, timeout=5) as client, \
                pytest.raises(FrameError):
            client.length(1)
    finally:
        thread.join()
        for sock in accepted:
            sock.close()
        listener.close()


# ---------------------------------------------------------------- a hung server
@pytest.mark.parametrize("piece", [128 * 1024, MiB], ids=["sent-inline", "sent-by-sender"])
def test_pipelined_puts_to_a_hung_server_end_within_the_timeout(piece: int) -> None:
    """A server that authenticates and then stops reading (stopped, deadlocked):
    a thread pipelining submit_write is not blocked for ever in sending (inline,
    or waiting for the sender's room), and every future fails with a WireError
    once the client's timeout (plus the watch's grace) has passed."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def authenticate_then_hang() -> None:
        sock, _ = listener.accept()
        accepted.append(sock)
        server_handshake(sock, SECRET, Limits())

    thread = threading.Thread(target=authenticate_then_hang)
    thread.start()
    futures: list[Future[int]] = []
    stopped: list[BaseException] = []
    data = bytes(piece)
    with RemoteNode(listener.getsockname(), SECRET, connections=1, timeout=1.0,
                    connect_timeout=0.5) as client:

        def pump() -> None:
            try:
                for n in range(4096):
                    futures.append(client.submit_write(1, n * piece, data, group=1))
            except WireError as exc:  # the connection failed; a new one is not answered
                stopped.append(exc)

        try:
            start = time.monotonic()
            pumper = threading.Thread(target=pump)
            pumper.start()
            # ~2.25 s unloaded (timeout + the watch's grace and tick + a new
            # connection's connect_timeout); the bug is blocking for ever.
            pumper.join(20.0)
            assert not pumper.is_alive(), "submit_write blocked past the timeout"
            assert stopped and time.monotonic() - start < 20.0
            for future in futures:
                with pytest.raises(WireError):
                    future.result(timeout=1.0)
            assert any(isinstance(f.exception(), RequestTimeout) for f in futures)
        finally:
            client.close()
            thread.join()
            for sock in accepted:
                sock.close()
            listener.close()


def test_a_cluster_write_goes_around_a_hung_replica(meta: MetaStore, node: StorageNode) -> None:
    """Two replicas, one on a server that authenticates and then hangs: the
    write completes once the client's timeout has passed, on the other, and
    the slice reads back from it."""
    key = cluster_key(meta)
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def authenticate_then_hang() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(sock)
            server_handshake(sock, key, Limits())

    hung = threading.Thread(target=authenticate_then_hang)
    hung.start()
    try:
        with SliceServer(node, key) as good:
            for port, name in ((good.address[1], "good"), (listener.getsockname()[1], "hung")):
                meta.register_server(f"127.0.0.1:{port}", [ServerDrive(
                    0, f"emulated:/{name}", f"uuid-{name}", "cold", 256 * MiB, 256 * MiB)])
            cluster = ClusterNode(meta, key, timeout=1.0, replicas=2, connections=1)
            try:
                writer = threading.Thread(
                    target=cluster.write, args=(9300, 0, b"z" * 4096), kwargs={"group": 1})
                writer.start()
                writer.join(20.0)  # ~1-2 s unloaded; the bug waits for ever
                assert not writer.is_alive(), "the write waits for the hung replica"
                drives = cluster.replicas_of(9300, 0)
                assert len(drives) == 1  # the hung replica was dropped
                assert cluster.read(9300, 0, 4096, drives[0]) == b"z" * 4096
            finally:
                cluster.close()
    finally:
        stop.set()
        hung.join()
        for sock in held:
            sock.close()
        listener.close()
