"""A storage server's write scheduling across clients: a FLUSH covers only the
writes already answered (another client's queued pieces stay queued, their
zone run goes on), and the PUT payloads a server holds are bounded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from shinglefs.server.auth import FrameSealer
from shinglefs.server.node import StorageNode
from shinglefs.server.remote import RemoteNode
from shinglefs.server.service import SliceServer
from shinglefs.server.wire import HEADER_SIZE, Header, Kind, Limits, read_frame
from shinglefs.store.config import StoreConfig
from shinglefs.store.scheduler import WriteScheduler

MiB = 1024 * 1024
SECRET = b"cluster secret of the tests, 32B"

# Pieces of a group wait for a long run: only a durable piece, a barrier or
# closing makes a group eligible (the linger is far longer than a test).
HOLDING = StoreConfig(min_run_bytes=256 * MiB, linger_s=60.0, switch_bytes=32 * MiB,
                      gc_background=False)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[StorageNode]:
    n = StorageNode.open([(0, f"emulated:{tmp_path}/d0.img:{256 * MiB}")], create=True,
                         zone_size=16 * MiB, store_config=HOLDING)
    yield n
    n.close()


def scheduler(node: StorageNode) -> WriteScheduler:
    found = getattr(node.store(0), "scheduler", None)
    assert isinstance(found, WriteScheduler)
    return found


def test_a_flush_leaves_another_clients_queued_pieces_queued(node: StorageNode) -> None:
    with SliceServer(node, SECRET) as server, \
            RemoteNode(server.address, SECRET, connections=1, timeout=20) as a, \
            RemoteNode(server.address, SECRET, connections=1, timeout=20) as b:
        waiting = a.submit_write(0x2000, 0, b"a" * MiB, 2, drive_id=0)
        assert b.write(0x1000, 0, b"b" * MiB, 1, drive_id=0, durable=True) == 0
        b.flush([0])  # b's fsync: its answered write is durable ...
        assert not waiting.done()  # ... and a's piece was not forced out of the queue
        assert [g for g, _ in scheduler(node).runs_written] == [1]
        node.flush()  # the drive's own barrier writes it
        assert waiting.result(20) == 0
        assert a.read(0x2000, 0, MiB) == b"a" * MiB


def test_the_put_payloads_a_server_holds_are_bounded(node: StorageNode) -> None:
    pieces = 24
    with SliceServer(node, SECRET, held_bytes=4 * MiB) as server, \
            RemoteNode(server.address, SECRET, connections=4, timeout=30) as client:
        # 24 MiB of pieces sent at once, none of which the drive writes until
        # flushed: the server reads 4 MiB of them and leaves the rest to TCP
        # (so the sender, blocked by TCP, runs in a thread of its own).
        sent: list[Future[int]] = []

        def send() -> None:
            for i in range(pieces):
                sent.append(client.submit_write(0x3000 + i, 0, bytes([i]) * MiB, 10 + i,
                                                drive_id=0))

        sender = threading.Thread(target=send)
        sender.start()
        while sender.is_alive() or not all(f.done() for f in sent):
            node.flush()  # writes what is queued; the readers then take more
            time.sleep(0.01)
        sender.join()
        assert [f.result() for f in sent] == [0] * pieces
        assert 0 < server.held.peak <= 4 * MiB
        assert server.held.held == 0
        for i in range(pieces):
            assert client.read(0x3000 + i, 0, MiB) == bytes([i]) * MiB


def test_a_put_cut_off_mid_payload_gives_its_held_bytes_back(node: StorageNode) -> None:
    from tests.server.test_wire import raw_connect, raw_handshake

    with SliceServer(node, SECRET, held_bytes=4 * MiB) as server:
        with raw_connect(server) as sock:
            keys = raw_handshake(sock)
            read_frame(sock, bytearray(HEADER_SIZE), Limits())  # the handshake's answer
            header = Header(Kind.PUT, request_id=1, slice_id=0x4000, arg=1, drive=0,
                            payload_len=MiB)
            sock.sendall(FrameSealer(keys["c2s"]).seal(header) + b"x" * 1000)
        with RemoteNode(server.address, SECRET, connections=1, timeout=20) as client:
            client.ping()  # a request after the cut: the server read the closed socket
            deadline = time.monotonic() + 20
            while server.held.held and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.held.held == 0
            # the whole budget is there for the next client's pieces
            assert client.write(0x4001, 0, b"y" * 4 * MiB, 2, drive_id=0, durable=True) == 0


def test_a_drives_write_figures_match_its_io_trace(node: StorageNode) -> None:
    """Two clients, each writing its own group through one server: the figures the
    server reports (over STATS too) are what its drive's I/O trace shows."""
    drive = node.store(0).drive
    conventional = drive.conventional_zones  # type: ignore[attr-defined]
    before = node.stats().drives[0].writes
    assert (before.runs, before.bytes_written, before.zone_switches) == (0, 0, 0)
    drive.start_trace()  # type: ignore[attr-defined]
    with SliceServer(node, SECRET, held_bytes=8 * MiB) as server, \
            RemoteNode(server.address, SECRET, connections=2, timeout=30) as a, \
            RemoteNode(server.address, SECRET, connections=2, timeout=30) as b:
        sent: list[Future[int]] = []

        def send(client: RemoteNode, group: int, mib: int) -> None:
            for i in range(mib):  # one slice a group, 1 MiB pieces
                sent.append(client.submit_write(group << 8, i * MiB, bytes([group]) * MiB,
                                                group, drive_id=0))

        senders = [threading.Thread(target=send, args=(a, 1, 20)),
                   threading.Thread(target=send, args=(b, 2, 12))]
        for t in senders:
            t.start()
        while any(t.is_alive() for t in senders) or not all(f.done() for f in sent):
            node.flush()  # the held bytes bound what is queued: write it, take more
            time.sleep(0.01)
        for t in senders:
            t.join()
        assert [f.result() for f in sent] == [0] * 32
        figures = node.stats().drives[0].writes
        assert a.stats().drives[0].writes == figures  # the same over the wire
    trace = [t for t in drive.stop_trace()  # type: ignore[attr-defined]
             if t.op == "write" and t.zone >= conventional]
    runs = scheduler(node).runs_written
    assert figures.bytes_written == sum(n for _, n in runs) == 32 * MiB
    assert figures.runs == len(runs) >= 2
    assert figures.mean_run_bytes == 32 * MiB // len(runs)
    assert figures.group_switches == 1 + sum(
        1 for i in range(1, len(runs)) if runs[i][0] != runs[i - 1][0])
    zones = [t.zone for t in trace]
    assert figures.zone_switches == 1 + sum(
        1 for i in range(1, len(zones)) if zones[i] != zones[i - 1])
    assert figures.zone_switches >= 3  # 20 MiB of group 1 fill more than a 16 MiB zone
    on_drive = sum(t.length for t in trace)  # the records' headers and alignment too
    assert figures.bytes_written < on_drive < figures.bytes_written + 32 * 8192
    assert (figures.queued_pieces, figures.queued_bytes) == (0, 0)


