"""``write(wait=False)`` / ``flush(wait=False)`` / ``read_buffer(wait=False)`` (here
``try_write`` / ``try_flush`` / ``try_read``): a buffered write, a small file's close or
a read of cached bytes completed in the calling thread, or ``Declined`` with nothing
done that a later ``write`` / ``flush`` / ``read`` would not redo.

Everything runs on a real VFS (SQLite file, emulated SMR drive on a sparse file).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import threading
from collections.abc import Callable

import pytest
from fsfixtures import FsFactory, MiB, create, pattern, read_all, write_file
from tests.support.polling import wait_until

from shinglefs.client.config import ClientConfig
from shinglefs.client.errors import NotOpenForReading, NotOpenForWriting
from shinglefs.client.filesystem import open_filesystem, recorded_drives
from shinglefs.client.vfs import VFS, Declined
from shinglefs.client.writer import OpenSlice
from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_CTX, ROOT_INO
from shinglefs.server.node import StorageNode
from shinglefs.store import SliceStore, StoreIOError
from shinglefs.zoned import ZoneCondition, open_drive

KiB = 1024
# No background compaction scan during a test: it would make the drive's
# writer busy at a moment the test does not choose.
# Small files here go to a drive, not inline into meta: these tests are about
# the drive's fast path (test_inline_files.py covers inline files).
QUIET = ClientConfig(compaction_scan_interval=0, inline_max_bytes=0)


def try_write(vfs: VFS, fh: int, offset: int, data: bytes | memoryview) -> int | None:
    """``vfs.write(wait=False)``: the bytes written, or None when it declined."""
    try:
        return vfs.write(fh, offset, data, wait=False)
    except Declined:
        return None


def try_flush(vfs: VFS, fh: int) -> bool:
    """``vfs.flush(wait=False)``: whether it flushed (False: it declined)."""
    try:
        vfs.flush(fh, wait=False)
    except Declined:
        return False
    return True


def fast_flush(vfs: VFS, fh: int) -> None:
    """``try_flush`` until it completes. It may rightly decline while the drive is
    momentarily busy (its GC thread holds it), having changed nothing: retry."""
    wait_until(lambda: try_flush(vfs, fh), "try_flush completes on an idle drive")


def committed(vfs: VFS, ino: int) -> tuple[int, list[int | None]]:
    """What meta holds for the file: its size and the slices of its first chunk."""
    size = vfs.meta.getattr(ino).size
    refs = [r.slice_id for r in vfs.meta.get_chunk(ino, 0).refs]
    return size, refs


def power_cut(vfs: VFS) -> None:
    drives = [vfs.node.store(d).drive for d in vfs.node.drive_ids]
    vfs.abandon()  # buffered bytes are dropped, nothing is flushed
    for drive in drives:
        drive.simulate_power_cut()  # type: ignore[attr-defined]


class DriveWriterBusy:
    """Make drive 0's writer thread busy (it holds the store's busy token while it
    waits for ``io_lock``, which the test holds) until ``release``."""

    ORPHAN = 1 << 60  # a slice id meta never hands out

    def __init__(self, vfs: VFS) -> None:
        self.node = vfs.node
        self.store = vfs.node.store(0)
        self.lock = self.store.slice_log.io_lock  # type: ignore[attr-defined]
        self.lock.acquire()
        try:
            _drive, self.future = self.node.submit(self.ORPHAN, 0, b"o" * 4096, 999_999,
                                                   drive_id=0)
            wait_until(lambda: self.store.scheduler.queued_bytes == 0,  # type: ignore[attr-defined]
                       "the writer took the piece")
        except BaseException:
            self.lock.release()
            raise

    def release(self) -> None:
        self.lock.release()
        self.future.result(timeout=30)
        self.node.delete(self.ORPHAN, 0)


def vfs_with_stores(fs_factory: FsFactory, config: ClientConfig, **store_config: object) -> VFS:
    """A VFS on the factory's file system whose slice stores take ``store_config``
    (``open_filesystem`` opens them with the defaults)."""
    fs_factory.format()
    meta = open_meta(fs_factory.meta_url)
    stores = {i: SliceStore.open(open_drive(spec), **store_config)
              for i, spec in enumerate(recorded_drives(meta))}
    node = StorageNode(stores, drives=[s.drive for s in stores.values()])  # closed with it
    vfs = VFS(meta, node, config)  # type: ignore[arg-type]
    fs_factory.opened.append(vfs)
    return vfs


class InThread:
    """A call run in a thread, so that a test can bound a call that must not wait
    (and still unblock it and clean up when it does)."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.result: list[object] = []
        self.error: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(call,))
        self.thread.start()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            self.result.append(call())
        except BaseException as exc:  # reported to the test thread
            self.error.append(exc)

    def returned_within(self, limit: float = 5.0) -> bool:
        """A bound for a call that must not wait, not a timing claim."""
        self.thread.join(limit)
        return not self.thread.is_alive()

    def join(self) -> None:
        self.thread.join(30)


