"""The client's read path over TCP (server/remote.py, server/cluster_reads.py):
a caller's buffer is written only while its request is still wanted (never
after a cancel or a timeout), ``readinto`` honours the client's timeout, an
answer longer than asked is a ``FrameError``, a piece read ahead is started
once and not kept after its slice was dropped, and many threads reading into
their own buffers at once get every byte right.

The servers are real ``shinglefs server`` processes on loopback (``servers``
fixture; SIGSTOP holds their answers back). Only the two misbehaviours a real
server never shows — an answer longer than asked, an answer that stops in the
middle of its payload — come from a peer written here with the real
handshake and frame code.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from tests.server.test_cluster_node import start_server
from tests.server.test_server_process import Server

from shinglefs.meta.api import MetaStore
from shinglefs.server.auth import FrameSealer, server_handshake
from shinglefs.server.cluster_reads import NetworkReadAhead
from shinglefs.server.errors import ConnectionLost, FrameError, RequestTimeout, WireError
from shinglefs.server.process import cluster_key
from shinglefs.server.remote import RemoteNode
from shinglefs.server.wire import HEADER_SIZE, Header, Kind, Limits, read_frame, send_frame

MiB = 1024 * 1024
SENTINEL = 0xA5
PEER_SECRET = b"cluster secret of the tests, 32B"


def started(meta_url: str, meta: MetaStore, tmp_path: Path,
            servers: list[Server]) -> tuple[Server, tuple[str, int], bytes]:
    """One storage server: ``(its process, its address, the cluster secret)``."""
    server, port = start_server(meta_url, tmp_path, "s1", servers)
    return server, ("127.0.0.1", port), cluster_key(meta)


def all_threads_stopped(pid: int) -> bool:
    """Is every thread of ``pid`` in state T (stopped), per /proc?"""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended
        if state not in ("T", "t"):
            return False
    return True


@contextlib.contextmanager
def stopped(server: Server) -> Iterator[None]:
    """The server process held (SIGSTOP): requests reach its socket, no answer leaves.
    Returns once every thread of it is stopped (a signal is delivered
    asynchronously: a thread still running could answer)."""
    pid = server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not all_threads_stopped(pid):
        assert time.monotonic() < deadline, f"server {pid} did not stop"
        time.sleep(0.001)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def untouched(buffer: bytearray) -> bool:
    return buffer == bytes([SENTINEL]) * len(buffer)


def stays_untouched(buffer: bytearray, seconds: float = 0.3) -> bool:
    """Is ``buffer`` still all sentinel during ``seconds`` (a late write would show)?"""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not untouched(buffer):
            return False
        time.sleep(0.01)
    return untouched(buffer)


# ---------------------------------------------------------------- 1. a cancelled readinto
def test_a_cancelled_readinto_never_writes_the_buffer(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    server, address, secret = started(meta_url, meta, tmp_path, servers)
    data = os.urandom(MiB)
    with RemoteNode(address, secret, connections=1, timeout=20) as remote:
        drive = remote.write(7, 0, data, group=1, durable=True)
        buffers = [bytearray([SENTINEL]) * size for size in (100, 200 * 1024, MiB)]
        with stopped(server):
            futures = [remote.submit_readinto(7, 0, b, drive) for b in buffers]
            assert all(f.cancel() for f in futures)  # no answer came: cancel wins
        # the answers come now; a read sent after them on the one connection
        # lands after them, the stream still in step
        again = bytearray(MiB)
        assert remote.readinto(7, 0, again, drive) == MiB and again == data
        assert all(stays_untouched(b) for b in buffers)
        assert remote.read(7, 5, 10, drive) == data[5:15]


# ---------------------------------------------------------------- 2. readinto's timeout
def test_readinto_times_out_like_the_other_calls_and_leaves_the_buffer_alone(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    server, address, secret = started(meta_url, meta, tmp_path, servers)
    data = os.urandom(300 * 1024)
    with RemoteNode(address, secret, connections=1, timeout=0.5) as remote:
        drive = remote.write(8, 0, data, group=1, durable=True)
        buffer = bytearray([SENTINEL]) * len(data)
        outcome: list[BaseException | int] = []

        def read() -> None:
            try:
                outcome.append(remote.readinto(8, 0, buffer, drive))
            except BaseException as exc:
                outcome.append(exc)

        with stopped(server):
            t0 = time.monotonic()
            reader = threading.Thread(target=read)
            reader.start()
            reader.join(15)
            waited = time.monotonic() - t0
            hung = reader.is_alive()
        reader.join(30)  # today's code: the answer after SIGCONT ends the wait
        assert not hung, "readinto waited past the client's timeout"
        assert len(outcome) == 1 and isinstance(outcome[0], RequestTimeout), outcome
        assert waited < 10
        assert stays_untouched(buffer)
        # the connection dropped with the timeout is opened anew by the next request
        assert remote.readinto(8, 0, buffer, drive) == len(data) and buffer == data


class Link:
    """The peer's side of its one connection: sealed frames, or raw bytes."""

    def __init__(self, sock: socket.socket, sealer: FrameSealer) -> None:
        self.sock = sock
        self._sealer = sealer

    def frame(self, header: Header, body: bytes = b"") -> None:
        send_frame(self.sock, self._sealer.seal(header), body)

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)


