"""The storage node's space reservation (server/space.py): every byte not yet in a
drive's figure counted once — admitted up to the drives' real room, refused past it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from shinglefs.server.errors import NodeFull
from shinglefs.server.node import StorageNode
from shinglefs.store import SliceStore
from shinglefs.zoned import EmulatedZonedDrive

MiB = 1024 * 1024
KiB = 1024
LONG = 3600.0  # a linger no test waits out: submitted pieces stay queued until a flush
PIECE = 256 * KiB
SLACK = StorageNode.RESERVE_SLACK


@pytest.fixture
def node(tmp_path: Path) -> Iterator[StorageNode]:
    stores = {
        i: SliceStore.format(
            EmulatedZonedDrive.create(str(tmp_path / f"d{i}"), zone_size=MiB, zone_count=64,
                                      conventional_zones=2, max_open_zones=16),
            linger_s=LONG, min_run_bytes=256 * MiB, gc_background=False)
        for i in range(2)
    }
    # figures read only when the node must; the drives close with the node
    n = StorageNode(stores, drives=[s.drive for s in stores.values()], stats_ttl=LONG)
    yield n
    n.close()


class Files:
    """Writers of many files at once, as the client's: reserve the bytes, submit
    them as pieces with ``reserved=True``, give the reservation back when done."""

    def __init__(self, node: StorageNode, count: int) -> None:
        self.node = node
        self.count = count
        self.futures: list[Future[None]] = []
        self.drives: list[int] = []
        self.admitted = 0
        self._lengths = [0] * count

    def write_piece(self, file: int, size: int = PIECE) -> None:
        """One piece of ``file``: raises ``NodeFull`` with nothing taken."""
        self.node.reserve(size)
        self.admitted += size
        slice_id = 1000 + file * 100 + self._lengths[file] // (4 * MiB)
        offset = self._lengths[file] % (4 * MiB)
        drive, future = self.node.submit(slice_id, offset, b"x" * size, group=file + 1,
                                          reserved=True)
        future.add_done_callback(lambda _f: self.node.unreserve(size))
        self._lengths[file] += size
        self.futures.append(future)
        self.drives.append(drive)


def test_bytes_in_flight_count_once_against_the_room(node: StorageNode) -> None:
    room = node.reservable_bytes(fresh=True)
    files = Files(node, 8)
    for i in range(24):
        files.write_piece(i % 8)
    assert not any(f.done() for f in files.futures)  # all of them in flight
    # Reserved and in flight: counted once, in the reservation (was twice).
    assert node.reservable_bytes() == room - 24 * PIECE
    assert node.reservable_bytes(fresh=True) == room - 24 * PIECE
    # A piece nobody reserved (a server's PUT, compaction) counts while in flight.
    node.submit(9, 0, b"u" * PIECE, group=99)
    assert node.reservable_bytes() == room - 25 * PIECE
    # Admitted up to the room, not a byte past it.
    rest = room - 25 * PIECE - SLACK
    node.reserve(rest)
    with pytest.raises(NodeFull):
        node.reserve(1)
    node.unreserve(rest)
    node.flush()
    assert all(f.exception() is None for f in files.futures)
    assert node.reserved_bytes == 0


def writable(node: StorageNode) -> int:
    """The drives' own figure, read now: the truth the ledger estimates."""
    return sum(node.store(d).space().writable_bytes for d in node.drive_ids)


def test_pieces_written_but_not_completed_count_once(node: StorageNode) -> None:
    files = Files(node, 8)
    for i in range(24):
        files.write_piece(i % 8)
    # The writer completes a batch's futures one by one after writing it: hold it
    # in the first one's callback, the other 23 pieces written and not completed.
    held, go = threading.Event(), threading.Event()
    files.futures[0].add_done_callback(lambda _f: (held.set(), go.wait(60)))
    first = files.drives[0]
    flusher = threading.Thread(target=node.flush, args=([first],))
    flusher.start()
    try:
        assert held.wait(60)
        written = sum(d == first for d in files.drives) - 1
        assert written >= 8 and sum(not f.done() for f in files.futures) == 23
        assert node.reserved_bytes == 23 * PIECE
        # Those written: in the drive's figure and still reserved, counted once
        # (were twice); the other drive's pieces queued: in the reservation.
        queued = 23 - written
        assert node.reservable_bytes(fresh=True) == writable(node) - queued * PIECE
    finally:
        go.set()
        flusher.join()
    node.flush()
    assert all(f.exception() is None for f in files.futures) and node.reserved_bytes == 0


def test_a_piece_submitted_before_a_read_and_stored_after_it_still_counts(
        node: StorageNode) -> None:
    files = Files(node, 4)
    for i in range(16):
        files.write_piece(i % 4)
    node.refresh_stats()
    node.reservable_bytes()  # the figures read now: the pieces are still queued
    node.flush()  # stored; their writers give their reservations back
    assert node.reserved_bytes == 0 and all(f.exception() is None for f in files.futures)
    cached = node.reservable_bytes()
    fresh = node.reservable_bytes(fresh=True)
    # Never more than the drives' real room (the old accounting counted these
    # 4 MiB nowhere until the next read); less by record headers at most.
    assert cached >= fresh
    assert cached - fresh <= 16 * SLACK


def test_many_files_fill_the_drives_to_their_real_room_and_every_admitted_byte_is_stored(
        node: StorageNode) -> None:
    room = node.reservable_bytes(fresh=True)
    files = Files(node, 8)
    refused = 0
    i = 0
    while refused < 8:  # every file asks until each is refused
        try:
            files.write_piece(i % 8)
        except NodeFull:
            refused += 1
        i += 1
    assert node.reserved_bytes == files.admitted
    # Everything is still in flight: refused only when the real room was gone.
    assert room - files.admitted < PIECE + SLACK
    node.flush()
    # Nothing admitted fails for want of space (ENOSPC came at write, not close).
    assert [f.exception() for f in files.futures if f.exception()] == []
    assert node.reserved_bytes == 0
    left = node.reservable_bytes(fresh=True)
    assert 0 <= left < PIECE + SLACK
    with pytest.raises(NodeFull):
        node.reserve(PIECE)


def test_placement_counts_a_slice_s_submitted_bytes_once_not_also_in_its_claim(
        node: StorageNode) -> None:
    # Slice 1 claims its drive (a 64 MiB drive: 4 MiB a slice) and has all of
    # it queued; 6 MiB queued on the other drive belong to no placed slice.
    first, _ = node.submit(1, 0, b"a" * (4 * MiB), group=1)
    other = 1 - first
    node.submit(2, 0, b"b" * (6 * MiB), group=2, drive_id=other)
    assert node.estimated_free_bytes(first) - node.estimated_free_bytes(other) == 2 * MiB
    # 4 MiB taken on the first drive (queued, the claim used up), 6 on the other:
    # a new slice goes to the first (counting slice 1 twice sent it to the other).
    assert node.place(3, group=3) == first
    node.flush()
