"""The client's send path (server/remote.py ``_Channel.call``): a large piece is
handed to its connection's sender thread, so one caller keeps several
connections sending at once; frames still leave each connection in the order
they were submitted, the bytes a connection holds for sending are bounded
(the caller waits for room), and a server that dies with pieces still queued
fails every one of them instead of leaving a caller waiting.

The server is a real ``shinglefs server`` process on loopback; SIGSTOP makes it
stop reading, so its socket fills as a slow or hung server's would.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
import zlib
from concurrent.futures import Future, wait
from pathlib import Path

import pytest
from tests.server.test_read_stress import started, stopped
from tests.server.test_server_process import Server

from shinglefs.meta.api import MetaStore
from shinglefs.server.errors import ConnectionLost, ServerUnreachable, SliceMissing
from shinglefs.server.remote import HANDOFF_BYTES, OUTBOX_BYTES, RemoteNode

MiB = 1024 * 1024
PIECE = 8 * MiB  # more than a stopped server's socket takes: its sender blocks


def on_connections(remote: RemoteNode, count: int) -> list[int]:
    """``count`` slice ids, the i-th sent over connection i, which is open."""
    ids: list[int] = []
    slice_id = 100
    while len(ids) < count:
        if remote.connection_of(slice_id) == len(ids):
            ids.append(slice_id)
        slice_id += 1
    for slice_id in ids:
        with contextlib.suppress(SliceMissing):
            remote.length(slice_id)
    return ids


def submitted_within(seconds: float, submit: list[tuple[int, bytes]],
                     remote: RemoteNode) -> tuple[list[Future[int]], threading.Thread]:
    """Submit ``(slice_id, data)`` pieces from one thread; the futures it got
    within ``seconds`` (the thread goes on submitting the rest)."""
    futures: list[Future[int]] = []

    def caller() -> None:
        for slice_id, data in submit:
            futures.append(remote.submit_write(slice_id, 0, data, group=1))

    thread = threading.Thread(target=caller, daemon=True)
    thread.start()
    thread.join(seconds)
    return futures, thread


def test_one_caller_keeps_every_connection_sending(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """A piece the server's socket cannot take at once never holds up the
    caller's next piece for another connection."""
    server, address, secret = started(meta_url, meta, tmp_path, servers)
    pieces = [os.urandom(PIECE) for _ in range(2)]
    with RemoteNode(address, secret, connections=2, timeout=30) as remote:
        remote.ping()
        ids = on_connections(remote, 2)
        with stopped(server):
            futures, caller = submitted_within(3.0, list(zip(ids, pieces, strict=True)), remote)
            # before: the caller sat in sendall of the first piece until the server woke
            assert len(futures) == 2 and not caller.is_alive()
            assert not any(f.done() for f in futures)
        drives = [f.result(timeout=30) for f in futures]
        for slice_id, data, drive in zip(ids, pieces, drives, strict=True):
            assert remote.read(slice_id, 0, PIECE, drive) == data


