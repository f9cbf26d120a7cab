"""bench wire: the slice protocol's transport, measured on loopback against a plain socket copy.

Every candidate moves the same bulk pieces (1 MiB and 4 MiB) from a client to
a server over 1 and 4 TCP connections, with up to ``WINDOW`` pieces in flight
per connection, and the server acknowledges each piece (except the baseline):

- ``socket``: the baseline — ``sendall`` of each piece, ``recv_into`` one
  preallocated buffer on the other side, no framing, no acknowledgment.
- ``shinglefs``: this project's protocol (``server.service.SliceServer`` and
  ``server.remote.RemoteNode``: authenticated handshake, MAC'd frame headers,
  payloads ``recv_into`` their own buffer, each PUT submitted by the
  connection's reader and answered through its writer thread) over a node
  that drops what it is given, so only the transport is measured.
- ``shinglefs_read``: the same, pieces flowing back (READ answers), each
  received straight into a caller's buffer (``RemoteNode.submit_readinto``).
- ``shinglefs_tls``: PUTs inside TLS (a throwaway self-signed certificate made
  with the ``openssl`` command; reported as missing without it).
- ``threads``: the bare transport ``shinglefs`` is built on — the frames of the
  candidates below over blocking sockets, a thread per connection, payload
  ``recv_into`` one buffer — so the transports compare without our protocol's
  work (MACs, bounds, back-pressure accounting, futures).
- ``asyncio``: length-prefixed frames on ``asyncio.BufferedProtocol``
  (payload received into a preallocated buffer via ``get_buffer``), client on
  asyncio transports.
- ``pyzmq``: DEALER -> ROUTER, multipart [header, piece] sent ``copy=False``,
  received ``copy=False``.
- ``grpcio``: one bidirectional stream per channel (bytes, no protobuf),
  message limits raised to the piece size.

A candidate that cannot be imported is reported as ``{"error": ...}``. Every
figure is MiB/s of piece bytes over wall time; ``ratio`` is candidate /
``socket`` for the same piece size and connection count.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

from shinglefs.server.errors import PeerClosed
from shinglefs.server.node import NodeStats, PieceFuture
from shinglefs.server.wire import recv_exactly

MiB = 1024 * 1024
WINDOW = 8
FRAME = struct.Struct("<QQ")  # (request id, payload length): the asyncio/zmq candidates' header


def _serve_socket(listener: socket.socket, piece: int, total: int) -> None:
    conn, _ = listener.accept()
    with conn:
        buf = memoryview(bytearray(piece))
        got = 0
        while got < total:
            n = conn.recv_into(buf[: min(piece, total - got)])
            if n == 0:
                break
            got += n
        conn.sendall(b"k")


def _split(total: int, conns: int, piece: int) -> int:
    return max(1, total // piece // conns)


def bench_socket(piece: int, conns: int, total: int) -> float:
    """Baseline: each connection sends its share with ``sendall``; the receiver ``recv_into``."""
    count = _split(total, conns, piece)
    listener = socket.create_server(("127.0.0.1", 0), backlog=conns)
    servers = [threading.Thread(target=_serve_socket, args=(listener, piece, count * piece))
               for _ in range(conns)]
    for t in servers:
        t.start()
    data = memoryview(os.urandom(piece))
    socks = [socket.create_connection(listener.getsockname()) for _ in range(conns)]

    def send(sock: socket.socket) -> None:
        for _ in range(count):
            sock.sendall(data)
        sock.recv(1)

    start = time.perf_counter()
    senders = [threading.Thread(target=send, args=(s,)) for s in socks]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    elapsed = time.perf_counter() - start
    for t in servers:
        t.join()
    for s in socks:
        s.close()
    listener.close()
    return count * conns * piece / MiB / elapsed


class SinkNode:
    """A node that stores nothing: the server's dispatch without a drive behind it."""

    drive_ids = [0]

    def write(self, slice_id: int, offset: int, data: Any, group: int, *,
              drive_id: int | None = None, durable: bool = False) -> int:
        return 0

    def submit(self, slice_id: int, offset: int, data: Any, group: int, *,
               drive_id: int | None = None, durable: bool = False, urgent: bool = False,
               wait: bool = True) -> tuple[int, PieceFuture]:
        done = PieceFuture()
        done.set_result(None)
        return 0, done

    def __init__(self) -> None:
        self._zeros: dict[int, bytes] = {}  # one answer per length, made once

    def read_view(self, slice_id: int, offset: int, length: int,
                  drive_id: int | None = None) -> memoryview:
        return memoryview(self._zeros.setdefault(length, bytes(length)))

    def length(self, slice_id: int, drive_id: int | None = None) -> int:
        return 0

    def delete(self, slice_id: int, drive_id: int | None = None) -> None:
        return None

    def flush(self, drive_ids: Iterable[int] | None = None) -> None:
        return None

    def stats(self) -> NodeStats:
        return NodeStats(0, 0, 0, 0, 0)

    def place(self, slice_id: int, group: int, size_hint: int = 0) -> int:
        return 0