def try_write_while_the_drive_is_held(
    vfs: VFS, fh: int, offset: int, data: bytes, *, waited_for: str,
    prepare: Callable[[], object] | None = None,
) -> list[object]:
    """Hold drive 0's writer, run ``prepare()``, then ``try_write`` in a
    thread: the test fails if it waited (for ``waited_for``) or raised.
    Returns its result list (``[None]``: declined, ``[n]``: written)."""
    call: InThread | None = None
    busy = DriveWriterBusy(vfs)
    try:
        if prepare is not None:
            prepare()
        call = InThread(lambda: try_write(vfs, fh, offset, data))
        returned = call.returned_within()
    finally:
        busy.release()
        if call is not None:
            call.join()
    assert returned, f"try_write waited for {waited_for}"
    assert call is not None and not call.error, call.error if call else None
    return call.result


# ---------------------------------------------------------------- try_write
def test_sequential_small_writes_are_buffered_and_read_back_after_try_flush(
    fs_factory: FsFactory,
) -> None:
    vfs = fs_factory.vfs(QUIET)
    fh, ino = create(vfs, b"small")
    parts = [pattern(i, 1000 + i) for i in range(5)]
    offset = 0
    for part in parts:
        assert try_write(vfs, fh, offset, part) == len(part)
        offset += len(part)
    assert vfs.getattr(ino).size == offset  # the buffered size is visible
    assert committed(vfs, ino) == (0, [])  # nothing stored or committed yet
    assert vfs.stats()["buffered_bytes"] == offset

    fast_flush(vfs, fh)
    size, refs = committed(vfs, ino)
    assert size == offset and len(refs) == 1 and refs[0] is not None
    assert vfs.stats()["buffered_bytes"] == 0
    assert read_all(vfs, ino) == b"".join(parts)  # another handle sees it

    # Appending after the fast close starts a new slice, closed the same way.
    assert try_write(vfs, fh, offset, b"more") == 4
    fast_flush(vfs, fh)
    assert committed(vfs, ino)[0] == offset + 4
    vfs.release(fh)
    assert read_all(vfs, ino) == b"".join(parts) + b"more"


