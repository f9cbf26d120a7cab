"""The read path: resolved pieces -> bytes, through a shared cache of slice extents.

Slices are immutable, so a byte range of a slice can be cached under its
slice id forever (until evicted): :class:`ExtentCache` keeps *extents*
(``read_extent``-sized, aligned ranges of one slice) as futures. A reader that
needs an extent another reader is already fetching waits on the same future,
so concurrent readers of a file never read the same bytes from a drive twice;
readahead inserts futures that background threads fill.

Holes (``ReadPiece.slice_id is None``) read as zeros and touch no drive;
inline slices (``ReadPiece.inline``) come with their bytes from meta.

Sequential detection is per handle (:class:`ReadState`): a read starting where
the previous one ended extends a streak; from the second sequential read on,
the next ``readahead_bytes`` of the file are fetched in the background.

Read-ahead is served in runs: ``prefetch`` queues one job per run of ``run``
consecutive extents of a slice, which one thread reads in order, so a drive
serving many sequential readers sees each stream in runs rather than one
extent of each in turn. Queued runs are taken nearest first: by how far
ahead of its reader a run starts (``ahead``), then in the order queued, so a
stream that just started or fell behind is served before others' far
read-ahead, and streams at the same distance take turns. An extent queued for read-ahead but not yet
started is *claimed* by the first reader that needs it, which reads it in its
own thread: a reader never waits for the pool to get through other streams'
read-ahead first. Read-ahead that no reader has read yet is evicted last
(after every extent already read), so many streams reading ahead at once do
not push out each other's next extents before they are read.

Memory: the cache counts what an entry really keeps alive (:func:`held_bytes`:
the whole buffer behind a view, plus the entry's own bookkeeping), never just
the length of the bytes it serves, and evicts down to its capacity. A read
result that would pin a much larger buffer than it serves (a view of a short
tail) is copied out first. Extents still being read are not counted; there
are at most as many as threads reading (``io_threads`` plus the callers'), a
fixed overhead of ``read_extent`` each.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from shinglefs.client.errors import ShortSlice
from shinglefs.meta.api import ReadPiece
from shinglefs.server.errors import SliceMissing

log = logging.getLogger(__name__)

ReadSlice = Callable[[int, int, int], bytes | memoryview]
"""``read_slice(slice_id, offset, length)`` -> read-only bytes (short at the slice's end)."""

# Bookkeeping of one cached extent besides its bytes: the Future (with its
# Condition and lock), the key tuple, the OrderedDict slot and the view object.
# Measured with tracemalloc on CPython 3.11: ~2,100 bytes; rounded up.
ENTRY_OVERHEAD = 2048
# A read result is copied out when the buffer it pins is larger than this many
# times its length (a 4 KiB tail of a 4 MiB buffer pins 1,024 times more).
PINNED_RATIO = 2


def held_bytes(data: bytes | bytearray | memoryview) -> int:
    """The memory ``data`` keeps alive: a view keeps its whole base buffer, so
    that is what counts, not the view's length (bytes objects: their size)."""
    if isinstance(data, memoryview):
        base = data.obj
        if isinstance(base, bytes | bytearray):
            return sys.getsizeof(base) + sys.getsizeof(data)
        return (memoryview(base).nbytes if base is not None else data.nbytes) + sys.getsizeof(data)
    return sys.getsizeof(data)


def unpinned(data: bytes | memoryview) -> bytes | memoryview:
    """``data``, or a copy of it when it pins a base buffer more than
    ``PINNED_RATIO`` times its length (so the big buffer can be freed)."""
    if isinstance(data, memoryview) and held_bytes(data) > PINNED_RATIO * max(data.nbytes, 4096):
        return data.tobytes()
    return data


def on_heap(data: bytes | memoryview) -> bool:
    """Was ``data``'s memory malloc'd (bytes, bytearray), not mapped (mmap)?"""
    base = data.obj if isinstance(data, memoryview) else data
    return isinstance(base, bytes | bytearray)


# glibc keeps freed heap memory resident when other allocations sit around it
# (small extents are freed in LRU order, between SQLite pages and Python
# objects); malloc_trim(0) hands every free page back to the kernel.
TRIM_AFTER_BYTES = 32 * 1024 * 1024
try:
    _malloc_trim: Callable[[int], int] | None = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):  # not glibc
    _malloc_trim = None


