"""A storage server's read scheduler (server/reads.py): the READs of a drive are
served stream by stream in runs, adjacent ones merged, every stream in turn
(none starves), bit-exact, over TCP as clients send them."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from tests.support.polling import wait_until

from shinglefs.server.errors import SliceMissing
from shinglefs.server.node import StorageNode
from shinglefs.server.reads import DriveReads, ReadRequest, SchedulerClosed
from shinglefs.server.remote import RemoteNode
from shinglefs.server.service import SliceServer
from shinglefs.store.config import StoreConfig

MiB = 1024 * 1024
SECRET = b"cluster secret of the tests, 32B"
STREAMS = 4
SLICE = 8 * MiB


@pytest.fixture
def node(tmp_path: Path) -> Iterator[StorageNode]:
    n = StorageNode.open([(0, f"emulated:{tmp_path}/d0.img:{512 * MiB}")], create=True,
                         zone_size=64 * MiB, store_config=StoreConfig(gc_background=False))
    yield n
    n.close()


def sid(stream: int) -> int:
    return 0x100 + stream


@pytest.fixture
def slices(node: StorageNode) -> dict[int, bytes]:
    """``STREAMS`` slices of ``SLICE`` bytes, written one after another (each
    contiguous on the drive), durable."""
    out = {}
    for s in range(STREAMS):
        data = os.urandom(SLICE)
        for off in range(0, SLICE, 4 * MiB):
            node.write(sid(s), off, data[off:off + 4 * MiB], group=10 + s, drive_id=0)
        out[sid(s)] = data
    node.flush()
    return out


class GatedReads:
    """The node's reads of drive 0, in the order the scheduler makes them; the
    first waits for ``gate`` (so the test queues every request before any
    choice is made). ``reading``: the reads started and not ended."""

    def __init__(self, node: StorageNode) -> None:
        self.node = node
        self.gate = threading.Event()
        self.order: list[tuple[int, int, int]] = []
        self.reading: list[tuple[int, int]] = []
        self.streams_at_once = 0
        self._lock = threading.Lock()

    def __call__(self, slice_id: int, offset: int, length: int) -> bytes:
        with self._lock:
            self.reading.append((slice_id, offset))
            self.streams_at_once = max(self.streams_at_once,
                                       len({s for s, _ in self.reading}))
        self.gate.wait(30)
        with self._lock:
            self.order.append((slice_id, offset, length))
        try:
            return self.node.read(slice_id, offset, length, 0)
        finally:
            with self._lock:
                self.reading.remove((slice_id, offset))


def queue_all(reads: DriveReads, requests: list[tuple[int, int, int]]
              ) -> list[Future[bytes]]:
    """Submit ``(slice, offset, length)`` READs in this order; futures of their bytes."""
    futures: list[Future[bytes]] = []
    for slice_id, offset, length in requests:
        future: Future[bytes] = Future()

        def done(data: memoryview | None, exc: BaseException | None,
                 f: Future[bytes] = future) -> None:
            if exc is not None:
                f.set_exception(exc)
            else:
                assert data is not None
                f.set_result(bytes(data))

        reads.submit(ReadRequest(offset, length, slice_id, done))
        futures.append(future)
    return futures


def interleaved(count: int, length: int) -> list[tuple[int, int, int]]:
    """``count`` READs of ``length`` per stream, one of each stream in turn:
    how readers' requests reach a server that serves them as they come."""
    return [(sid(s), i * length, length) for i in range(count) for s in range(STREAMS)]


def test_streams_are_served_in_runs_in_turn(node: StorageNode,
                                            slices: dict[int, bytes]) -> None:
    gated = GatedReads(node)
    reads = DriveReads(gated, threads=1, run_bytes=4 * MiB, merge_bytes=MiB)
    try:
        futures = queue_all(reads, interleaved(8, MiB))
        gated.gate.set()
        results = [f.result(30) for f in futures]
    finally:
        reads.close()
    for (slice_id, offset, length), data in zip(interleaved(8, MiB), results, strict=True):
        assert data == slices[slice_id][offset:offset + length]
    # Each stream gets a run of 4 MiB (4 READs), then the next stream its turn.
    expected = [(sid(s), (turn * 4 + i) * MiB, MiB)
                for turn in (0, 1) for s in range(STREAMS) for i in range(4)]
    assert gated.order == expected
    stats = reads.stats()
    assert (stats.requests, stats.node_reads, stats.runs, stats.queued) == (32, 32, 8, 0)
    assert stats.mean_run_bytes == 4 * MiB


