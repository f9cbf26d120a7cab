"""``submit(urgent=True, wait=False)``: a piece written in the caller's thread when the
drive's writer is idle, or ``Declined`` with nothing done (no queueing, no hand-off), on
the store and on the storage node; ``wait=False`` of a piece for a full queue; and
``PieceFuture.expedite`` of a queued piece."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from storekit import MiB, crash, make_drive, payload, reopen
from tests.support.polling import wait_until

from shinglefs.server.node import StorageNode
from shinglefs.store import SliceOrderError, SliceStore, StoreClosed, StoreIOError
from shinglefs.store.api import Declined, PieceBytes, PieceFuture
from shinglefs.zoned import ZoneCondition

LONG = 3600.0  # a linger no test waits out: a submitted piece stays queued until a flush


class WriterBlocked:
    """Hold the store's ``io_lock`` and make its writer thread take a piece: the
    writer is then *writing* (it holds the busy token) until ``release``."""

    def __init__(self, store: SliceStore, slice_id: int, group: int,
                 durable: bool = False) -> None:
        self.store = store
        self.lock = store.slice_log.io_lock
        self.lock.acquire()
        try:
            # durable: eligible at once, even in a store that lingers for ever
            self.future = store.submit(slice_id, 0, b"w" * 4096, group=group, durable=durable)
            wait_until(lambda: store.scheduler.queued_bytes == 0, "the writer took the piece")
        except BaseException:
            self.lock.release()
            raise

    def release(self) -> None:
        self.lock.release()
        self.future.result(timeout=30)


@pytest.fixture
def store(drive_factory) -> Iterator[SliceStore]:  # type: ignore[no-untyped-def]
    """An idle store: no background GC pass may hold the drive at a moment the
    test does not choose (an urgent piece may rightly be declined then)."""
    s = SliceStore.format(drive_factory(), gc_background=False)
    yield s
    s.close()


@pytest.fixture
def lingering(drive_factory) -> Iterator[SliceStore]:  # type: ignore[no-untyped-def]
    s = SliceStore.format(drive_factory(), linger_s=LONG, gc_background=False)
    yield s
    s.close()


def assert_nothing_queued(store: SliceStore, slice_id: int, queued_before: int) -> None:
    assert store.scheduler.queued_bytes == queued_before
    assert store.scheduler.pending_length(slice_id) is None
    assert not store.contains(slice_id)


def write_now(store: SliceStore, slice_id: int, offset: int, data: PieceBytes, group: int,
              durable: bool = False) -> PieceFuture | None:
    """An urgent piece that must not wait: its future, or None when declined."""
    try:
        return store.submit(slice_id, offset, data, group, durable=durable, urgent=True,
                            wait=False)
    except Declined:
        return None


def node_write_now(node: StorageNode, slice_id: int, offset: int, data: PieceBytes,
                   group: int, drive_id: int | None = None,
                   ) -> tuple[int, PieceFuture] | None:
    try:
        return node.submit(slice_id, offset, data, group, drive_id=drive_id, urgent=True,
                           wait=False)
    except Declined:
        return None


# ---------------------------------------------------------------- an idle store
def test_urgent_now_on_an_idle_store_is_written_and_readable_on_return(store):
    data = payload(1, 100_000)
    future = write_now(store, 1, 0, data, group=5)
    assert future is not None and future.done()
    assert future.result() is None
    assert store.read(1, 0, len(data)) == data
    assert store.length(1) == len(data)
    assert [(off, n) for off, n, _dev in store.slice_log.index.extents(1)] == [(0, len(data))]
    assert store.scheduler.queued_bytes == 0

    more = payload(2, 5000)
    again = write_now(store, 1, len(data), more, group=5)
    assert again is not None and again.done() and again.exception() is None
    assert store.length(1) == len(data) + len(more)
    assert store.read(1, 0, 200_000) == data + more
    # A queued submit continues where the piece written now left the slice.
    store.write(1, len(data) + len(more), b"tail", group=5)
    assert store.read(1, len(data) + len(more), 10) == b"tail"


def test_urgent_now_takes_any_buffer_and_an_empty_piece_completes_without_a_write(store):
    data = bytearray(payload(3, 8192))
    future = write_now(store, 3, 0, memoryview(data).cast("I"), group=1)
    assert future is not None and future.exception() is None
    assert store.read(3, 0, 8192) == bytes(data)
    written = store.stats().user_bytes_written
    empty = write_now(store, 3, 8192, b"", group=1)
    assert empty is not None and empty.done() and empty.exception() is None
    assert store.length(3) == 8192
    assert store.stats().user_bytes_written == written


def test_urgent_now_of_the_wrong_offset_raises_and_queues_nothing(store):
    with pytest.raises(SliceOrderError) as info:
        write_now(store, 7, 10, b"x" * 100, group=2)
    assert info.value.expected == 0 and info.value.offset == 10
    assert_nothing_queued(store, 7, 0)
    # The slice's expected length did not move: offset 0 still works, and so
    # does the next urgent piece (the busy token was not left taken).
    first = write_now(store, 7, 0, b"a" * 100, group=2)
    assert first is not None and first.exception() is None
    with pytest.raises(SliceOrderError) as info:
        write_now(store, 7, 101, b"b", group=2)
    assert info.value.expected == 100
    assert store.length(7) == 100
    second = write_now(store, 7, 100, b"b" * 50, group=2)
    assert second is not None and second.exception() is None
    assert store.read(7, 0, 1000) == b"a" * 100 + b"b" * 50


def test_urgent_now_after_close_raises_store_closed(drive_factory):
    s = SliceStore.format(drive_factory())
    s.close()
    with pytest.raises(StoreClosed):
        write_now(s, 1, 0, b"x", group=0)


# ---------------------------------------------------------------- when it must not write
def test_urgent_now_does_nothing_while_its_group_has_queued_pieces(lingering):
    store = lingering
    head = payload(10, 4096)
    queued = store.submit(10, 0, head, group=7)
    assert store.scheduler.queued_bytes == len(head)

    # Another slice of the same group, and the next piece of the queued slice.
    assert write_now(store, 11, 0, b"other" * 100, group=7) is None
    assert_nothing_queued(store, 11, len(head))
    assert write_now(store, 10, len(head), b"next", group=7) is None
    assert store.scheduler.queued_bytes == len(head)
    assert store.scheduler.pending_length(10) == len(head)  # not advanced by the refusal
    assert not queued.done()

    # A group with nothing queued is not held up by group 7's queue.
    elsewhere = write_now(store, 12, 0, b"free", group=8)
    assert elsewhere is not None and elsewhere.done() and elsewhere.exception() is None
    assert store.read(12, 0, 10) == b"free"
    assert not queued.done()

    # The queued slice's later pieces still land in order behind its head.
    tail = payload(11, 3000)
    later = store.submit(10, len(head), tail, group=7)
    store.flush()
    assert queued.result(timeout=30) is None and later.result(timeout=30) is None
    assert store.read(10, 0, 10_000) == head + tail
    # Once the group's queue is empty, an urgent piece is written now again.
    now = write_now(store, 10, len(head) + len(tail), b"end", group=7)
    assert now is not None and now.exception() is None
    assert store.read(10, 0, 10_000) == head + tail + b"end"


def test_urgent_now_does_nothing_while_another_thread_writes(store):
    blocked = WriterBlocked(store, 20, group=1)
    try:
        queued = store.scheduler.queued_bytes
        assert write_now(store, 21, 0, b"x" * 1000, group=2) is None  # another group
        assert_nothing_queued(store, 21, queued)
        assert write_now(store, 22, 0, b"y" * 1000, group=1) is None  # the writer's own group
        assert_nothing_queued(store, 22, queued)
    finally:
        blocked.release()
    assert store.read(20, 0, 5000) == b"w" * 4096
    # The writer is idle again: the same piece is written at once.
    future = write_now(store, 21, 0, b"x" * 1000, group=2)
    assert future is not None and future.exception() is None
    assert store.read(21, 0, 2000) == b"x" * 1000


def test_urgent_now_does_nothing_while_a_flush_waits(store):
    blocked = WriterBlocked(store, 30, group=1)
    flushed: list[BaseException | None] = []
    flusher = threading.Thread(target=lambda: flushed.append(_flush(store)))
    try:
        flusher.start()
        wait_until(lambda: store.scheduler.flush_waiting, "the flush barrier is registered")
        assert write_now(store, 31, 0, b"z" * 100, group=3) is None
        assert_nothing_queued(store, 31, 0)
    finally:
        blocked.release()
        flusher.join(timeout=30)
    assert flushed == [None]
    assert not store.contains(31)
    future = write_now(store, 31, 0, b"z" * 100, group=3)
    assert future is not None and future.exception() is None


def test_urgent_now_does_not_wait_for_a_thread_that_holds_the_drive(store):
    """The zone collector, a delete's tombstone, a checkpoint: each holds the
    log's io_lock without the writer's busy token; an urgent piece is declined then."""
    held, done = threading.Event(), threading.Event()

    def collector_like() -> None:
        # What the zone collector does while it appends a chunk of copies.
        with store.slice_log.io_lock:
            held.set()
            done.wait(60)

    holder = threading.Thread(target=collector_like)
    holder.start()
    result: list[Future[None] | None] = []
    caller = threading.Thread(target=lambda: result.append(
        write_now(store, 95, 0, b"x" * 4096, group=1)))
    try:
        assert held.wait(30)
        caller.start()
        caller.join(timeout=5)  # a bound for a call that must not wait, not a timing claim
        returned = not caller.is_alive()
    finally:
        done.set()
        holder.join(30)
        caller.join(30)
    assert returned, "an urgent submit(wait=False) waited for the thread holding the io_lock"
    assert result == [None]
    assert_nothing_queued(store, 95, 0)


def _flush(store: SliceStore) -> BaseException | None:
    try:
        store.flush()
    except BaseException as exc:  # reported to the test thread
        return exc
    return None


def test_urgent_now_leaves_a_due_index_checkpoint_to_the_writer_thread(drive_factory):
    store = SliceStore.format(drive_factory(), checkpoint_interval_bytes=1, gc_background=False)
    try:
        store.write(40, 0, b"a" * 4096, group=1)  # the writer checkpoints after it
        assert not store.slice_log.checkpoint_due
        store.delete(40)  # a tombstone appended; no checkpoint follows it
        assert store.slice_log.checkpoint_due
        checkpoints = store.slice_log.ckpt_number
        assert write_now(store, 41, 0, b"b" * 4096, group=1) is None
        assert_nothing_queued(store, 41, 0)
        assert store.slice_log.ckpt_number == checkpoints
        store.write(41, 0, b"b" * 4096, group=1)  # through the writer thread
        assert not store.slice_log.checkpoint_due
        assert store.slice_log.ckpt_number > checkpoints
        assert store.read(41, 0, 5000) == b"b" * 4096
    finally:
        store.close()


# ---------------------------------------------------------------- queued pieces
def test_a_piece_for_a_full_queue_is_declined_without_wait_and_nothing_is_queued(drive_factory):
    store = SliceStore.format(drive_factory(), linger_s=LONG, gc_background=False,
                              max_queue_bytes=64 * 1024)
    try:
        first = store.submit(100, 0, payload(100, 40_000), group=1)
        assert not store.has_room(40_000) and store.has_room(20_000)
        with pytest.raises(Declined):
            store.submit(101, 0, payload(101, 40_000), group=2, wait=False)
        assert_nothing_queued(store, 101, 40_000)
        # Room that is there is taken without waiting.
        taken = store.submit(102, 0, b"s" * 20_000, group=2, wait=False)
        assert store.scheduler.queued_bytes == 60_000
        store.flush()
        assert first.result(timeout=30) is None and taken.result(timeout=30) is None
        assert store.has_room(40_000)
        later = store.submit(101, 0, payload(101, 40_000), group=2, wait=False)
        store.flush()
        assert later.result(timeout=30) is None
        assert store.read(101, 0, 50_000) == payload(101, 40_000)
    finally:
        store.close()


def test_expedite_writes_a_queued_piece_in_the_calling_thread_when_the_writer_is_idle(
        lingering):
    store = lingering
    head, tail = payload(110, 5000), payload(111, 3000)
    first = store.submit(110, 0, head, group=4)
    second = store.submit(110, len(head), tail, group=4)
    assert not first.done() and not second.done()  # lingering for ever
    second.expedite()
    # Written by this thread before expedite returned: the group's whole run.
    assert first.done() and second.done() and second.exception() is None
    assert store.scheduler.queued_bytes == 0
    assert store.read(110, 0, 10_000) == head + tail
    second.expedite()  # a no-op once written


def test_an_urgent_piece_queued_behind_a_busy_writer_is_taken_without_lingering(lingering):
    store = lingering
    blocked = WriterBlocked(store, 120, group=1, durable=True)
    try:
        future = store.submit(121, 0, b"u" * 2000, group=2, urgent=True)
        assert not future.done()  # queued: another thread is writing
        lazy = store.submit(122, 0, b"l" * 2000, group=3)
    finally:
        blocked.release()
    # The writer takes the urgent group next; the other one lingers (for ever).
    assert future.result(timeout=30) is None
    assert store.read(121, 0, 5000) == b"u" * 2000
    assert not lazy.done()
    store.flush()
    assert lazy.result(timeout=30) is None


def test_an_idle_only_expedite_leaves_a_busy_writer_alone_and_serves_an_idle_one(lingering):
    # A storage server's reader stuck for held room expedites with idle_only: while
    # the writer writes, the piece's group must not become urgent (that ends a
    # zone run); once the writer idles (lingers), the piece is written at once.
    store = lingering
    blocked = WriterBlocked(store, 130, group=1, durable=True)
    try:
        held = store.submit(131, 0, b"h" * 2000, group=2)
        held.expedite(idle_only=True)
        assert not held.done()
    finally:
        blocked.release()
    # The writer, free again, writes another durable piece; the expedited group
    # would have gone with it had it become urgent.
    store.submit(132, 0, b"d" * 2000, group=1, durable=True).result(timeout=30)
    assert not held.done()
    held.expedite(idle_only=True)  # the writer idles now: written in this thread
    assert held.done() and held.exception() is None
    assert store.read(131, 0, 5000) == b"h" * 2000


# ---------------------------------------------------------------- durability and failure
def test_bytes_written_now_survive_a_close_and_reopen(store):
    written = {sid: payload(sid, 1000 * sid + 17) for sid in range(50, 58)}
    for sid, data in written.items():
        half = len(data) // 2
        for off, part in ((0, data[:half]), (half, data[half:])):
            future = write_now(store, sid, off, part, group=sid % 3)
            assert future is not None and future.exception() is None
    store.delete(51)
    again = reopen(store)
    try:
        for sid, data in written.items():
            if sid == 51:
                assert not again.contains(51)
                continue
            assert again.length(sid) == len(data)
            assert again.read(sid, 0, len(data) + 10) == data
    finally:
        again.close()


def test_a_durable_piece_written_now_survives_a_power_cut_on_return(store):
    data = payload(60, 70_000)
    future = write_now(store, 60, 0, data, group=4, durable=True)
    assert future is not None and future.exception() is None
    # Neither the store nor the drive is flushed again before the power goes.
    again = crash(store)
    try:
        assert again.read(60, 0, 100_000) == data
    finally:
        again.close()


def test_a_failed_drive_zone_gives_a_completed_future_with_the_error(store):
    first = payload(70, 100_000)
    done = write_now(store, 70, 0, first, group=3)
    assert done is not None and done.exception() is None
    zone = store.slice_log.index.extents(70)[0][2] // MiB
    store.drive.fail_zone(zone, ZoneCondition.READ_ONLY)

    failed = write_now(store, 70, len(first), b"x" * 5000, group=3)
    assert failed is not None and failed.done()
    error = failed.exception()
    assert isinstance(error, StoreIOError) and error.zone == zone
    assert store.length(70) == len(first)
    assert store.scheduler.pending_length(70) is None  # the slice resumes at its length
    with pytest.raises(SliceOrderError):
        write_now(store, 70, len(first) + 5000, b"y", group=3)
    # The store goes on: the retry lands in a fresh zone, at once.
    retry = write_now(store, 70, len(first), b"z" * 5000, group=3)
    assert retry is not None and retry.exception() is None
    assert store.read(70, 0, 200_000) == first + b"z" * 5000
    assert store.slice_log.index.extents(70)[-1][2] // MiB != zone


# ---------------------------------------------------------------- the storage node
@pytest.fixture
def node(tmp_path: Path) -> Iterator[StorageNode]:
    stores = {
        i: SliceStore.format(make_drive(tmp_path / f"d{i}", zone_size=MiB, zone_count=64),
                             linger_s=LONG, gc_background=False)
        for i in range(2)
    }
    n = StorageNode(stores, drives=[s.drive for s in stores.values()], stats_ttl=LONG)
    yield n
    n.close()


def test_node_urgent_now_places_the_slice_and_returns_a_completed_future(node):
    data = payload(80, 50_000)
    stored = node_write_now(node, 80, 0, data, group=9)
    assert stored is not None
    drive_id, future = stored
    assert isinstance(future, Future) and future.done() and future.exception() is None
    assert node.drive_of(80) == drive_id
    assert node.read(80, 0, 60_000, drive_id) == data
    assert node.length(80) == len(data)
    assert node.place(81, 9) == drive_id  # the group stays on its drive
    more = node_write_now(node, 80, len(data), b"more", group=9, drive_id=drive_id)
    assert more is not None and more[0] == drive_id and more[1].exception() is None
    assert node.read(80, 0, 60_000) == data + b"more"
    # Nothing is left counted as pending once the future completed.
    assert {d: node.pending_bytes(d) for d in node.drive_ids} == dict.fromkeys(node.drive_ids, 0)


def test_node_urgent_now_refused_leaves_free_space_accounting_unchanged(node):
    # Queue a piece of group 9 on its drive; it stays queued (long linger).
    drive_id, queued = node.submit(90, 0, b"q" * 4096, group=9)
    before_free = node.estimated_free_bytes(drive_id)
    before_stats = node.stats()
    before_pending = {d: node.pending_bytes(d) for d in node.drive_ids}

    assert node_write_now(node, 91, 0, b"n" * 100_000, group=9) is None
    assert node.estimated_free_bytes(drive_id) == before_free
    assert {d: node.pending_bytes(d) for d in node.drive_ids} == before_pending
    assert node.stats().free_bytes == before_stats.free_bytes
    assert node.stats().live_bytes == before_stats.live_bytes
    assert not node.contains(91)

    with pytest.raises(SliceOrderError):
        node_write_now(node, 92, 5, b"bad", group=4)
    assert {d: node.pending_bytes(d) for d in node.drive_ids} == before_pending

    node.flush([drive_id])
    assert queued.result(timeout=30) is None
    # The refused slice is written by a later submit on the drive it was placed on.
    assert node.write(91, 0, b"n" * 100_000, group=9) == drive_id
    assert node.read(91, 0, 200_000) == b"n" * 100_000