def return_free_heap() -> None:
    """Give the process's free heap pages back to the kernel (glibc; elsewhere a no-op)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


@dataclass(slots=True)
class ReadState:
    """Per-handle access pattern: where the last read ended and how far we read ahead."""

    last_end: int = -1
    streak: int = 0
    prefetched_until: int = 0
    # The map an inline attempt fetched for a read it then declined (a range
    # on a drive): (offset, size, map generation, pieces), for that read's
    # retry in a thread, so the map is asked of meta once.
    declined_map: tuple[int, int, int, list[ReadPiece]] | None = None

    def observe(self, offset: int, size: int) -> bool:
        """Record a read; True when the handle reads sequentially."""
        if offset == self.last_end or (offset == 0 and self.last_end == -1):
            self.streak += 1
        else:
            self.streak = 0
            self.prefetched_until = 0
        self.last_end = offset + size
        return self.streak >= 1


_Queued = tuple[tuple[int, int], Future[bytes | memoryview]]  # (key, its future)


class ExtentCache:
    """A bounded LRU of slice extents, shared by every handle of a client.

    ``read_slice`` does the drive read; ``pool`` runs prefetches. Counters
    ``drive_reads``/``drive_bytes`` count reads that reached the node.
    """

    def __init__(
        self, read_slice: ReadSlice, *, extent: int, capacity: int, pool: ThreadPoolExecutor,
        hint: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self._read_slice = read_slice
        self._hint = hint
        self.extent = extent
        self.capacity = capacity
        self._pool = pool
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, int], Future[bytes | memoryview]] = OrderedDict()
        self._queued: set[tuple[int, int]] = set()  # read-ahead not started (claimable)
        self._unread: set[tuple[int, int]] = set()  # read-ahead no reader has read yet
        self._runs: list[tuple[int, int, list[_Queued]]] = []  # heap: (ahead, seq, run)
        self._seq = itertools.count()
        self._bytes = 0
        self._heap_freed = 0  # bytes of malloc'd extents evicted since the last heap trim
        self.drive_reads = 0
        self.drive_bytes = 0
        self.hits = 0

    def _fetch(self, key: tuple[int, int], future: Future[bytes | memoryview]) -> None:
        slice_id, index = key
        try:
            data = self._read_slice(slice_id, index * self.extent, self.extent)
        except BaseException as exc:
            with self._lock:
                if self._entries.get(key) is future:
                    del self._entries[key]
                    self._unread.discard(key)
            future.set_exception(exc)
            return
        data = unpinned(data)
        with self._lock:
            self.drive_reads += 1
            self.drive_bytes += len(data)
            if self._entries.get(key) is future:
                self._bytes += held_bytes(data) + ENTRY_OVERHEAD
            # Done before eviction runs, so that this entry counts as evictable.
            future.set_result(data)
            self._heap_freed += self._evict_locked()
            trim = self._heap_freed >= TRIM_AFTER_BYTES
            if trim:
                self._heap_freed = 0
        if trim:
            return_free_heap()

    def _evict_locked(self) -> int:
        """Drop finished extents until the cache holds at most ``capacity``: the
        least recently used of those already read first, then read-ahead not
        read yet (extents in flight are skipped, not waited for; the newest
        entry stays)."""
        excess = self._bytes - self.capacity
        if excess <= 0:
            return 0
        victims: list[tuple[int, int]] = []
        for spare_unread in (True, False):
            for key, future in self._entries.items():
                if excess <= 0 or len(victims) + 1 >= len(self._entries):
                    break
                if future.done() and (key not in self._unread) is spare_unread:
                    victims.append(key)
                    excess -= self._entry_bytes(future)
        heap = 0
        for key in victims:
            future = self._entries.pop(key)
            self._unread.discard(key)
            self._bytes -= self._entry_bytes(future)
            if future.exception() is None and on_heap(future.result()):
                heap += self._entry_bytes(future)
        return heap

    @staticmethod
    def _entry_bytes(future: Future[bytes | memoryview]) -> int:
        """What a finished entry was counted as (failed reads are never kept)."""
        if future.exception() is not None:
            return 0
        return held_bytes(future.result()) + ENTRY_OVERHEAD

    def _get_or_start(self, key: tuple[int, int]) -> Future[bytes | memoryview]:
        """A reader's extent: the cached or in-flight read, or one it does itself
        now (a new extent, or read-ahead still queued, which it claims)."""
        with self._lock:
            future = self._entries.get(key)
            if future is not None:
                self._entries.move_to_end(key)
                self._unread.discard(key)
                if key not in self._queued:
                    self.hits += 1
                    return future
                self._queued.discard(key)  # claimed: the pool's job skips it
            else:
                future = Future()
                future.set_running_or_notify_cancel()
                self._entries[key] = future
        self._fetch(key, future)
        return future

    def _next_run(self) -> None:
        """A pool job: read the nearest queued run (one job is submitted per run)."""
        with self._lock:
            _, _, run = heapq.heappop(self._runs)
        self._fetch_run(run)

    def _fetch_run(self, run: list[_Queued]) -> None:
        """Read a run of queued extents in order, skipping those a
        reader claimed meanwhile. First ``hint`` the drive of the whole run, so
        it reads the run as one stream while this thread verifies extent by
        extent (in the pool: a hint may block while the drive's queue is full,
        and the caller of ``prefetch`` may be the file system's event loop)."""
        if self._hint is not None:
            (slice_id, first), (_, last) = run[0][0], run[-1][0]
            self._hint(slice_id, first * self.extent, (last + 1 - first) * self.extent)
        for key, future in run:
            with self._lock:
                if key not in self._queued:
                    continue
                self._queued.discard(key)
            self._fetch(key, future)

    def read(self, slice_id: int, offset: int, length: int) -> bytes | memoryview:
        """``length`` bytes of a slice from ``offset`` through the cache (short at its
        end); a view of the cached extent when the range lies in one (no copy)."""
        end = offset + length
        index = offset // self.extent
        if (end - 1) // self.extent == index:  # the common case: one extent, one copy
            data = self._get_or_start((slice_id, index)).result()
            start = offset - index * self.extent
            return data[start : start + length]
        out = bytearray()
        pos = offset
        while pos < end:
            index = pos // self.extent
            data = self._get_or_start((slice_id, index)).result()
            start = pos - index * self.extent
            take = data[start : start + (end - pos)]
            if not take:
                break
            out += take
            pos += len(take)
            if len(data) < self.extent:
                break  # the slice ends inside this extent
        return bytes(out)

    def peek(self, slice_id: int, offset: int, length: int) -> memoryview | None:
        """The bytes of a slice range if its extents are cached and read, else None.

        Never reads a drive or waits. A range inside one extent comes back as
        a view of the cached bytes (no copy); one spanning extents is copied.
        Short at the slice's end, like ``read``.
        """
        end = offset + length
        first = offset // self.extent
        last = (end - 1) // self.extent
        parts: list[bytes | memoryview] = []
        with self._lock:
            for index in range(first, last + 1):
                future = self._entries.get((slice_id, index))
                if future is None or not future.done() or future.exception() is not None:
                    return None
                self._entries.move_to_end((slice_id, index))
                self._unread.discard((slice_id, index))
                data = future.result()
                parts.append(data)
                if len(data) < self.extent:
                    break  # the slice ends inside this extent
            self.hits += len(parts)
        start = offset - first * self.extent
        if len(parts) == 1:
            return memoryview(parts[0])[start : start + length]
        return memoryview(b"".join(parts))[start : start + length]

    def prefetch(self, slice_id: int, offset: int, length: int, *, run: int = 1,
                 ahead: int = 0) -> None:
        """Queue background reads of the extents covering a slice range that the
        cache holds neither read nor in flight, as jobs of ``run`` consecutive
        extents each (read in order by one thread, which first
        ``hint(slice_id, offset, length)``s the drive of its run). ``ahead``:
        how far ahead of its reader the range starts (nearer runs are read
        first; a run's later ones count from its own start). Returns at once."""
        first = offset // self.extent
        last = (offset + length - 1) // self.extent
        queued: list[_Queued] = []
        with self._lock:
            for index in range(first, last + 1):
                key = (slice_id, index)
                if key in self._entries:
                    continue
                future: Future[bytes | memoryview] = Future()
                future.set_running_or_notify_cancel()
                self._entries[key] = future
                self._queued.add(key)
                self._unread.add(key)
                queued.append((key, future))
        step = max(1, run)
        runs = [queued[i : i + step] for i in range(0, len(queued), step)]
        with self._lock:
            for part in runs:
                start = part[0][0][1] * self.extent
                heapq.heappush(self._runs, (max(0, ahead + start - offset), next(self._seq), part))
        for _ in runs:
            self._pool.submit(self._next_run)

    def drop_slice(self, slice_id: int) -> None:
        """Forget a slice's extents (it was deleted; its id is never reused anyway)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == slice_id]:
                future = self._entries.pop(key)
                self._unread.discard(key)
                if key in self._queued:  # never read: its job skips it
                    self._queued.discard(key)
                    future.set_exception(SliceMissing(slice_id, None))
                    continue
                if future.done():
                    self._bytes -= self._entry_bytes(future)

    def extent_read(self, slice_id: int, index: int) -> Future[bytes | memoryview] | None:
        """The read of extent ``index`` of a slice (done or in flight) if the cache
        holds it, else None. Neither reads nor counts a hit (tests: what
        read-ahead started)."""
        with self._lock:
            return self._entries.get((slice_id, index))

    @property
    def unread_bytes(self) -> int:
        """Read-ahead queued, in flight or cached that no reader has read yet
        (whole extents; a slice's short last extent counts whole)."""
        with self._lock:
            return len(self._unread) * self.extent

    @property
    def cached_bytes(self) -> int:
        """The memory the finished extents hold (``held_bytes`` plus bookkeeping)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


class SliceReader(Protocol):
    def read(self, slice_id: int, offset: int, length: int) -> bytes | memoryview: ...


class DirectReader:
    """Reads slices straight from the node, bypassing the cache (compaction)."""

    def __init__(self, read_slice: ReadSlice) -> None:
        self._read_slice = read_slice

    def read(self, slice_id: int, offset: int, length: int) -> bytes | memoryview:
        return self._read_slice(slice_id, offset, length)


def assemble(pieces: Iterable[ReadPiece], cache: SliceReader, offset: int,
             size: int) -> bytes | memoryview:
    """The bytes of ``[offset, offset + size)`` from resolved pieces (holes as zeros).

    ``pieces`` must cover the range contiguously from ``offset`` (as
    ``MetaStore.read_map`` returns them); the result is short only at EOF.
    """
    pieces = list(pieces)
    if len(pieces) == 1 and pieces[0].file_offset == offset:
        data = _piece_bytes(pieces[0], cache)  # the common case: no assembly copy
        return data[:size] if len(data) > size else data
    out = bytearray()
    for piece in pieces:
        if piece.file_offset != offset + len(out):
            raise ValueError(f"read map not contiguous at {offset + len(out)}: {piece}")
        out += _piece_bytes(piece, cache)
    return bytes(out[:size])


def _piece_bytes(piece: ReadPiece, cache: SliceReader) -> bytes | memoryview:
    if piece.inline is not None:
        return piece.inline  # an inline slice: meta handed over its bytes
    if piece.slice_id is None:
        return bytes(piece.length)
    data = cache.read(piece.slice_id, piece.slice_offset, piece.length)
    if len(data) != piece.length:
        raise ShortSlice(piece.slice_id, piece.slice_offset, piece.length, len(data))
    return data


def prefetch_pieces(pieces: Iterable[ReadPiece], cache: ExtentCache, *, run: int = 1,
                    ahead: int = 0) -> int:
    """Start background reads for the slice parts of ``pieces`` in runs of ``run``
    extents (``ExtentCache.prefetch``), the first piece ``ahead`` bytes ahead of
    its reader; returns bytes requested."""
    requested = 0
    for piece in pieces:
        if piece.slice_id is not None and piece.inline is None and piece.length > 0:
            cache.prefetch(piece.slice_id, piece.slice_offset, piece.length, run=run,
                           ahead=ahead + requested)
            requested += piece.length
    return requested