def test_the_drive_sees_long_runs_not_alternating_reads(node: StorageNode,
                                                         slices: dict[int, bytes]) -> None:
    """The I/O trace of the drive: READs of 4 streams sent one of each in turn
    reach it as one run of 8 MiB per stream (adjacent READs merged)."""
    drive = node.store(0).drive  # type: ignore[attr-defined]
    gated = GatedReads(node)
    reads = DriveReads(gated, threads=1, run_bytes=SLICE, merge_bytes=4 * MiB)
    try:
        futures = queue_all(reads, interleaved(16, SLICE // 16))
        drive.start_trace()
        gated.gate.set()
        results = [f.result(30) for f in futures]
        trace = [t for t in drive.stop_trace() if t.op == "read"]
    finally:
        reads.close()
    for (slice_id, offset, length), data in zip(interleaved(16, SLICE // 16), results,
                                                strict=True):
        assert data == slices[slice_id][offset:offset + length]
    runs, end = 0, None
    for t in trace:
        runs += t.offset != end
        end = t.offset + t.length
    # one run per stream (each slice is in a zone of its own group)
    assert runs == STREAMS, [(t.offset, t.length) for t in trace]
    assert sum(t.length for t in trace) >= STREAMS * SLICE


def test_a_stream_that_keeps_asking_does_not_starve_another(
        node: StorageNode, slices: dict[int, bytes]) -> None:
    gated = GatedReads(node)
    reads = DriveReads(gated, threads=1, run_bytes=2 * MiB, merge_bytes=MiB // 2)
    try:
        greedy = [(sid(0), i * MiB // 2, MiB // 2) for i in range(16)]
        futures = queue_all(reads, [*greedy, (sid(1), 0, MiB)])
        gated.gate.set()
        assert futures[-1].result(30) == slices[sid(1)][:MiB]
        for f in futures:
            f.result(30)
    finally:
        reads.close()
    # stream 0's run ends after 2 MiB (4 READs): stream 1 is next
    assert gated.order.index((sid(1), 0, MiB)) == 4


def test_threads_deepen_one_streams_run_never_serve_a_second_beside_it(
        node: StorageNode, slices: dict[int, bytes]) -> None:
    gated = GatedReads(node)
    reads = DriveReads(gated, threads=2, run_bytes=8 * MiB, merge_bytes=MiB)
    try:
        futures = queue_all(reads, [(sid(0), 0, MiB)])
        wait_until(lambda: len(gated.reading) == 1, "stream 0's first read started")
        # stream 0 has nothing queued but a read going on: stream 1 waits ...
        futures += queue_all(reads, [(sid(1), 0, MiB)])
        # ... and stream 0's next READ goes beside its first
        futures += queue_all(reads, [(sid(0), MiB, MiB)])
        wait_until(lambda: len(gated.reading) == 2, "two reads started")
        assert sorted(gated.reading) == [(sid(0), 0), (sid(0), MiB)]
        gated.gate.set()
        results = [f.result(30) for f in futures]
    finally:
        reads.close()
    assert results == [slices[sid(0)][:MiB], slices[sid(1)][:MiB], slices[sid(0)][MiB:2 * MiB]]
    assert gated.streams_at_once == 1


def test_errors_reach_each_request_and_closing_answers_what_waits(
        node: StorageNode, slices: dict[int, bytes]) -> None:
    gated = GatedReads(node)
    reads = DriveReads(gated, threads=1)
    missing, queued = queue_all(reads, [(0xDEAD, 0, MiB), (sid(0), 0, MiB)])
    # the missing slice's read is being served before close (else close answers it)
    wait_until(lambda: len(gated.reading) == 1, "the first read started")
    closer = threading.Thread(target=reads.close)
    closer.start()
    gated.gate.set()
    closer.join(30)
    with pytest.raises(SliceMissing):
        missing.result(30)
    try:  # taken by the thread before close, or answered by close
        assert queued.result(30) == slices[sid(0)][:MiB]
    except SchedulerClosed:
        pass
    with pytest.raises(SchedulerClosed):
        queue_all(reads, [(sid(0), 0, MiB)])


def test_pipelined_readers_over_tcp_read_bit_exact_and_all_are_served(
        node: StorageNode, slices: dict[int, bytes]) -> None:
    with SliceServer(node, SECRET) as server:
        clients = [RemoteNode(server.address, SECRET, connections=2, timeout=30)
                   for _ in range(STREAMS)]
        try:
            pending = [(s, off, clients[s].submit_read(sid(s), off, MiB, drive_id=0))
                       for off in range(0, SLICE, MiB) for s in range(STREAMS)]
            for s, off, future in pending:
                assert bytes(future.result(30)) == slices[sid(s)][off:off + MiB]
            # past the end: short; a missing slice: its typed error, the connection kept
            assert clients[0].read(sid(0), SLICE - 100, MiB, drive_id=0) == \
                slices[sid(0)][-100:]
            with pytest.raises(SliceMissing):
                clients[1].read(0xBEEF, 0, MiB, drive_id=0)
            assert clients[1].read(sid(1), 0, 10, drive_id=0) == slices[sid(1)][:10]
        finally:
            for client in clients:
                client.close()
        stats = server.read_stats()[0]
    assert stats.requests == STREAMS * SLICE // MiB + 3
    assert stats.queued == 0