def _tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A throwaway self-signed certificate (made with the ``openssl`` command) as
    server and client contexts; ImportError when the command is missing."""
    from shinglefs.server.auth import tls_client_context, tls_server_context

    if shutil.which("openssl") is None:
        raise ImportError("the openssl command is needed to make a test certificate")
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = f"{tmp}/cert.pem", f"{tmp}/key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=bench",
                        "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True)
        return tls_server_context(cert, key), tls_client_context(cert)


def bench_shinglefs(piece: int, conns: int, total: int, *, read: bool = False,
                    tls: bool = False) -> float:
    """This project's protocol, pipelined: ``WINDOW`` pieces in flight per connection
    (``read``: the pieces flow back from the server, each received with
    ``submit_readinto`` straight into one of ``WINDOW`` buffers per connection;
    ``tls``: inside TLS)."""
    from shinglefs.server.remote import RemoteNode
    from shinglefs.server.service import SliceServer

    secret = os.urandom(32)
    count = _split(total, conns, piece) * conns
    data = memoryview(os.urandom(piece))
    server_tls, client_tls = _tls_contexts() if tls else (None, None)
    with SliceServer(SinkNode(), secret, workers=max(4, conns * 2),
                     ssl_context=server_tls) as server, \
            RemoteNode(server.address, secret, connections=conns,
                       ssl_context=client_tls) as client:
        client.ping()
        for i in range(conns):  # open every connection before the clock starts
            client.length(i)
        # a buffer is reused only after the read WINDOW * conns before it completed
        buffers = [bytearray(piece) for _ in range(WINDOW * conns)] if read else []
        start = time.perf_counter()
        in_flight: list[Future[Any]] = []
        for i in range(count):
            if len(in_flight) >= WINDOW * conns:
                in_flight.pop(0).result()
            in_flight.append(client.submit_readinto(i, 0, buffers[i % len(buffers)]) if read
                             else client.submit_write(i, 0, data, group=1))
        wait(in_flight)
        for f in in_flight:
            f.result()
        elapsed = time.perf_counter() - start
    return count * piece / MiB / elapsed


def _serve_frames(sock: socket.socket, piece: int) -> None:
    """Server side of the threads candidate: header, piece into one buffer, ack."""
    header = bytearray(FRAME.size)
    buf = bytearray(piece)
    with sock:
        while True:
            try:
                recv_exactly(sock, header)
            except PeerClosed:
                return
            rid, length = FRAME.unpack(header)
            recv_exactly(sock, memoryview(buf)[:length])
            sock.sendall(FRAME.pack(rid, 0))


def bench_threads(piece: int, conns: int, total: int) -> float:
    """The same frames as the asyncio and pyzmq candidates over blocking sockets: a
    thread per connection on the server, a sender and an ack reader per connection
    on the client — the transport of ``shinglefs`` without its protocol's work."""
    count = _split(total, conns, piece)
    listener = socket.create_server(("127.0.0.1", 0), backlog=conns)
    data = memoryview(os.urandom(piece))

    def accept() -> None:
        for _ in range(conns):
            sock, _ = listener.accept()
            threading.Thread(target=_serve_frames, args=(sock, piece), daemon=True).start()

    acceptor = threading.Thread(target=accept)
    acceptor.start()
    socks = [socket.create_connection(listener.getsockname()) for _ in range(conns)]
    acceptor.join()

    def send(sock: socket.socket) -> None:
        room = threading.Semaphore(WINDOW)

        def acks() -> None:
            ack = bytearray(FRAME.size)
            for _ in range(count):
                recv_exactly(sock, ack)
                room.release()

        reader = threading.Thread(target=acks)
        reader.start()
        for i in range(count):
            room.acquire()
            sock.sendall(FRAME.pack(i, piece))
            sock.sendall(data)
        reader.join()

    start = time.perf_counter()
    _threads(send, [(s,) for s in socks])
    elapsed = time.perf_counter() - start
    for s in socks:
        s.close()
    listener.close()
    return count * conns * piece / MiB / elapsed


