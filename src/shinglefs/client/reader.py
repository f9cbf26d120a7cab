"""The read path: resolved pieces -> bytes, through a shared cache of slice extents.

Slices are immutable, so a byte range of a slice can be cached under its
slice id forever (until evicted): :class:`ExtentCache` keeps *extents*
(``read_extent``-sized, aligned ranges of one slice) as futures. A reader that
needs an extent another reader is already fetching waits on the same future,
so concurrent readers of a file never read the same bytes from a drive twice;
readahead inserts futures that background threads fill.

Holes (``ReadPiece.slice_id is None``) read as zeros and touch no drive.

Sequential detection is per handle (:class:`ReadState`): a read starting where
the previous one ended extends a streak; from the second sequential read on,
the next ``readahead_bytes`` of the file are fetched in the background.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from shinglefs.client.errors import ShortSlice
from shinglefs.meta.api import ReadPiece

log = logging.getLogger(__name__)

ReadSlice = Callable[[int, int, int], bytes | memoryview]
"""``read_slice(slice_id, offset, length)`` -> read-only bytes (short at the slice's end)."""


@dataclass(slots=True)
class ReadState:
    """Per-handle access pattern: where the last read ended and how far we read ahead."""

    last_end: int = -1
    streak: int = 0
    prefetched_until: int = 0

    def observe(self, offset: int, size: int) -> bool:
        """Record a read; True when the handle reads sequentially."""
        if offset == self.last_end or (offset == 0 and self.last_end == -1):
            self.streak += 1
        else:
            self.streak = 0
            self.prefetched_until = 0
        self.last_end = offset + size
        return self.streak >= 1


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
        self._bytes = 0
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
            future.set_exception(exc)
            return
        with self._lock:
            self.drive_reads += 1
            self.drive_bytes += len(data)
            if self._entries.get(key) is future:
                self._bytes += len(data)
                self._evict_locked()
        future.set_result(data)

    def _evict_locked(self) -> None:
        while self._bytes > self.capacity and len(self._entries) > 1:
            key, future = next(iter(self._entries.items()))
            if not future.done():
                # Oldest is still in flight: it will be accounted when done; stop here.
                break
            del self._entries[key]
            if future.exception() is None:
                self._bytes -= len(future.result())

    def _get_or_start(self, key: tuple[int, int], background: bool) -> Future[bytes | memoryview]:
        with self._lock:
            future = self._entries.get(key)
            if future is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return future
            future = Future()
            future.set_running_or_notify_cancel()
            self._entries[key] = future
        if background:
            self._pool.submit(self._fetch, key, future)
        else:
            self._fetch(key, future)
        return future

    def read(self, slice_id: int, offset: int, length: int) -> bytes | memoryview:
        """``length`` bytes of a slice from ``offset`` through the cache (short at its
        end); a view of the cached extent when the range lies in one (no copy)."""
        end = offset + length
        index = offset // self.extent
        if (end - 1) // self.extent == index:  # the common case: one extent, one copy
            data = self._get_or_start((slice_id, index), background=False).result()
            start = offset - index * self.extent
            return data[start : start + length]
        out = bytearray()
        pos = offset
        while pos < end:
            index = pos // self.extent
            data = self._get_or_start((slice_id, index), background=False).result()
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
                data = future.result()
                parts.append(data)
                if len(data) < self.extent:
                    break  # the slice ends inside this extent
            self.hits += len(parts)
        start = offset - first * self.extent
        if len(parts) == 1:
            return memoryview(parts[0])[start : start + length]
        return memoryview(b"".join(parts))[start : start + length]

    def prefetch(self, slice_id: int, offset: int, length: int) -> None:
        """Start background reads of the extents covering a slice range; first
        ``hint(slice_id, offset, length)`` the drive of the extents not yet
        cached, so it reads them as one stream while the readers queue up."""
        first = offset // self.extent
        last = (offset + length - 1) // self.extent
        if self._hint is not None:
            with self._lock:
                missing = [i for i in range(first, last + 1) if (slice_id, i) not in self._entries]
            if missing:
                start = missing[0] * self.extent
                self._hint(slice_id, start, (missing[-1] + 1) * self.extent - start)
        for index in range(first, last + 1):
            self._get_or_start((slice_id, index), background=True)

    def drop_slice(self, slice_id: int) -> None:
        """Forget a slice's extents (it was deleted; its id is never reused anyway)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == slice_id]:
                future = self._entries.pop(key)
                if future.done() and future.exception() is None:
                    self._bytes -= len(future.result())

    @property
    def cached_bytes(self) -> int:
        return self._bytes


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
    if piece.slice_id is None:
        return bytes(piece.length)
    data = cache.read(piece.slice_id, piece.slice_offset, piece.length)
    if len(data) != piece.length:
        raise ShortSlice(piece.slice_id, piece.slice_offset, piece.length, len(data))
    return data


def prefetch_pieces(pieces: Iterable[ReadPiece], cache: ExtentCache) -> int:
    """Start background reads for the slice parts of ``pieces``; returns bytes requested."""
    requested = 0
    for piece in pieces:
        if piece.slice_id is not None and piece.length > 0:
            cache.prefetch(piece.slice_id, piece.slice_offset, piece.length)
            requested += piece.length
    return requested