class Peer:
    """A slice server written here (the real handshake and frame code) that
    answers each request with ``answer(header, link)``: for what a real
    server never does. One connection."""

    def __init__(self, answer: Callable[[Header, Link], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        self._answer = answer
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError, WireError):
            sock, _ = self.listener.accept()
            self._sockets.append(sock)
            sealer, opener = server_handshake(sock, PEER_SECRET, Limits())
            link, header_buf = Link(sock, sealer), bytearray(HEADER_SIZE)
            while True:
                header, _ = read_frame(sock, header_buf, Limits())
                opener.check(header, header_buf)
                self._answer(header, link)

    def close(self) -> None:
        self.listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._thread.join(10)


def read_answer(header: Header, payload_len: int) -> Header:
    return Header(Kind.READ.response, request_id=header.request_id, slice_id=header.slice_id,
                  offset=header.offset, arg=payload_len, drive=header.drive,
                  payload_len=payload_len)


def test_a_readinto_whose_answer_stalls_mid_payload_times_out_and_nothing_lands_after(
        ) -> None:
    """The reader thread is already receiving into the caller's buffer when the
    timeout comes: readinto still raises ``RequestTimeout`` within about the
    timeout (the connection is dropped, its reader stops), and no byte lands
    in the buffer once it returned."""
    size = 2 * MiB
    proceed = threading.Event()

    def half_then_rest(header: Header, link: Link) -> None:
        if header.kind == Kind.PING:
            link.frame(Header(Kind.PING.response, request_id=header.request_id))
        elif header.kind == Kind.READ:
            link.frame(read_answer(header, size))  # the header alone, then the payload
            link.raw(bytes([1]) * (size // 2))
            proceed.wait(10)
            link.raw(bytes([2]) * (size - size // 2))

    peer = Peer(half_then_rest)
    try:
        with RemoteNode(peer.address, PEER_SECRET, connections=1, timeout=0.5) as remote:
            remote.ping()
            buffer = bytearray([SENTINEL]) * size
            outcome: list[BaseException | int] = []

            def read() -> None:
                try:
                    outcome.append(remote.readinto(1, 0, buffer))
                except BaseException as exc:
                    outcome.append(exc)

            t0 = time.monotonic()
            reader = threading.Thread(target=read)
            reader.start()
            reader.join(5)
            hung = reader.is_alive()
            written = bytes(buffer)
            proceed.set()
            reader.join(30)
            assert not hung, "readinto waited past the client's timeout"
            assert isinstance(outcome[0], RequestTimeout), outcome
            assert time.monotonic() - t0 < 6
            time.sleep(0.3)
            assert bytes(buffer) == written  # nothing landed after readinto returned
    finally:
        proceed.set()
        peer.close()


# ---------------------------------------------------------------- 3. an answer longer than asked
@pytest.mark.parametrize("into", [True, False], ids=["readinto", "read"])
def test_a_read_answer_longer_than_asked_is_a_frame_error(into: bool) -> None:
    asked = 1000

    def too_long(header: Header, link: Link) -> None:
        if header.kind == Kind.READ:
            link.frame(read_answer(header, header.arg + 24), bytes([3]) * (header.arg + 24))
        # a PUT gets no answer: it stays outstanding on the connection

    peer = Peer(too_long)
    try:
        with RemoteNode(peer.address, PEER_SECRET, connections=1, timeout=10) as remote:
            beside = remote.submit_write(2, 0, b"x", group=1)
            buffer = bytearray([SENTINEL]) * (asked + 24)
            target = memoryview(buffer)[:asked]
            with pytest.raises(FrameError):
                if into:
                    remote.submit_readinto(1, 0, target).result(10)
                else:
                    remote.read(1, 0, asked)
            with pytest.raises(ConnectionLost):  # the connection is closed with it
                beside.result(10)
            assert untouched(buffer)  # neither the asked range nor past it written
    finally:
        peer.close()


# ---------------------------------------------------------------- 4. read-ahead pieces
class GatedStart:
    """``NetworkReadAhead``'s ``start`` over a real ``RemoteNode``: the first call
    waits for ``release`` after saying it ``entered`` (so the test acts while
    that piece is being started); every call is noted."""

    def __init__(self, remote: RemoteNode, drive: int) -> None:
        self.remote, self.drive = remote, drive
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls: list[tuple[int, int]] = []

    def __call__(self, slice_id: int, offset: int, buffer: bytearray) -> Future[int]:
        self.calls.append((slice_id, offset))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(10)
        return self.remote.submit_readinto(slice_id, offset, buffer, self.drive)


PIECE = 256 * 1024


@contextlib.contextmanager
def one_slice(tmp_path: Path, meta_url: str, meta: MetaStore,
              servers: list[Server]) -> Iterator[tuple[RemoteNode, int, bytes]]:
    """A server holding slice 9 (4 pieces): ``(a client of it, its drive, its bytes)``."""
    _, address, secret = started(meta_url, meta, tmp_path, servers)
    data = os.urandom(4 * PIECE)
    with RemoteNode(address, secret, connections=2, timeout=20) as remote:
        yield remote, remote.write(9, 0, data, group=1, durable=True), data


@contextlib.contextmanager
def first_piece_being_started(remote: RemoteNode,
                              drive: int) -> Iterator[tuple[NetworkReadAhead, GatedStart]]:
    """A read-ahead of slice 9 whose first piece is being started (its ``start``
    held) for the body: ``(the read-ahead, its start)``; then released and joined."""
    ahead = NetworkReadAhead(capacity=8 * PIECE, piece=PIECE)
    start = GatedStart(remote, drive)
    first = threading.Thread(target=ahead.prefetch, args=(9, 0, PIECE, start))
    first.start()
    assert start.entered.wait(10)
    try:
        yield ahead, start
    finally:
        start.release.set()
        first.join(10)


def test_two_readers_hinting_one_piece_at_once_share_one_read(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    with one_slice(tmp_path, meta_url, meta, servers) as (remote, drive, data):
        with first_piece_being_started(remote, drive) as (ahead, start):
            second = ahead.prefetch(9, 0, PIECE, start)  # while the first starts that piece
        assert second == 0 and start.calls == [(9, 0)]
        assert ahead.started == 1 and ahead.held_bytes == PIECE
        view = ahead.take(9, 0, PIECE, wait=10)
        assert view is not None and view == data[:PIECE]
        assert ahead.held_bytes == 0 and ahead.take(9, 0, PIECE, wait=0) is None


@pytest.mark.parametrize("forget", ["drop_slice", "clear"])
def test_a_piece_started_while_its_slice_is_dropped_is_not_kept(
        forget: str, tmp_path: Path, meta_url: str, meta: MetaStore,
        servers: list[Server]) -> None:
    with one_slice(tmp_path, meta_url, meta, servers) as (remote, drive, data):
        with first_piece_being_started(remote, drive) as (ahead, start):
            if forget == "drop_slice":
                ahead.drop_slice(9)  # deleted while its first piece was being started
            else:
                ahead.clear()
        assert ahead.held_bytes == 0
        assert ahead.take(9, 0, PIECE, wait=10) is None  # read on demand
        # started anew once asked again, and served
        assert ahead.prefetch(9, 0, PIECE, start) == 1
        view = ahead.take(9, 0, PIECE, wait=10)
        assert view is not None and view == data[:PIECE] and ahead.held_bytes == 0


# ---------------------------------------------------------------- many readers at once
SIZES = [1, 100, 4096, 65_535, 65_537, 200_000, MiB + 3, 3 * MiB]
THREADS = 6
REQUESTS = 120  # per thread
IN_FLIGHT = 8  # per thread


def a_length(rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.35:
        return rng.randint(1, 64)  # tiny
    if kind < 0.7:
        return rng.randint(65, 64 * 1024)
    return rng.randint(64 * 1024 + 1, MiB + MiB // 2)  # more than one 64 KiB send


@pytest.mark.parametrize("connections", [1, 4])
def test_threads_reading_into_their_buffers_at_once_get_every_byte(
        connections: int, tmp_path: Path, meta_url: str, meta: MetaStore,
        servers: list[Server]) -> None:
    """``THREADS`` threads each keep ``IN_FLIGHT`` readinto requests going over
    one ``RemoteNode`` (ranges of every size, some past a slice's end), cancel
    about one in five at a random moment and reuse a buffer at once when its
    cancel won: every answer's bytes are checked (CRC-32 against the slice
    written, nothing written past the count), a buffer whose cancel won is never
    written again, and the streams stay in step."""
    _, address, secret = started(meta_url, meta, tmp_path, servers)
    slices = {100 + i: os.urandom(size) for i, size in enumerate(SIZES)}
    errors: list[str] = []
    counts = {"read": 0, "cancelled": 0, "cancel_lost": 0}
    counts_lock = threading.Lock()
    with RemoteNode(address, secret, connections=connections, timeout=30) as remote:
        drive = {sid: remote.write(sid, 0, data, group=1, durable=True)
                 for sid, data in slices.items()}

        def check(buffer: bytearray, sid: int, offset: int, length: int, n: int) -> None:
            want = slices[sid][offset:offset + length]
            if n != len(want) or zlib.crc32(buffer[:n]) != zlib.crc32(want):
                errors.append(f"slice {sid} [{offset}, +{length}): {n} bytes, wrong")
            elif not untouched(buffer[n:length]):
                errors.append(f"slice {sid} [{offset}, +{length}): written past {n}")

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            free = [bytearray(2 * MiB) for _ in range(IN_FLIGHT)]
            flying: list[tuple[Future[int], bytearray, int, int, int]] = []
            quarantined: list[bytearray] = []  # cancel won: must stay sentinel forever
            done = {"read": 0, "cancelled": 0, "cancel_lost": 0}
            for i in range(REQUESTS):
                sid = rng.choice(list(slices))
                offset = rng.randint(0, len(slices[sid]))
                length = a_length(rng)
                buffer = free.pop()
                buffer[:] = bytes([SENTINEL]) * len(buffer)
                target = memoryview(buffer)[:length]
                if i % 10 == 9:  # now and then the blocking call
                    check(buffer, sid, offset, length,
                          remote.readinto(sid, offset, target, drive[sid]))
                    done["read"] += 1
                    free.append(buffer)
                    continue
                future = remote.submit_readinto(sid, offset, target, drive[sid])
                if rng.random() < 0.2:
                    if rng.random() < 0.5:
                        time.sleep(rng.random() / 1000)
                    if future.cancel():
                        done["cancelled"] += 1
                        if rng.random() < 0.5:
                            quarantined.append(buffer)
                            free.append(bytearray(2 * MiB))
                        else:
                            free.append(buffer)  # reused at once: a late write shows
                        continue
                    done["cancel_lost"] += 1
                flying.append((future, buffer, sid, offset, length))
                if len(flying) == IN_FLIGHT or not free:
                    future, buffer, sid, offset, length = flying.pop(0)
                    check(buffer, sid, offset, length, future.result(30))
                    done["read"] += 1
                    free.append(buffer)
            for future, buffer, sid, offset, length in flying:
                check(buffer, sid, offset, length, future.result(30))
                done["read"] += 1
            # every connection answered after the cancelled requests: their answers came
            for sid in slices:
                remote.readinto(sid, 0, bytearray(1), drive[sid])
            if not all(stays_untouched(b, 0.05) for b in quarantined):
                errors.append("a buffer whose cancel won was written")
            with counts_lock:
                for key, value in done.items():
                    counts[key] += value

        def guarded(seed: int) -> None:
            try:
                reader(seed)
            except BaseException as exc:
                errors.append(f"reader {seed}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=guarded, args=(seed,)) for seed in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        # the streams are still in step after it all
        for sid, data in slices.items():
            assert remote.read(sid, 0, len(data), drive[sid]) == data
    assert counts["read"] + counts["cancelled"] == THREADS * REQUESTS
    assert counts["cancelled"] > THREADS * REQUESTS // 20, counts  # cancels did race answers