def test_try_write_does_what_write_does_or_nothing_at_all(fs_factory: FsFactory) -> None:
    """Two files get the same writes: one through ``try_write`` (falling back to
    ``write`` on None), one through ``write``. A refusal must leave the first
    file exactly as it was; in the end both hold the same bytes.

    The writes cover what ``write`` may have to do beyond buffering: go back
    (overlay), skip ahead (a hole), cross a chunk, end one at its edge, fill a
    piece. Whether ``try_write`` takes those at once is the writer's choice;
    a sequential append that stays in the pending buffer it must take."""
    piece = 64 * KiB
    vfs = fs_factory.vfs(dataclasses.replace(QUIET, piece_size=piece), chunk_size=MiB)
    fh_fast, fast = create(vfs, b"fast")
    fh_slow, slow = create(vfs, b"slow")
    writer = vfs.inodes.writer(fast)
    model = bytearray()
    writes = [
        (0, 3000, True),  # a new slice's first bytes
        (3000, 1000, True),  # a sequential append below a piece
        (10, 7, False),  # back into the open slice
        (4000, 5000, False),  # sequential again (a new slice after an overlay, maybe)
        (20_000, 100, False),  # past the end: a hole
        (20_100, piece, False),  # fills a piece
        (MiB - 30, 20, False),  # a new slice 10 bytes before the chunk edge
        (MiB - 10, 20, False),  # a sequential append across the chunk edge
        (MiB + 10, 50, False),  # sequential in the next chunk
        (2 * MiB - 100, 100, False),  # ends exactly at a chunk edge
        (2 * MiB, 10, False),  # the next chunk's first bytes
    ]
    taken = []
    for i, (offset, n, must_take) in enumerate(writes):
        data = pattern(200 + i, n)
        s = writer.open_slice
        before = (vfs.getattr(fast).size, s, s and s.length, s and len(s.pending))
        got = try_write(vfs, fh_fast, offset, data)
        if got is None:
            assert not must_take, f"write {i} at {offset} was refused"
            s = writer.open_slice
            after = (vfs.getattr(fast).size, s, s and s.length, s and len(s.pending))
            assert after == before, f"write {i}: the refusal changed the buffer"
            got = vfs.write(fh_fast, offset, data)
        else:
            taken.append(i)
        assert got == n
        assert vfs.write(fh_slow, offset, data) == n
        if len(model) < offset:
            model += bytes(offset - len(model))
        model[offset : offset + n] = data
        assert vfs.getattr(fast).size == vfs.getattr(slow).size == len(model), f"after write {i}"
        s = writer.open_slice
        if s is not None:  # a full piece is never held back; a slice never crosses a chunk
            assert len(s.pending) < piece, f"after write {i}: {len(s.pending)} bytes pending"
            assert s.start // MiB == (s.end - 1) // MiB, f"after write {i}: {s.start}..{s.end}"
    assert 0 in taken and 1 in taken
    vfs.flush(fh_fast)
    vfs.flush(fh_slow)
    assert read_all(vfs, fast) == read_all(vfs, slow) == bytes(model)
    vfs.release(fh_fast)
    vfs.release(fh_slow)
    again_fast, again_slow = read_all(vfs, fast), read_all(vfs, slow)
    assert again_fast == again_slow == bytes(model)


def test_try_write_on_append_and_read_only_handles(vfs: VFS) -> None:
    fh, ino = create(vfs, b"f")
    vfs.write(fh, 0, b"base")
    vfs.release(fh)

    appender = vfs.open(ino, os.O_WRONLY | os.O_APPEND, ROOT_CTX)
    assert try_write(vfs, appender, 0, b"tail") is None  # the end is a metadata question
    assert vfs.getattr(ino).size == 4
    assert vfs.write(appender, 0, b"tail") == 4
    vfs.release(appender)
    assert read_all(vfs, ino) == b"basetail"

    reader = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
    with pytest.raises(NotOpenForWriting) as info:
        try_write(vfs, reader, 0, b"no")
    assert info.value.errno == errno.EBADF
    assert try_flush(vfs, reader) is True  # nothing to do for a reader
    vfs.release(reader)
    assert read_all(vfs, ino) == b"basetail"