class _SinkProtocol(asyncio.BufferedProtocol):
    """Server side of the asyncio candidate: header, then the piece into one buffer."""

    def __init__(self, piece: int) -> None:
        self._header = bytearray(FRAME.size)
        self._buf = bytearray(piece)
        self._in_header = True
        self._pos = 0
        self._need = FRAME.size
        self._rid = 0
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        target = self._header if self._in_header else self._buf
        return memoryview(target)[self._pos : self._need]

    def buffer_updated(self, nbytes: int) -> None:
        self._pos += nbytes
        if self._pos < self._need:
            return
        self._pos = 0
        if self._in_header:
            self._rid, length = FRAME.unpack(self._header)
            if length > len(self._buf):
                raise ValueError("piece larger than the benchmark's buffer")
            self._in_header, self._need = False, length
        else:
            assert self._transport is not None
            self._transport.write(FRAME.pack(self._rid, 0))
            self._in_header, self._need = True, FRAME.size


async def _asyncio_client(port: int, count: int, data: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    room = asyncio.Semaphore(WINDOW)

    async def acks() -> None:
        for _ in range(count):
            await reader.readexactly(FRAME.size)
            room.release()

    task = asyncio.create_task(acks())
    for i in range(count):
        await room.acquire()
        writer.write(FRAME.pack(i, len(data)))
        writer.write(data)
        await writer.drain()
    await task
    writer.close()
    await writer.wait_closed()


def bench_asyncio(piece: int, conns: int, total: int) -> float:
    """Length-prefixed frames on ``BufferedProtocol``; server and client loops in two threads."""
    count = _split(total, conns, piece)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(
        loop.create_server(lambda: _SinkProtocol(piece), "127.0.0.1", 0), loop).result()
    port = server.sockets[0].getsockname()[1]
    data = os.urandom(piece)

    async def clients() -> None:
        await asyncio.gather(*(_asyncio_client(port, count, data) for _ in range(conns)))

    start = time.perf_counter()
    asyncio.run(clients())
    elapsed = time.perf_counter() - start
    loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()
    return count * conns * piece / MiB / elapsed


def _threads(target: Callable[..., None], args: list[tuple[Any, ...]]) -> None:
    threads = [threading.Thread(target=target, args=a) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def bench_pyzmq(piece: int, conns: int, total: int) -> float:
    """DEALER sockets (one TCP connection each) to one ROUTER; zero-copy sends and receives."""
    import zmq

    count = _split(total, conns, piece)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def serve() -> None:
        for _ in range(count * conns):
            ident, header, _payload = router.recv_multipart(copy=False)
            router.send_multipart([ident, header], copy=False)

    def send(_index: int) -> None:
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        outstanding = 0
        for i in range(count):
            if outstanding >= WINDOW:
                dealer.recv_multipart(copy=False)
                outstanding -= 1
            dealer.send_multipart([FRAME.pack(i, piece), data], copy=False)
            outstanding += 1
        for _ in range(outstanding):
            dealer.recv_multipart(copy=False)
        dealer.close(linger=0)

    data = os.urandom(piece)
    server = threading.Thread(target=serve)
    server.start()
    start = time.perf_counter()
    _threads(send, [(i,) for i in range(conns)])
    elapsed = time.perf_counter() - start
    server.join()
    router.close(linger=0)
    ctx.term()
    return count * conns * piece / MiB / elapsed


def bench_grpcio(piece: int, conns: int, total: int) -> float:
    """One bidirectional stream per channel (its own TCP connection), raw bytes messages."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    count = _split(total, conns, piece)
    options = [("grpc.max_receive_message_length", piece + MiB),
               ("grpc.max_send_message_length", piece + MiB)]

    def put(requests: Iterable[bytes], _context: Any) -> Iterable[bytes]:
        for _ in requests:
            yield b"k"

    server = grpc.server(ThreadPoolExecutor(conns + 2), options=options)
    handler = grpc.method_handlers_generic_handler(
        "bench.Sink", {"Put": grpc.stream_stream_rpc_method_handler(put)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    data = os.urandom(piece)

    def send(_index: int) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}",
                                   options=[*options, ("grpc.use_local_subchannel_pool", 1)]
                                   ) as channel:
            call = channel.stream_stream("/bench.Sink/Put")
            for _ in call(data for _ in range(count)):
                pass

    start = time.perf_counter()
    _threads(send, [(i,) for i in range(conns)])
    elapsed = time.perf_counter() - start
    server.stop(None)
    return count * conns * piece / MiB / elapsed


CANDIDATES: dict[str, Callable[[int, int, int], float]] = {
    "shinglefs": bench_shinglefs,
    "shinglefs_read": lambda piece, conns, total: bench_shinglefs(piece, conns, total, read=True),
    "shinglefs_tls": lambda piece, conns, total: bench_shinglefs(piece, conns, total, tls=True),
    "threads": bench_threads,
    "asyncio": bench_asyncio,
    "pyzmq": bench_pyzmq,
    "grpcio": bench_grpcio,
}


def _measure(piece: int, conns: int, total: int, rounds: int) -> dict[str, Any]:
    """One row: rounds interleave the baseline and the candidates (the machine's load
    drifts), and each keeps its best round."""
    benches: dict[str, Callable[[int, int, int], float]] = {"socket": bench_socket,
                                                            **CANDIDATES}
    best: dict[str, float] = {}
    missing: dict[str, str] = {}
    for _ in range(rounds):
        for name, bench in benches.items():
            if name in missing:
                continue
            try:
                speed = bench(piece, conns, total)
            except ImportError as exc:
                missing[name] = f"not installed: {exc}"
                continue
            best[name] = max(best.get(name, 0.0), speed)
    base = best["socket"]
    row: dict[str, Any] = {"piece_mib": piece // MiB, "connections": conns,
                           "socket_mib_s": round(base, 1)}
    for name in CANDIDATES:
        row[name] = ({"error": missing[name]} if name in missing else
                     {"mib_s": round(best[name], 1), "ratio": round(best[name] / base, 3)})
    return row


def run(quick: bool, workdir: Path | None = None, **_: Any) -> dict[str, Any]:
    """Figures for every piece size x connection count: the baseline, each candidate
    and its ratio to the baseline (best of 2 rounds of 128 MiB; not quick: 3 of 512 MiB)."""
    total = 128 * MiB if quick else 512 * MiB
    rounds = 2 if quick else 3
    runs = [_measure(piece, conns, total, rounds)
            for piece in (MiB, 4 * MiB) for conns in (1, 4)]
    ours = [r["shinglefs"] for r in runs]
    return {
        "total_mib_per_figure": total // MiB, "rounds": rounds, "window": WINDOW,
        "runs": runs,
        # the fields bench cluster reports: best of the protocol and of the baseline
        "protocol_mib_s": max(r["mib_s"] for r in ours),
        "socket_mib_s": max(r["socket_mib_s"] for r in runs),
        "shinglefs_min_ratio": min(r["ratio"] for r in ours),
    }


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run("--quick" in sys.argv), indent=2))
