"""The read-ahead scheduler: windows that share the read cache between streams
(client/readahead.py) and the extent cache's queued runs (client/reader.py):
runs read in order, nearest first, claimed by a reader that needs one, and
read-ahead not read yet evicted last."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fsfixtures import FsFactory, MiB, pattern, write_file

from shinglefs.client.config import ClientConfig
from shinglefs.client.readahead import IDLE_S, MIN_EXTENTS, SHARE, StreamWindows
from shinglefs.client.reader import ExtentCache
from shinglefs.meta.api import ROOT_CTX
from shinglefs.server.errors import SliceMissing

EXTENT = 64 * 1024


class Slices:
    """Slices held in memory; records every read that reaches it, in order."""

    def __init__(self, slices: dict[int, bytes]) -> None:
        self.slices = slices
        self.reads: list[tuple[int, int]] = []  # (slice id, extent index)
        self.lock = threading.Lock()

    def read(self, slice_id: int, offset: int, length: int) -> bytes:
        with self.lock:
            self.reads.append((slice_id, offset // EXTENT))
        return self.slices[slice_id][offset : offset + length]


@pytest.fixture
def one_thread() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(1)
    yield pool
    pool.shutdown(wait=True)


def blocked(pool: ThreadPoolExecutor) -> threading.Event:
    """Occupy the pool's only thread until the returned event is set."""
    release = threading.Event()
    started = threading.Event()

    def hold() -> None:
        started.set()
        release.wait(30)

    pool.submit(hold)
    assert started.wait(30)
    return release


def drain(pool: ThreadPoolExecutor) -> None:
    pool.submit(lambda: None).result(timeout=30)


# ---------------------------------------------------------------- stream windows


def test_one_stream_reads_ahead_as_configured() -> None:
    windows = StreamWindows(readahead=64 * MiB, extent=4 * MiB, cache_bytes=256 * MiB,
                            io_threads=8)
    w = windows.window(1)
    assert (w.bytes, w.step, w.run) == (64 * MiB, 32 * MiB, 1)


def test_streams_share_the_read_cache() -> None:
    windows = StreamWindows(readahead=64 * MiB, extent=4 * MiB, cache_bytes=256 * MiB,
                            io_threads=8)
    for stream in range(8):
        w = windows.window(stream)
    assert windows.active() == 8
    assert 8 * w.bytes <= SHARE * 256 * MiB
    assert w.bytes == 24 * MiB and w.step == 12 * MiB
    assert w.run == 3  # one thread a stream: its whole step in one run
    # Many more streams than the cache holds: never below the minimum window.
    assert windows.window_for(1000).bytes == MIN_EXTENTS * 4 * MiB


def test_an_idle_stream_no_longer_takes_a_share() -> None:
    now = [0.0]
    windows = StreamWindows(readahead=64 * MiB, extent=4 * MiB, cache_bytes=64 * MiB,
                            io_threads=8, clock=lambda: now[0])
    windows.window(1)
    assert windows.window(2).bytes == 24 * MiB  # 48 MiB over two streams
    now[0] += IDLE_S + 0.1
    assert windows.window(2).bytes == 48 * MiB
    windows.forget(2)
    assert windows.active() == 0


def test_a_stream_seen_again_outlives_the_ones_seen_since_its_first_read() -> None:
    now = [0.0]
    windows = StreamWindows(readahead=64 * MiB, extent=4 * MiB, cache_bytes=64 * MiB,
                            io_threads=8, clock=lambda: now[0])
    windows.window(1)
    now[0] += 0.6
    windows.window(2)
    windows.window(1)  # 1 read ahead again: now the newest
    now[0] += 0.6  # 2 is 0.6 s idle, 1 too: both count
    assert windows.active() == 2
    now[0] += 0.5  # both past IDLE_S now, 2 first in the order kept
    windows.window(3)
    assert windows.active() == 1


