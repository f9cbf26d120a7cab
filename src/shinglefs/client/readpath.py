"""The read path of open files: map windows, the shared extent cache, read-ahead.

A read first commits this client's uncommitted writes of the range (the
file's :class:`~shinglefs.client.writer.FileWriter`), then resolves the
range to slice pieces through the inode's map window
(:class:`~shinglefs.client.inodes.MapCache`, refetched from meta when it
does not cover the range) and assembles the bytes from the
:class:`~shinglefs.client.reader.ExtentCache`. A handle that reads
sequentially starts background reads up to ``readahead_bytes`` ahead: as far
as its share of the read cache allows while other streams read ahead too
(:class:`~shinglefs.client.readahead.StreamWindows`), topped up in steps of
half that window, in runs of consecutive extents per pool job.

Never holds a lock across I/O; a slice that vanished under a mapped window
(compaction or truncate by another client) costs one refetch of the map.
"""

from __future__ import annotations

from shinglefs.client.config import ClientConfig
from shinglefs.client.handles import FileHandle
from shinglefs.client.inodes import InodeTable, cut
from shinglefs.client.readahead import StreamWindows
from shinglefs.client.reader import ExtentCache, assemble, prefetch_pieces
from shinglefs.meta.api import MetaStore, ReadPiece
from shinglefs.meta.errors import FsError
from shinglefs.server.errors import SliceMissing
from shinglefs.server.node import Declined

__all__ = ["ReadPath"]


class ReadPath:
    """Reads through the handles of one client (thread-safe)."""

    def __init__(
        self, meta: MetaStore, cache: ExtentCache, inodes: InodeTable, config: ClientConfig
    ) -> None:
        self.meta = meta
        self.cache = cache
        self.inodes = inodes
        self.maps = inodes.maps
        self.config = config
        self.streams = StreamWindows(
            readahead=config.readahead_bytes, extent=config.read_extent,
            cache_bytes=cache.capacity, io_threads=config.io_threads,
        )

    def read(self, h: FileHandle, offset: int, size: int, *,
             wait: bool = True) -> bytes | memoryview:
        """Up to ``size`` bytes at ``offset`` (short only at EOF; holes read as
        zeros): a view of the read cache when the range lies in one cached
        extent (no copy).

        ``wait=False``: only if it needs no drive: every byte in the extent
        cache, or in meta (an inline slice); the range's map may be asked of
        meta (a caller with networked metadata does not ask this). Else raises
        ``Declined`` having done nothing but note the access (and perhaps
        fetch the map)."""
        if size <= 0:
            return b""
        if not wait:
            return self._read_at_once(h, offset, size)
        state = self.inodes.get(h.ino)
        if state is not None and state.writer.overlaps(offset, size):
            with state.writer.lock:
                if state.writer.overlaps(offset, size):
                    state.writer.flush()
        sequential = h.read_state.observe(offset, size)
        for attempt in (0, 1):
            pieces = (None if attempt else self._declined_map(h, offset, size)) \
                or self._map(h.ino, offset, size)
            try:
                data = assemble(pieces, self.cache, offset, size)
                break
            except SliceMissing:
                # Compaction or truncate elsewhere replaced the slices we had mapped.
                if attempt:
                    raise
                self.maps.invalidate(h.ino)
        if sequential and len(data) == size:  # short: at the end, nothing to read ahead
            self._readahead(h, offset + len(data))
        return data

    def forget(self, fh: int) -> None:
        """The handle ``fh`` is released: its stream no longer shares the read cache."""
        self.streams.forget(fh)

    def _read_at_once(self, h: FileHandle, offset: int, size: int) -> bytes | memoryview:
        """``read(wait=False)``."""
        state = self.inodes.get(h.ino)
        if state is not None and state.writer.overlaps(offset, size):
            raise Declined("the range has uncommitted writes")
        pieces = self.maps.cached(h.ino, offset, offset + size)
        if pieces is None:
            # The first read of a file: its map from meta. A small file's bytes
            # come with it (inline slices): served here, no thread, no drive.
            gen = self.maps.generation(h.ino)
            pieces = self._map(h.ino, offset, size)
            h.read_state.declined_map = (offset, size, gen, pieces)
        data = self._peek(pieces)
        if data is None:
            raise Declined("the range's bytes are not cached")
        h.read_state.declined_map = None
        if h.read_state.observe(offset, size) and len(data) == size:
            self._readahead(h, offset + len(data))
        return data

    def _peek(self, pieces: list[ReadPiece]) -> bytes | memoryview | None:
        """The bytes of ``pieces`` if all are in the cache (one piece: no copy)."""
        sid = pieces[0].slice_id if len(pieces) == 1 else None
        if sid is not None:
            p = pieces[0]
            data = p.inline if p.inline is not None else self.cache.peek(
                sid, p.slice_offset, p.length)
            if data is None or len(data) != p.length:
                return None
            return data
        out = bytearray()
        for p in pieces:
            part = (bytes(p.length) if p.slice_id is None
                    else p.inline if p.inline is not None
                    else self.cache.peek(p.slice_id, p.slice_offset, p.length))
            if part is None or len(part) != p.length:
                return None
            out += part
        return bytes(out)

    def _declined_map(self, h: FileHandle, offset: int, size: int) -> list[ReadPiece] | None:
        """The map ``_read_at_once`` fetched for this very read, if nothing of the
        inode changed here since (its map generation); used once."""
        kept, h.read_state.declined_map = h.read_state.declined_map, None
        if kept is None or kept[:2] != (offset, size) or kept[2] != self.maps.generation(h.ino):
            return None
        return kept[3]

    def _map(self, ino: int, offset: int, length: int) -> list[ReadPiece]:
        end = offset + length
        pieces = self.maps.cached(ino, offset, end)
        if pieces is not None:
            return pieces
        gen = self.maps.generation(ino)
        fetch = max(length, self.config.readahead_bytes)
        pieces = self.meta.read_map(ino, offset, fetch)
        covered = offset + sum(p.length for p in pieces)
        # A window that ends at EOF could grow: keep only full ones; and none
        # holding inline bytes (the map cache bounds windows, not their bytes).
        if covered >= offset + fetch and not any(p.inline for p in pieces):
            self.maps.remember(ino, gen, offset, covered, pieces)
        return cut(pieces, offset, end)

    def _readahead(self, h: FileHandle, position: int) -> None:
        """Top up ``h``'s read-ahead when its reader at ``position`` has eaten a
        step of its window (StreamWindows), within what the read-ahead budget
        has left: all read-ahead not read yet stays within ``StreamWindows.budget``
        (streams that started before the others were counted would take more
        than their share), except the minimum window, which every stream gets.
        Errors of meta only skip it."""
        window = self.streams.window(h.fh)
        target = position + window.bytes
        state = h.read_state
        if state.prefetched_until >= target - window.step:
            return
        start = max(position, state.prefetched_until)
        room = self.streams.budget - self.cache.unread_bytes
        target = min(target, max(start + room, position + self.streams.minimum))
        if target <= start:
            return
        try:
            # Not through the map cache: its window stays on the read cursor.
            pieces = self.meta.read_map(h.ino, start, target - start)
        except FsError:
            return
        prefetch_pieces(pieces, self.cache, run=window.run, ahead=start - position)
        state.prefetched_until = target