def test_try_write_returns_none_when_the_write_budget_is_exhausted(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(dataclasses.replace(QUIET, total_buffer_bytes=64 * KiB))
    fh_a, ino_a = create(vfs, b"a")
    fh_b, ino_b = create(vfs, b"b")
    a = pattern(3, 60 * KiB)
    assert try_write(vfs, fh_a, 0, a) == len(a)
    assert try_write(vfs, fh_b, 0, b"b" * (8 * KiB)) is None  # 68 KiB > 64 KiB
    assert vfs.stats()["buffered_bytes"] == len(a)
    assert vfs.getattr(ino_b).size == 0
    assert try_write(vfs, fh_b, 0, b"b" * (4 * KiB)) == 4 * KiB  # 64 KiB fits exactly
    # write() waits for budget (spilling the idle writer's bytes) instead.
    assert vfs.write(fh_b, 4 * KiB, b"c" * (8 * KiB)) == 8 * KiB
    vfs.release(fh_a)
    vfs.release(fh_b)
    assert vfs.stats()["buffered_bytes"] == 0
    assert read_all(vfs, ino_a) == a
    assert read_all(vfs, ino_b) == b"b" * (4 * KiB) + b"c" * (8 * KiB)


def test_try_write_declines_an_append_past_the_per_file_bound_while_pieces_are_in_flight(
    fs_factory: FsFactory,
) -> None:
    piece = 64 * KiB
    vfs = fs_factory.vfs(dataclasses.replace(QUIET, piece_size=piece,
                                             file_buffer_bytes=2 * piece))
    fh, ino = create(vfs, b"f")
    data = pattern(9, 3 * piece)
    seen: dict[str, object] = {}

    def one_piece_in_flight_half_a_piece_pending() -> None:  # pieces stay in flight
        assert vfs.write(fh, 0, data[:piece]) == piece  # one piece submitted
        assert try_write(vfs, fh, piece, data[piece : piece + piece // 2]) == piece // 2
        s = vfs.inodes.writer(ino).open_slice
        assert s is not None
        seen["slice"], seen["before"] = s, (s.length, len(s.pending))

    # 64 KiB in flight + 32 KiB pending + 40 KiB > the 128 KiB bound: write would wait.
    tail = data[piece + piece // 2 :][: 40 * KiB]
    result = try_write_while_the_drive_is_held(
        vfs, fh, piece + piece // 2, tail, waited_for="pieces stuck on the drive",
        prepare=one_piece_in_flight_half_a_piece_pending)
    assert result == [None]
    s = seen["slice"]
    assert isinstance(s, OpenSlice)
    assert (s.length, len(s.pending)) == seen["before"]
    assert vfs.getattr(ino).size == piece + piece // 2
    assert vfs.write(fh, piece + piece // 2, data[piece + piece // 2 :]) == piece + piece // 2
    vfs.release(fh)
    assert read_all(vfs, ino) == data


def test_try_write_never_waits_for_the_drive_even_for_a_write_past_the_per_file_bound(
    fs_factory: FsFactory,
) -> None:
    """A write that starts a slice and is larger than ``file_buffer_bytes``: write()
    would wait for its own first pieces; try_write must decline (or not wait)."""
    piece = 64 * KiB
    vfs = fs_factory.vfs(dataclasses.replace(QUIET, piece_size=piece,
                                             file_buffer_bytes=2 * piece))
    fh, ino = create(vfs, b"f")
    data = pattern(10, 8 * piece)
    result = try_write_while_the_drive_is_held(vfs, fh, 0, data,
                                               waited_for="pieces stuck on the drive")
    if result == [None]:
        assert vfs.write(fh, 0, data) == len(data)
    else:
        assert result == [len(data)]
    vfs.release(fh)
    assert read_all(vfs, ino) == data


def fill_the_drive_queue(vfs: VFS, fh: int, piece: int, pieces: int) -> None:
    """With the drive's writer held, queue ``pieces`` pieces of the file (no wait:
    the queue takes exactly that much)."""
    for i in range(pieces):
        assert vfs.write(fh, i * piece, pattern(300 + i, piece)) == piece
    assert vfs.node.store(0).scheduler.queued_bytes == pieces * piece  # type: ignore[attr-defined]


def test_try_write_declines_a_piece_when_its_drive_queue_is_full(fs_factory: FsFactory) -> None:
    piece = 64 * KiB
    vfs = vfs_with_stores(fs_factory, dataclasses.replace(QUIET, piece_size=piece),
                          max_queue_bytes=4 * piece, gc_background=False)
    fh, ino = create(vfs, b"a")
    # The next piece of this slice needs room in the full queue: write would wait.
    result = try_write_while_the_drive_is_held(
        vfs, fh, 4 * piece, pattern(304, piece), waited_for="room in the drive's queue",
        prepare=lambda: fill_the_drive_queue(vfs, fh, piece, 4))
    assert result == [None]
    assert vfs.getattr(ino).size == 4 * piece
    vfs.write(fh, 4 * piece, pattern(304, piece))
    vfs.release(fh)
    assert read_all(vfs, ino) == b"".join(pattern(300 + i, piece) for i in range(5))


@pytest.mark.parametrize("case", ["first piece of a new slice", "a seek ends a small slice"])
def test_try_write_does_not_wait_for_queue_room_for_a_slice_without_a_drive(
    fs_factory: FsFactory, case: str
) -> None:
    piece = 64 * KiB
    vfs = vfs_with_stores(fs_factory, dataclasses.replace(QUIET, piece_size=piece),
                          max_queue_bytes=4 * piece, gc_background=False)
    fh_a, _ = create(vfs, b"a")
    fh_b, b = create(vfs, b"b")
    model = bytearray()
    if case == "a seek ends a small slice":
        model += pattern(401, 1000)
        assert try_write(vfs, fh_b, 0, bytes(model)) == 1000  # pending, no drive yet
        offset, data = 0, b"header"
    else:
        offset, data = 0, pattern(400, piece)
    result = try_write_while_the_drive_is_held(
        vfs, fh_b, offset, data, waited_for="room in the drive's queue",
        prepare=lambda: fill_the_drive_queue(vfs, fh_a, piece, 4))
    if result == [None]:
        vfs.write(fh_b, offset, data)
    model[offset : offset + len(data)] = data
    vfs.release(fh_a)
    vfs.release(fh_b)
    assert read_all(vfs, b) == bytes(model)


def test_try_write_and_try_flush_do_nothing_while_another_thread_holds_the_file(
    fs_factory: FsFactory,
) -> None:
    vfs = fs_factory.vfs(QUIET)
    fh, ino = create(vfs, b"f")
    assert try_write(vfs, fh, 0, b"first") == 5
    writer = vfs.inodes.writer(ino)
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with writer.lock:
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        assert try_write(vfs, fh, 5, b"second") is None
        assert try_flush(vfs, fh) is False
        assert vfs.getattr(ino).size == 5
        assert committed(vfs, ino) == (0, [])
    finally:
        done.set()
        holder.join(30)
    assert try_write(vfs, fh, 5, b"second") == 6
    fast_flush(vfs, fh)
    assert read_all(vfs, ino) == b"firstsecond"
    vfs.release(fh)


# ---------------------------------------------------------------- try_flush
def test_try_flush_commits_bytes_that_a_fresh_client_reads_after_a_crash(
    fs_factory: FsFactory,
) -> None:
    vfs = fs_factory.vfs(QUIET)
    fh, ino = create(vfs, b"ckpt.json")
    data = pattern(4, 20_000)
    assert try_write(vfs, fh, 0, data) == len(data)
    fast_flush(vfs, fh)
    assert committed(vfs, ino)[0] == len(data)
    power_cut(vfs)  # no fsync: the ordered commit flushed the drive before meta

    again = open_filesystem(fs_factory.meta_url)
    fs_factory.opened.append(again)
    assert again.getattr(ino).size == len(data)
    assert read_all(again, ino) == data


def test_try_flush_with_nothing_buffered_returns_true(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(QUIET)
    fh, ino = create(vfs, b"empty")
    assert try_flush(vfs, fh) is True
    vfs.write(fh, 0, b"x")
    vfs.flush(fh)
    assert try_flush(vfs, fh) is True  # flushed already: nothing buffered
    vfs.release(fh)
    assert read_all(vfs, ino) == b"x"


def test_try_flush_stores_durably_before_it_commits(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(QUIET)
    fh, ino = create(vfs, b"durable")
    assert try_write(vfs, fh, 0, b"must be flushed") == 15
    assert try_flush(vfs, fh) is True
    assert committed(vfs, ino)[0] == 15
    power_cut(vfs)  # the drive loses every unflushed byte
    again = open_filesystem(fs_factory.meta_url)
    fs_factory.opened.append(again)
    assert read_all(again, ino) == b"must be flushed"


def test_try_flush_declines_a_file_that_already_streamed_a_piece(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(QUIET)
    fh, ino = create(vfs, b"large")
    data = pattern(5, 5 * MiB)
    vfs.write(fh, 0, data)  # one 4 MiB piece submitted, 1 MiB pending
    s = vfs.inodes.writer(ino).open_slice
    assert s is not None and s.submitted == 4 * MiB
    # Once the piece is stored the drive's writer is idle: only the rule declines.
    wait_until(lambda: vfs.node.length(s.slice_id) == 4 * MiB, "the first piece is stored")
    wait_until(lambda: vfs.node.store(0).scheduler.pending_length(s.slice_id) is None,
               "the piece is settled")
    assert try_flush(vfs, fh) is False
    assert committed(vfs, ino)[0] == 0
    vfs.flush(fh)
    assert committed(vfs, ino)[0] == len(data)
    vfs.release(fh)
    assert read_all(vfs, ino) == data


def test_try_flush_declines_while_the_drive_writer_is_busy_and_flush_redoes_it(
    fs_factory: FsFactory,
) -> None:
    vfs = fs_factory.vfs(QUIET)
    fh, ino = create(vfs, b"f")
    data = pattern(6, 10_000)
    assert try_write(vfs, fh, 0, data) == len(data)
    busy = DriveWriterBusy(vfs)
    try:
        assert try_flush(vfs, fh) is False
        assert committed(vfs, ino) == (0, [])
        assert vfs.stats()["buffered_bytes"] == len(data)
        assert vfs.getattr(ino).size == len(data)
    finally:
        busy.release()
    vfs.flush(fh)
    assert committed(vfs, ino)[0] == len(data)
    assert vfs.stats()["buffered_bytes"] == 0
    vfs.release(fh)
    assert read_all(vfs, ino) == data


@pytest.mark.parametrize("close", ["try_flush", "flush"])
def test_a_failing_drive_in_the_close_raises_the_typed_error_and_the_file_stays_usable(
    fs_factory: FsFactory, close: str
) -> None:
    vfs = fs_factory.vfs(QUIET)
    d = vfs.mkdir(ROOT_INO, b"dir", 0o755, ROOT_CTX)
    fh, first = create(vfs, b"first", d.ino)
    assert try_write(vfs, fh, 0, b"first file") == 10
    fast_flush(vfs, fh)
    vfs.release(fh)
    # Fail the zone that holds the directory's small files (their group).
    store = vfs.node.store(0)
    (slice_id,) = committed(vfs, first)[1]
    dev = store.slice_log.index.extents(slice_id)[0][2]  # type: ignore[attr-defined]
    zone = dev // store.drive.zone_size  # type: ignore[attr-defined]
    store.drive.fail_zone(zone, ZoneCondition.READ_ONLY)  # type: ignore[attr-defined]

    fh, ino = create(vfs, b"second", d.ino)
    data = pattern(7, 3000)
    assert try_write(vfs, fh, 0, data) == len(data)
    lost = vfs.inodes.writer(ino).open_slice.slice_id  # type: ignore[union-attr]
    with pytest.raises(StoreIOError) as info:
        if close == "flush":
            vfs.flush(fh)
        else:
            fast_flush(vfs, fh)  # raises once the drive takes the bytes
    assert info.value.errno == errno.EIO and info.value.zone == zone
    # Nothing half-committed: meta has no slice, the drive keeps none, no bytes held.
    assert committed(vfs, ino) == (0, [])
    assert not vfs.node.contains(lost)
    assert vfs.stats()["buffered_bytes"] == 0
    assert try_flush(vfs, fh) is True  # the error was reported once
    # The file is usable: a rewrite lands in a fresh zone and reads back.
    again = pattern(8, 3000)
    assert vfs.write(fh, 0, again) == len(again)
    vfs.flush(fh)
    vfs.release(fh)
    assert read_all(vfs, ino) == again
    assert read_all(vfs, first) == b"first file"  # a READ_ONLY zone still reads


def test_three_hundred_small_files_close_on_the_fast_path(fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(QUIET)
    d = vfs.mkdir(ROOT_INO, b"shards", 0o755, ROOT_CTX)
    files: dict[int, bytes] = {}
    fast_writes = fast_closes = 0
    for i in range(300):
        data = pattern(100 + i, 1 + (i * 997) % 20_000)
        fh, ino = create(vfs, f"s{i:04d}.json".encode(), d.ino)
        half = len(data) // 2
        for off, part in ((0, data[:half]), (half, data[half:])):
            n = try_write(vfs, fh, off, part) if part else 0
            if n is None:
                n = vfs.write(fh, off, part)
            else:
                fast_writes += 1 if part else 0
            assert n == len(part)
        if try_flush(vfs, fh):
            fast_closes += 1
        else:
            vfs.flush(fh)
        vfs.release(fh)
        files[ino] = data
    # Single-threaded with no background drive flush, the drive's writer is idle
    # at every close: only a momentary pass of its GC thread may stand in the way.
    assert fast_closes >= 270, fast_closes
    assert fast_writes == sum(1 for data in files.values() for part in
                              (data[: len(data) // 2], data[len(data) // 2 :]) if part)
    for ino, data in files.items():
        assert vfs.getattr(ino).size == len(data)
        assert read_all(vfs, ino) == data
    vfs.shutdown()
    again = open_filesystem(fs_factory.meta_url)
    fs_factory.opened.append(again)
    for ino, data in files.items():
        assert read_all(again, ino) == data


# ---------------------------------------------------------------- try_read
def try_read(vfs: VFS, fh: int, offset: int, size: int) -> bytes | None:
    """``vfs.read_buffer(wait=False)``: the bytes, or None when it declined."""
    try:
        return bytes(vfs.read_buffer(fh, offset, size, wait=False))
    except Declined:
        return None


def test_try_read_declines_until_a_read_cached_the_range_then_serves_it(
    fs_factory: FsFactory,
) -> None:
    # A map window is kept only when the file goes on past it: a file larger than one.
    vfs = fs_factory.vfs(dataclasses.replace(QUIET, readahead_bytes=8 * MiB))
    data = pattern(31, 9 * MiB)
    fh, ino = create(vfs, b"cached")
    assert vfs.write(fh, 0, data) == len(data)
    # Bytes still in the writer's buffer are the metadata's question first.
    assert try_read(vfs, fh, 0, 1000) is None
    vfs.flush(fh)
    vfs.release(fh)
    reader = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
    assert try_read(vfs, reader, 0, 4096) is None  # no map window, nothing cached
    assert vfs.read(reader, 0, 4096) == data[:4096]  # maps the window, caches the extent
    assert try_read(vfs, reader, 4096, 8192) == data[4096:12288]
    assert try_read(vfs, reader, 0, 0) == b""
    vfs.release(reader)
    writer = vfs.open(ino, os.O_WRONLY, ROOT_CTX)
    with pytest.raises(NotOpenForReading):  # errors as read's, not a decline
        try_read(vfs, writer, 0, 10)
    vfs.release(writer)


def test_try_read_serves_a_small_file_kept_in_meta(fs_factory: FsFactory) -> None:
    """An inline file's bytes come with its map: the first read needs no thread
    and no drive."""
    vfs = fs_factory.vfs(dataclasses.replace(QUIET, inline_max_bytes=4096))
    data = pattern(32, 4096)
    ino = write_file(vfs, b"tiny", data)
    before = vfs.cache.drive_reads
    reader = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
    assert try_read(vfs, reader, 0, 128 * 1024) == data
    assert try_read(vfs, reader, 4096, 4096) == b""
    assert vfs.cache.drive_reads == before
    vfs.release(reader)


def test_a_declined_read_uses_its_map_once_and_never_a_stale_one(
        fs_factory: FsFactory) -> None:
    """The map fetched by a declined attempt serves that read's retry, unless
    the file changed here since: then the retry asks meta again."""
    vfs = fs_factory.vfs(QUIET)
    data = pattern(33, 256 * 1024)
    ino = write_file(vfs, b"on-drive", data)
    reader = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
    assert try_read(vfs, reader, 0, 64 * 1024) is None  # mapped, bytes on a drive
    assert vfs.read(reader, 0, 64 * 1024) == data[: 64 * 1024]
    vfs.release(reader)

    other = write_file(vfs, b"on-drive-2", pattern(35, 256 * 1024))
    reader = vfs.open(other, os.O_RDONLY, ROOT_CTX)
    assert try_read(vfs, reader, 0, 64 * 1024) is None
    writer = vfs.open(other, os.O_WRONLY, ROOT_CTX)
    fresh = pattern(34, 64 * 1024)
    assert vfs.write(writer, 0, fresh) == len(fresh)
    vfs.flush(writer)  # a new slice: the map the attempt fetched is stale
    assert vfs.read(reader, 0, 64 * 1024) == fresh
    vfs.release(writer)
    vfs.release(reader)