def test_a_drives_queue_depth_is_what_waits_in_its_scheduler(node: StorageNode) -> None:
    futures = [node.submit(0x500 + g, 0, b"q" * (g * 4096), group=g)[1] for g in (1, 2, 3)]
    writes = node.stats().drives[0].writes
    assert (writes.queued_pieces, writes.queued_bytes, writes.runs) == (3, 6 * 4096, 0)
    node.flush()
    assert all(f.result() is None for f in futures)
    writes = node.stats().drives[0].writes
    assert (writes.queued_pieces, writes.queued_bytes) == (0, 0)
    assert (writes.runs, writes.bytes_written, writes.group_switches) == (3, 6 * 4096, 3)


def test_a_durable_put_behind_a_full_hold_on_its_own_connection_is_not_stuck(
        node: StorageNode) -> None:
    # The held 4 MiB wait for a durable piece of their group (the linger is a
    # minute), and the durable piece waits, unread behind them on the same
    # connection, for held room: the server must break that circle itself.
    with SliceServer(node, SECRET, held_bytes=4 * MiB) as server, \
            RemoteNode(server.address, SECRET, connections=1, timeout=20) as client:
        queued = client.submit_write(0x5000, 0, b"q" * 4 * MiB, 3, drive_id=0)
        assert client.write(0x5001, 0, b"d" * MiB, 3, drive_id=0, durable=True) == 0
        assert queued.result(20) == 0
        assert client.read(0x5000, 0, 4 * MiB) == b"q" * 4 * MiB
        assert server.held.held == 0