def test_small_and_large_pieces_of_a_slice_arrive_in_order(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """Small pieces (sent by the caller) never overtake large ones queued before
    them for the sender thread: the server takes a slice's pieces only in order."""
    server, address, secret = started(meta_url, meta, tmp_path, servers)
    sizes = [4096, HANDOFF_BYTES, 4096, 4096, 2 * MiB, 64 * 1024, HANDOFF_BYTES + 4096, 4096] * 3
    data = os.urandom(sum(sizes))
    with RemoteNode(address, secret, connections=1, timeout=30) as remote:
        remote.ping()
        futures, offset = [], 0
        with stopped(server):  # everything queues behind the first large piece
            for size in sizes:
                futures.append(remote.submit_write(9, offset, data[offset:offset + size],
                                                   group=1))
                offset += size
        done, _ = wait(futures, timeout=30)
        assert len(done) == len(futures)
        drive = {f.result() for f in futures}.pop()
        assert remote.read(9, 0, len(data), drive) == data


def test_a_connection_holds_a_bounded_number_of_bytes_for_sending(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """With the server not reading, the caller is held once ``OUTBOX_BYTES`` wait
    for the sender, and goes on when the server reads again."""
    server, address, secret = started(meta_url, meta, tmp_path, servers)
    count = OUTBOX_BYTES // PIECE + 4
    pieces = [(50 + i, os.urandom(PIECE)) for i in range(count)]
    with RemoteNode(address, secret, connections=1, timeout=60) as remote:
        remote.ping()
        with stopped(server):
            futures, caller = submitted_within(2.0, pieces, remote)
            # at most the piece being sent + OUTBOX_BYTES queued + the one waiting
            assert caller.is_alive()
            assert len(futures) <= OUTBOX_BYTES // PIECE + 2
        caller.join(60)
        assert not caller.is_alive() and len(futures) == count
        for (slice_id, data), future in zip(pieces, futures, strict=True):
            assert remote.read(slice_id, 0, PIECE, future.result(timeout=60)) == data


def test_a_server_killed_with_pieces_queued_fails_every_one(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    server, address, secret = started(meta_url, meta, tmp_path, servers)
    pieces = [(70 + i, os.urandom(PIECE)) for i in range(3)]
    with RemoteNode(address, secret, connections=1, timeout=60) as remote:
        remote.ping()
        os.kill(server.proc.pid, signal.SIGSTOP)
        futures, caller = submitted_within(2.0, pieces, remote)
        assert len(futures) == 3 and not caller.is_alive()
        server.proc.kill()
        server.proc.wait(10)
        started_at = time.monotonic()
        for future in futures:
            with pytest.raises((ConnectionLost, ServerUnreachable)):
                future.result(timeout=20)
        assert time.monotonic() - started_at < 20
        # the next request opens a new connection and is refused, not hung
        with pytest.raises(ServerUnreachable):
            remote.ping()


def test_threads_mixing_small_and_large_pieces_store_every_byte(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """Six threads write their own slices in pieces of random sizes on either side
    of ``HANDOFF_BYTES``, pipelined on two connections, while a seventh pings:
    every byte reads back where it was written (no frame ever sent inside
    another, none reordered within a slice)."""
    _server, address, secret = started(meta_url, meta, tmp_path, servers)
    slices_per_thread, threads = 3, 6
    stored: dict[int, bytes] = {}
    errors: list[BaseException] = []
    done = threading.Event()

    def writer(index: int) -> None:
        rng = random.Random(index)
        try:
            for k in range(slices_per_thread):
                slice_id = 1000 + index * 10 + k
                sizes = [rng.choice((4096, 60 * 1024, HANDOFF_BYTES - 4096, HANDOFF_BYTES,
                                     MiB + 4096, 3 * MiB)) for _ in range(6)]
                data = rng.randbytes(sum(sizes))
                futures, offset = [], 0
                for size in sizes:
                    futures.append(remote.submit_write(slice_id, offset,
                                                       data[offset:offset + size], group=1))
                    offset += size
                drives = {f.result(timeout=60) for f in futures}
                assert len(drives) == 1
                stored[slice_id] = data
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    def pinger() -> None:
        while not done.is_set():
            try:
                remote.ping()
            except BaseException as exc:
                errors.append(exc)
                return

    with RemoteNode(address, secret, connections=2, timeout=60) as remote:
        workers = [threading.Thread(target=writer, args=(i,)) for i in range(threads)]
        ping = threading.Thread(target=pinger)
        ping.start()
        for t in workers:
            t.start()
        for t in workers:
            t.join(120)
        done.set()
        ping.join(30)
        assert not errors, errors
        assert len(stored) == threads * slices_per_thread
        for slice_id, data in stored.items():
            assert zlib.crc32(remote.read(slice_id, 0, len(data))) == zlib.crc32(data)
