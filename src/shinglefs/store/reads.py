"""The read path of one slice log: index lookups, verified reads, read-ahead, the header cache.

``LogReads`` sits between ``LogZones`` (zones.py) and ``SliceLog`` (log.py).
Readers take only the index lock (``_cv``), and only to look up extents and
register on their zones (so no zone is reset under them); the I/O runs
unlocked. Every byte returned was verified against its record's block crc;
wrong bytes are never returned. The index queries other classes need (the GC,
the slice store) are here too, each taking the index lock itself.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Sequence

import numpy as np

from shinglefs.store.errors import ChecksumMismatch, SliceNotFound, StoreIOError
from shinglefs.store.index import Extent
from shinglefs.store.record import (
    BLOCK,
    CRC_BLOCK,
    HEADER_BLOCK,
    RecordDecodeError,
    RecordHeader,
    RecordType,
    align_up,
    decode_header,
    record_footprint,
    verify_blocks,
)
from shinglefs.store.zones import LogZones
from shinglefs.zoned.errors import ZoneError


class LogReads(LogZones):
    """Reads and index queries of a slice log (see the module docstring)."""

    # ================================================================= reading
    def contains(self, sid: int) -> bool:
        with self._cv:
            return self.index.contains(sid)

    def length(self, sid: int) -> int:
        with self._cv:
            n = self.index.length(sid)
        if n is None:
            raise SliceNotFound(sid, drive=self.name)
        return n

    def highest_slice_id(self) -> int:
        with self._cv:
            return self.index.highest_id()

    def slice_ids(self) -> Iterator[int]:
        with self._cv:
            ids = list(self.index.slice_ids())
        return iter(ids)

    def _scratch(self, n: int) -> memoryview:
        buf = getattr(self._tls, "buf", None)
        if buf is None or len(buf) < n:
            # page-aligned, so that a drive may read into it around the page cache
            buf = mmap.mmap(-1, max(n, CRC_BLOCK + HEADER_BLOCK))
            self._tls.buf = buf
        return memoryview(buf)[:n]

    def readinto(self, sid: int, offset: int, dest: memoryview) -> int:
        """Fill ``dest`` from the slice at ``offset``; returns bytes read (short at the end).

        Every byte returned was verified against its record's block crc.
        Raises SliceNotFound, ChecksumMismatch (``dest`` is then zeroed) or
        StoreIOError.
        """
        with self._cv:
            extents = self.index.extents(sid)
            if not extents:
                raise SliceNotFound(sid, drive=self.name)
            end = extents[-1][0] + extents[-1][1]
            n = max(0, min(dest.nbytes, end - offset))
            chosen = [e for e in extents if e[0] < offset + n and e[0] + e[1] > offset]
            zones = [e[2] // self.zs for e in chosen]
            for z in zones:
                self._readers[z] += 1
        try:
            for e_off, e_len, dev in chosen:
                a = max(offset, e_off) - e_off
                b = min(offset + n, e_off + e_len) - e_off
                self._read_extent(sid, e_off, e_len, dev, a, b,
                                  dest[a + e_off - offset : b + e_off - offset])
        except ChecksumMismatch:
            dest[:n] = bytes(n)
            raise
        finally:
            with self._cv:
                for z in zones:
                    self._readers[z] -= 1
                self._cv.notify_all()
        return n

    def prefetch(self, sid: int, offset: int, length: int) -> None:
        """Hint the drive that ``[offset, offset + length)`` of a slice is read
        soon (the records' spans; ``drive.prefetch``, e.g. ``WILLNEED``).
        Returns at once; an unknown slice or a drive without hints is ignored."""
        if not self.read_hints or length <= 0:
            return
        with self._cv:
            extents = self.index.extents(sid) or []
        end = offset + length
        for e_off, e_len, dev in extents:
            a = max(offset, e_off) - e_off
            b = min(end, e_off + e_len) - e_off
            if a < b:
                lo = a // BLOCK * BLOCK  # whole blocks; the header block with the first
                self.drive.prefetch(dev + (0 if lo == 0 else HEADER_BLOCK + lo),
                                    align_up(b) - lo + (HEADER_BLOCK if lo == 0 else 0))

    def _cached_header(self, dev: int) -> RecordHeader | None:
        with self._cv:
            header = self._headers.get(dev)
            if header is not None:
                self._headers.move_to_end(dev)
        return header

    def _checked_header(self, sid: int, e_off: int, e_len: int, dev: int,
                        header: RecordHeader | None, block: memoryview | None) -> RecordHeader:
        """``header`` (cached) or the one decoded from ``block``, checked against the index."""
        if header is None:
            assert block is not None
            try:
                header = decode_header(block)
            except RecordDecodeError as exc:
                raise ChecksumMismatch(drive=self.name, zone=dev // self.zs, offset=dev,
                                       detail=f"record header: {exc}", slice_id=sid) from None
            with self._cv:
                self._headers[dev] = header
                if len(self._headers) > self.config.header_cache:
                    self._headers.popitem(last=False)
        if (header.type != RecordType.DATA or header.slice_id != sid
                or header.slice_offset != e_off or header.length != e_len):
            with self._cv:
                self._headers.pop(dev, None)
            raise ChecksumMismatch(drive=self.name, zone=dev // self.zs, offset=dev,
                                   detail="record header does not match the index", slice_id=sid)
        return header

    def _header(self, sid: int, e_off: int, e_len: int, dev: int) -> RecordHeader:
        header = self._cached_header(dev)
        block = None
        if header is None:
            block = self._scratch(HEADER_BLOCK)
            self.read_raw(dev, block)
        return self._checked_header(sid, e_off, e_len, dev, header, block)

    def read_raw(self, pos: int, view: memoryview) -> None:
        """Fill ``view`` from device offset ``pos``, unverified (recovery verifies what it scans).

        Raises ``StoreIOError``.
        """
        try:
            self.drive.readinto(pos, view)
        except ZoneError as exc:
            raise StoreIOError(f"read failed: {exc}", drive=self.name, zone=pos // self.zs,
                               offset=pos, cause=exc) from exc

    def read_raw_v(self, pos: int, views: list[memoryview]) -> None:
        """Read ``views`` back to back from ``pos``: one vectored read where the drive has one."""
        if not self.vectored_reads:
            for view in views:
                self.read_raw(pos, view)
                pos += view.nbytes
            return
        try:
            self.drive.readv(pos, views)
        except ZoneError as exc:
            raise StoreIOError(f"read failed: {exc}", drive=self.name, zone=pos // self.zs,
                               offset=pos, cause=exc) from exc

    def _read_extent(self, sid: int, e_off: int, e_len: int, dev: int, a: int, b: int,
                     dest: memoryview) -> None:
        """Payload bytes ``[a, b)`` of the record at ``dev`` into ``dest``, verified.

        The whole crc blocks of the range go straight into ``dest`` in one
        read and are verified with one crc call per 256 KiB block. A range that
        starts at the payload's start reads the header block in the same
        (vectored) read: no separate 4 KiB read when the header is not cached,
        and one contiguous request per record either way, so a sequential scan
        of records reaches the drive as sequential reads. The partial crc
        blocks at the range's edges go through a scratch buffer.
        """
        header = self._cached_header(dev)
        payload = dev + HEADER_BLOCK
        first_full = -(-a // CRC_BLOCK)
        last_full = b // CRC_BLOCK
        if b == e_len and e_len % BLOCK == 0:
            last_full = -(-b // CRC_BLOCK)  # the record's short last block reads in place too
        if first_full < last_full:
            lo = first_full * CRC_BLOCK
            hi = min(last_full * CRC_BLOCK, e_len)
            view = dest[lo - a : hi - a]
            if lo == 0:
                # Header block and payload in one read, even when the header is cached:
                # the drive then sees one contiguous request per record, as a raw read would.
                block = self._scratch(HEADER_BLOCK)
                self.read_raw_v(dev, [block, view])
                header = self._checked_header(sid, e_off, e_len, dev, header, block)
            else:
                header = self._header(sid, e_off, e_len, dev)
                self.read_raw(payload + lo, view)
            if hi == e_len:
                self._read_ahead(dev, lo, e_len)
            bad = verify_blocks(header, view, first_full)
            if bad is not None:
                raise ChecksumMismatch(drive=self.name, zone=dev // self.zs,
                                       offset=payload + bad, detail="payload block crc",
                                       slice_id=sid)
            edges = []
            if a < lo:
                edges.append((a, lo))
            if hi < b:
                edges.append((hi, b))
        else:
            edges = [(a, b)]
        if not edges:
            return
        if header is None:
            header = self._header(sid, e_off, e_len, dev)
        for x, y in edges:
            blk = x // CRC_BLOCK
            while x < y:
                lo = blk * CRC_BLOCK
                hi = min(lo + CRC_BLOCK, e_len)
                scratch = self._scratch(align_up(hi - lo))
                self.read_raw(payload + lo, scratch)
                if verify_blocks(header, scratch[: hi - lo], blk) is not None:
                    raise ChecksumMismatch(drive=self.name, zone=dev // self.zs,
                                           offset=payload + lo, detail="payload block crc",
                                           slice_id=sid)
                take_hi = min(y, hi)
                dest[x - a : take_hi - a] = scratch[x - lo : take_hi - lo]
                x = take_hi
                blk += 1

    def _read_ahead(self, dev: int, lo: int, e_len: int) -> None:
        """Sequential scans: hint the drive to fetch the next record while this one is verified.

        A thread whose read runs to the end of a record, and whose previous
        read ended exactly where this record starts, is scanning the log in
        order (slices written one after another, read back one after
        another). For it, the next record's span (assumed as long as this one,
        never past the zone's write pointer) is prefetched before this
        record's crcs are computed, so the disk works while the CPU verifies.
        Random reads never trigger it.
        """
        end = dev + record_footprint(e_len)
        if self.read_hints and lo == 0 and getattr(self._tls, "seq_end", -1) == dev:
            z = dev // self.zs
            n = min(end - dev, int(self.z_wp[z]) - end, (z + 1) * self.zs - end)
            if n > 0:
                self.drive.prefetch(end, n)
        self._tls.seq_end = end

    def read_extent(self, sid: int, e_off: int, e_len: int, dev: int,
                    into: memoryview) -> memoryview:
        """A whole extent's payload, verified, into ``into[:e_len]`` (GC copies);
        returns that view.

        A page-aligned ``into`` lets a drive that reads around the page cache
        (an emulated one, docs/drives.md) do so here too: a GC pass over cold
        zones then leaves the page cache, and the hot data in it, as it found
        it (a ``bytearray`` was read buffered: every victim's live bytes went
        through the cache on their way to being dead)."""
        view = into[:e_len]
        self._read_extent(sid, e_off, e_len, dev, 0, e_len, view)
        return view

    def live_extents(self, z: int) -> list[Extent]:
        """The live extents in zone ``z``, in device order."""
        with self._cv:
            return self.index.extents_in_zone(z)

    def _cache_headers(self, fresh: list[tuple[int, RecordHeader]]) -> None:
        """Remember the headers just written: reads of fresh data skip the header block read."""
        limit = self.config.header_cache
        with self._cv:
            for dev, header in fresh[-limit:]:
                self._headers[dev] = header
            while len(self._headers) > limit:
                self._headers.popitem(last=False)

    # ================================================================= index queries
    def indexed_length(self, sid: int) -> int:
        """Bytes of ``sid`` in the index (published), 0 for an unknown slice. Never raises."""
        with self._cv:
            n = self.index.length(sid)
        return 0 if n is None else n

    def live_per_zone(self) -> np.ndarray:
        """A copy of the live bytes of every zone (index lock taken and released)."""
        with self._cv:
            return self.index.zone_live.copy()

    def zone_live_bytes(self, z: int) -> int:
        """Live bytes in zone ``z`` now."""
        with self._cv:
            return int(self.index.zone_live[z])

    def still_at(self, extents: Sequence[Extent]) -> list[bool]:
        """For each extent: is that piece of its slice still indexed at its ``dev``?

        Answered under one hold of the index lock. The caller holds ``io_lock``
        when the answer must stay true until it acts (GC copying an extent).
        """
        with self._cv:
            return [self.index.location(e.slice_id, e.offset) == e.dev for e in extents]