def test_small_files_read_one_after_another_leave_no_streams_behind(
        fs_factory: FsFactory) -> None:
    """A DataLoader over many small files: each handle's stream goes at its
    release, so a big file read meanwhile keeps its whole window, however many
    small files were opened within IDLE_S."""
    vfs = fs_factory.vfs(ClientConfig(read_extent=MiB, readahead_bytes=16 * MiB,
                                      read_cache_bytes=64 * MiB))
    small = [write_file(vfs, f"img{i}".encode(), pattern(60 + i, 128 * 1024 + i))
             for i in range(50)]
    for i, ino in enumerate(small):
        fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
        assert vfs.read(fh, 0, 256 * 1024) == pattern(60 + i, 128 * 1024 + i)
        vfs.release(fh)
    assert vfs.reads.streams.active() == 0
    big = write_file(vfs, b"shard", pattern(70, 32 * MiB))
    fh = vfs.open(big, os.O_RDONLY, ROOT_CTX)
    vfs.read(fh, 0, 256 * 1024)
    assert vfs.reads.streams.active() == 1
    assert vfs.reads.streams.window(fh).bytes == 16 * MiB  # alone: as configured
    vfs.release(fh)


# ---------------------------------------------------------------- the extent cache


def test_runs_are_read_in_order_each_extent_once(one_thread: ThreadPoolExecutor) -> None:
    data = pattern(1, 8 * EXTENT)
    drive = Slices({7: data})
    cache = ExtentCache(drive.read, extent=EXTENT, capacity=MiB, pool=one_thread)
    release = blocked(one_thread)
    cache.prefetch(7, 0, 8 * EXTENT, run=4)
    release.set()
    drain(one_thread)
    drain(one_thread)
    assert drive.reads == [(7, i) for i in range(8)]
    assert cache.read(7, 0, len(data)) == data
    assert cache.drive_reads == 8


def test_nearest_run_is_read_first(one_thread: ThreadPoolExecutor) -> None:
    drive = Slices({1: pattern(2, 4 * EXTENT), 2: pattern(3, 4 * EXTENT)})
    cache = ExtentCache(drive.read, extent=EXTENT, capacity=MiB, pool=one_thread)
    release = blocked(one_thread)
    cache.prefetch(1, 0, 2 * EXTENT, run=2, ahead=32 * MiB)  # far ahead of its reader
    cache.prefetch(2, 0, 2 * EXTENT, run=2, ahead=0)  # its reader is about to need it
    release.set()
    drain(one_thread)
    drain(one_thread)
    assert drive.reads == [(2, 0), (2, 1), (1, 0), (1, 1)]


def test_a_reader_claims_queued_read_ahead_instead_of_waiting(
        one_thread: ThreadPoolExecutor) -> None:
    data = pattern(4, 4 * EXTENT)
    drive = Slices({5: data})
    cache = ExtentCache(drive.read, extent=EXTENT, capacity=MiB, pool=one_thread)
    release = blocked(one_thread)
    cache.prefetch(5, 0, 4 * EXTENT, run=4)
    # The pool is busy: the reader reads extent 2 itself rather than wait for it.
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(bytes(cache.read(5, 2 * EXTENT, EXTENT))))
    reader.start()
    reader.join(timeout=10)
    done = not reader.is_alive()
    release.set()
    reader.join()
    assert done, "the reader waited for the busy pool"
    assert got == [data[2 * EXTENT : 3 * EXTENT]]
    assert drive.reads[0] == (5, 2)
    drain(one_thread)
    # The run skipped the claimed extent: every extent came off the drive once.
    assert sorted(drive.reads) == [(5, i) for i in range(4)]
    assert cache.read(5, 0, len(data)) == data


def test_read_ahead_not_read_yet_is_evicted_last(one_thread: ThreadPoolExecutor) -> None:
    drive = Slices({1: pattern(5, 4 * EXTENT), 2: pattern(6, 8 * EXTENT)})
    entry = EXTENT + 8192  # an extent's bytes plus its bookkeeping, roughly
    cache = ExtentCache(drive.read, extent=EXTENT, capacity=6 * entry, pool=one_thread)
    cache.prefetch(1, 0, 4 * EXTENT)  # read ahead, nobody has read it yet
    drain(one_thread)
    for i in range(8):  # another stream reads more than the rest of the cache
        cache.read(2, i * EXTENT, EXTENT)
    assert cache.cached_bytes <= cache.capacity
    for i in range(4):  # all still there: slice 2's extents went first
        future = cache.extent_read(1, i)
        assert future is not None and future.done()
    assert cache.extent_read(2, 0) is None


def test_the_bound_holds_when_read_ahead_alone_exceeds_it(
        one_thread: ThreadPoolExecutor) -> None:
    drive = Slices({1: pattern(7, 16 * EXTENT)})
    cache = ExtentCache(drive.read, extent=EXTENT, capacity=4 * EXTENT, pool=one_thread)
    cache.prefetch(1, 0, 16 * EXTENT, run=4)
    drain(one_thread)
    drain(one_thread)
    assert cache.cached_bytes <= cache.capacity
    assert cache.drive_reads == 16


def test_dropping_a_slice_fails_its_queued_read_ahead(one_thread: ThreadPoolExecutor) -> None:
    drive = Slices({3: pattern(8, 2 * EXTENT)})
    cache = ExtentCache(drive.read, extent=EXTENT, capacity=MiB, pool=one_thread)
    release = blocked(one_thread)
    cache.prefetch(3, 0, 2 * EXTENT)
    queued = cache.extent_read(3, 0)
    assert queued is not None
    cache.drop_slice(3)
    with pytest.raises(SliceMissing):
        queued.result(timeout=30)
    release.set()
    drain(one_thread)
    assert drive.reads == [] and len(cache) == 0


# ---------------------------------------------------------------- through the VFS


def test_eight_streams_through_a_small_cache_read_bit_exact(fs_factory: FsFactory) -> None:
    """More read-ahead asked for than the cache holds: windows shrink, runs are
    claimed and evicted under the readers, and every byte still reads back."""
    vfs = fs_factory.vfs(ClientConfig(read_extent=MiB, readahead_bytes=16 * MiB,
                                      read_cache_bytes=8 * MiB, io_threads=4))
    files = [pattern(40 + i, 12 * MiB + 4096 * i) for i in range(8)]
    inos = [write_file(vfs, f"s{i}".encode(), data) for i, data in enumerate(files)]
    results: dict[int, bytes] = {}
    errors: list[BaseException] = []
    gate = threading.Barrier(len(files))

    def reader(i: int) -> None:
        try:
            fh = vfs.open(inos[i], os.O_RDONLY, ROOT_CTX)
            gate.wait()
            out = bytearray()
            while chunk := vfs.read(fh, len(out), 256 * 1024):
                out += chunk
            vfs.release(fh)
            results[i] = bytes(out)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(len(files))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, data in enumerate(files):
        assert results[i] == data, f"file {i} read back wrong"
    assert vfs.cache.cached_bytes <= vfs.cache.capacity


def test_a_stream_starting_late_reads_ahead_only_what_the_budget_leaves(
        fs_factory: FsFactory) -> None:
    vfs = fs_factory.vfs(ClientConfig(read_extent=MiB, readahead_bytes=16 * MiB,
                                      read_cache_bytes=8 * MiB))
    first = write_file(vfs, b"first", pattern(50, 16 * MiB))
    late = write_file(vfs, b"late", pattern(51, 16 * MiB))
    fh = vfs.open(first, os.O_RDONLY, ROOT_CTX)
    vfs.read(fh, 0, 256 * 1024)  # alone: its window is the whole budget (6 MiB)
    slice_first = vfs.meta.get_chunk(first, 0).refs[0].slice_id
    assert vfs.cache.extent_read(slice_first, 6) is not None
    assert vfs.cache.unread_bytes == vfs.reads.streams.budget
    fh2 = vfs.open(late, os.O_RDONLY, ROOT_CTX)
    vfs.read(fh2, 0, 256 * 1024)  # its share would be 3 MiB; the budget is spent
    slice_late = vfs.meta.get_chunk(late, 0).refs[0].slice_id
    assert vfs.cache.extent_read(slice_late, 2) is not None  # the minimum window
    assert vfs.cache.extent_read(slice_late, 3) is None
    vfs.release(fh)
    vfs.release(fh2)
