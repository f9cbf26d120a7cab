"""The compact slice index: slice id -> extents, with no Python object per extent.

An extent is one data record: ``(slice id, slice offset, length, device
offset of the record, lifetime group)``. The extents live in five parallel
numpy columns sorted by ``(slice id, slice offset)`` -- 28 bytes an extent
(u64 id, u32 offset, u32 length, u64 device offset, u32 group code; group
labels are interned in a small table).

Recent extents go to a tail: the same five columns preallocated for
``tail_limit`` rows (append only), plus a small dict ``slice id -> [row, ...]``
for lookups. When the tail is full it is sorted (``lexsort``) and merged into
the base columns column by column (``np.insert`` at ``searchsorted``
positions), so a merge costs one pass over the index and its peak is the
index plus one column, not twice the index.

A deleted extent is marked by length 0 (base or tail) and squeezed out at the
next merge. Live bytes per zone are kept up to date in ``zone_live``.

Not thread-safe: the slice log guards it with its index lock.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

_malloc_trim: Any = None
try:  # glibc keeps freed heap pages; a merge frees whole columns, so give them back
    _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
except (OSError, AttributeError):  # pragma: no cover - not glibc
    pass

_DTYPES = {"sid": np.uint64, "off": np.uint32, "len": np.uint32, "dev": np.uint64,
           "grp": np.uint32}


GROUP_LABELS_KEPT = 4096
"""Below this many group labels the index keeps dead ones (``_forget_groups``)."""


class Extent(NamedTuple):
    """One data record of a slice, as the index, the append path and GC name it."""

    slice_id: int
    offset: int  # within the slice
    length: int  # payload bytes
    dev: int  # device offset of the record (its header block)
    group: int  # lifetime group label


class SliceIndex:
    """slice id -> sorted extents; see the module docstring for the layout."""

    def __init__(self, zone_size: int, zone_count: int, *, tail_limit: int = 65536,
                 labels_kept: int = GROUP_LABELS_KEPT) -> None:
        self.zone_size = zone_size
        self.labels_kept = labels_kept
        self.zone_live = np.zeros(zone_count, dtype=np.int64)
        self.tail_limit = max(1, tail_limit)
        self._sid = np.zeros(0, np.uint64)
        self._off = np.zeros(0, np.uint32)
        self._len = np.zeros(0, np.uint32)
        self._dev = np.zeros(0, np.uint64)
        self._grp = np.zeros(0, np.uint32)
        self._dead = 0
        n = self.tail_limit
        self._t_sid = np.zeros(n, np.uint64)
        self._t_off = np.zeros(n, np.uint32)
        self._t_len = np.zeros(n, np.uint32)
        self._t_dev = np.zeros(n, np.uint64)
        self._t_grp = np.zeros(n, np.uint32)
        self._t_n = 0
        self._tail: dict[int, list[int]] = {}
        self._slices = 0
        self._extents = 0
        self.live_bytes = 0
        self.group_labels: list[int] = []
        self._group_codes: dict[int, int] = {}

    # -- groups ------------------------------------------------------------------------
    def group_code(self, group: int) -> int:
        code = self._group_codes.get(group)
        if code is None:
            code = len(self.group_labels)
            self.group_labels.append(group)
            self._group_codes[group] = code
        return code

    # -- queries -----------------------------------------------------------------------
    def __len__(self) -> int:
        """Live extents."""
        return self._extents

    @property
    def slices(self) -> int:
        return self._slices

    def _base_range(self, sid: int) -> tuple[int, int]:
        arr = self._sid
        if not arr.size:
            return 0, 0
        key = np.uint64(sid)
        lo = int(arr.searchsorted(key))
        if lo >= arr.size or arr[lo] != key:
            return lo, lo  # absent: one binary search only
        return lo, int(arr.searchsorted(key, "right"))

    def _base_live(self, lo: int, hi: int) -> np.ndarray:
        return np.flatnonzero(self._len[lo:hi]) + lo

    def _in_base(self, sid: int) -> bool:
        lo, hi = self._base_range(sid)
        return hi > lo and bool(self._len[lo:hi].any())

    def contains(self, sid: int) -> bool:
        return sid in self._tail or self._in_base(sid)

    def extents(self, sid: int) -> list[tuple[int, int, int]]:
        """``[(slice offset, length, device offset), ...]`` sorted by offset; [] if unknown."""
        out: list[tuple[int, int, int]] = []
        lo, hi = self._base_range(sid)
        if hi > lo:
            out = [(o, n, d) for o, n, d in zip(self._off[lo:hi].tolist(),
                                                self._len[lo:hi].tolist(),
                                                self._dev[lo:hi].tolist(), strict=True) if n]
        rows = self._tail.get(sid)
        if rows:
            out.extend((int(self._t_off[r]), int(self._t_len[r]), int(self._t_dev[r]))
                       for r in rows)
        return out

    def location(self, sid: int, off: int) -> int | None:
        """Device offset of the extent of ``sid`` starting at ``off``, or None."""
        for r in self._tail.get(sid, ()):
            if int(self._t_off[r]) == off and self._t_len[r]:
                return int(self._t_dev[r])
        lo, hi = self._base_range(sid)
        if hi > lo:
            j = lo + int(np.searchsorted(self._off[lo:hi], np.uint32(off)))
            if j < hi and int(self._off[j]) == off and self._len[j] != 0:
                return int(self._dev[j])
        return None

    def length(self, sid: int) -> int | None:
        """Bytes of the slice (end of its last extent), or None when unknown."""
        rows = self._tail.get(sid)
        if rows:
            r = rows[-1]
            return int(self._t_off[r]) + int(self._t_len[r])
        lo, hi = self._base_range(sid)
        if hi > lo:
            live = self._base_live(lo, hi)
            if live.size:
                i = live[-1]
                return int(self._off[i]) + int(self._len[i])
        return None

    def highest_id(self) -> int:
        """The highest slice id the index has seen (live or not; 0 when none)."""
        base = int(self._sid.max()) if self._sid.size else 0
        return max(base, max(self._tail, default=0))

    def slice_ids(self) -> Iterator[int]:
        """Every live slice id (a snapshot; base ids in ascending order, then the tail's)."""
        ids = np.unique(self._sid[self._len != 0])
        tail = set(self._tail)
        for sid in ids.tolist():
            if sid not in tail:
                yield sid
        yield from sorted(tail)

    def extents_in_zone(self, zone: int) -> list[Extent]:
        """The live extents in ``zone``, in device order."""
        start = np.uint64(zone * self.zone_size)
        end = np.uint64((zone + 1) * self.zone_size)
        labels = self.group_labels
        found: list[Extent] = []
        for sid, off, length, dev, grp in ((self._sid, self._off, self._len, self._dev,
                                            self._grp),
                                           (self._t_sid[: self._t_n], self._t_off[: self._t_n],
                                            self._t_len[: self._t_n], self._t_dev[: self._t_n],
                                            self._t_grp[: self._t_n])):
            if not dev.size:
                continue
            idx = np.flatnonzero((dev >= start) & (dev < end) & (length != 0))
            found.extend(map(Extent._make, zip(
                sid[idx].tolist(), off[idx].tolist(), length[idx].tolist(), dev[idx].tolist(),
                [labels[g] for g in grp[idx].tolist()], strict=True)))
        found.sort(key=lambda x: x.dev)
        return found

    # -- updates -----------------------------------------------------------------------
    def _zone_add(self, dev: int, length: int) -> None:
        self.zone_live[dev // self.zone_size] += length
        self.live_bytes += length

    def add(self, sid: int, off: int, length: int, dev: int, group: int) -> None:
        """Add an extent after the slice's last one (pieces are appended in order)."""
        code = self.group_code(group)
        rows = self._tail.get(sid)
        if rows is None:
            if not self._in_base(sid):
                self._slices += 1
            rows = self._tail[sid] = []
        r = self._t_n
        self._t_sid[r] = sid
        self._t_off[r] = off
        self._t_len[r] = length
        self._t_dev[r] = dev
        self._t_grp[r] = code
        self._t_n = r + 1
        rows.append(r)
        self._extents += 1
        self._zone_add(dev, length)
        if self._t_n >= self.tail_limit:
            self.merge()

    def relocate(self, sid: int, off: int, old_dev: int | None, new_dev: int) -> bool:
        """Point extent ``(sid, off)`` at ``new_dev`` if it is (still) at ``old_dev``.

        ``old_dev`` None accepts any current location. Returns False (changing
        nothing) when the extent is gone or has moved.
        """
        for r in self._tail.get(sid, ()):
            if int(self._t_off[r]) == off:
                cur = int(self._t_dev[r])
                if old_dev is not None and cur != old_dev:
                    return False
                length = int(self._t_len[r])
                self._zone_add(cur, -length)
                self._t_dev[r] = new_dev
                self._zone_add(new_dev, length)
                return True
        lo, hi = self._base_range(sid)
        if hi > lo:
            j = lo + int(np.searchsorted(self._off[lo:hi], np.uint32(off)))
            if j < hi and int(self._off[j]) == off and self._len[j] != 0:
                if old_dev is not None and int(self._dev[j]) != old_dev:
                    return False
                length = int(self._len[j])
                self._zone_add(int(self._dev[j]), -length)
                self._dev[j] = new_dev
                self._zone_add(new_dev, length)
                return True
        return False

    def _drop_tail_rows(self, rows: list[int]) -> int:
        freed = 0
        for r in rows:
            length = int(self._t_len[r])
            self._zone_add(int(self._t_dev[r]), -length)
            self._t_len[r] = 0
            freed += length
        self._extents -= len(rows)
        return freed

    def _drop_base_rows(self, live: np.ndarray) -> int:
        freed = 0
        for i in live.tolist():
            length = int(self._len[i])
            self._zone_add(int(self._dev[i]), -length)
            freed += length
        self._len[live] = 0
        self._dead += int(live.size)
        self._extents -= int(live.size)
        return freed

    def remove(self, sid: int) -> int:
        """Drop every extent of ``sid``; returns the bytes it held (0 when unknown)."""
        freed = 0
        found = False
        rows = self._tail.pop(sid, None)
        if rows:
            found = True
            freed += self._drop_tail_rows(rows)
        lo, hi = self._base_range(sid)
        if hi > lo:
            live = self._base_live(lo, hi)
            if live.size:
                found = True
                freed += self._drop_base_rows(live)
        if found:
            self._slices -= 1
        if self._dead > 65536 and self._dead * 8 > self._sid.size:
            self.merge()
        return freed

    def truncate(self, sid: int, off: int) -> None:
        """Drop the extents of ``sid`` that start at or after ``off``."""
        if off == 0:
            self.remove(sid)
            return
        existed = self.contains(sid)
        rows = self._tail.get(sid)
        if rows:
            gone = [r for r in rows if int(self._t_off[r]) >= off]
            self._drop_tail_rows(gone)
            keep = [r for r in rows if r not in gone]
            if keep:
                self._tail[sid] = keep
            else:
                del self._tail[sid]
        lo, hi = self._base_range(sid)
        if hi > lo:
            live = self._base_live(lo, hi)
            self._drop_base_rows(live[self._off[live] >= off])
        if existed and not self.contains(sid):
            self._slices -= 1

    def remove_group(self, group: int) -> list[int]:
        """Drop every slice with an extent in ``group``; returns their ids."""
        code = self._group_codes.get(group)
        if code is None:
            return []
        victims: set[int] = set()
        key = np.uint32(code)
        if self._grp.size:
            victims.update(np.unique(self._sid[(self._grp == key) & (self._len != 0)]).tolist())
        n = self._t_n
        if n:
            mask = (self._t_grp[:n] == key) & (self._t_len[:n] != 0)
            victims.update(np.unique(self._t_sid[:n][mask]).tolist())
        for sid in victims:
            self.remove(sid)
        return sorted(victims)

    def merge(self) -> None:
        """Fold the tail into the sorted columns and squeeze out deleted extents."""
        if self._dead:
            keep = self._len != 0
            self._sid = self._sid[keep]
            self._off = self._off[keep]
            self._dev = self._dev[keep]
            self._grp = self._grp[keep]
            self._len = self._len[keep]
            self._dead = 0
        n = self._t_n
        if not n:
            return
        live = np.flatnonzero(self._t_len[:n])
        order = live[np.lexsort((self._t_off[live], self._t_sid[live]))]
        t_sid = self._t_sid[order]
        # A tail extent of a slice also in the base comes after its base extents.
        pos = np.searchsorted(self._sid, t_sid, "right")
        self._sid = np.insert(self._sid, pos, t_sid)
        self._off = np.insert(self._off, pos, self._t_off[order])
        self._len = np.insert(self._len, pos, self._t_len[order])
        self._dev = np.insert(self._dev, pos, self._t_dev[order])
        self._grp = np.insert(self._grp, pos, self._t_grp[order])
        self._tail.clear()
        self._t_n = 0
        self._forget_groups()
        if _malloc_trim is not None and self._sid.size >= 1 << 16:
            _malloc_trim(0)

    def _forget_groups(self) -> None:
        """Drop the labels of groups no extent is left in (the tail is empty):
        without it the table kept one label per group ever written on the
        drive (every large file, every directory of small files), in memory
        and in every checkpoint. Codes are renumbered; nobody holds one across
        calls. Only when at least half the labels are dead (amortized O(1))."""
        labels = self.group_labels
        if len(labels) < self.labels_kept:
            return
        used = np.unique(self._grp)  # merged: every row is live
        if 2 * used.size > len(labels):
            return
        renumber = np.zeros(len(labels), np.uint32)
        renumber[used] = np.arange(used.size, dtype=np.uint32)
        self._grp = renumber[self._grp]
        self.group_labels = [labels[c] for c in used.tolist()]
        self._group_codes = {g: i for i, g in enumerate(self.group_labels)}

    # -- persistence -------------------------------------------------------------------
    def columns(self) -> dict[str, np.ndarray]:
        """The merged columns (merges first); for checkpoints."""
        self.merge()
        return {"sid": self._sid, "off": self._off, "len": self._len, "dev": self._dev,
                "grp": self._grp}

    def load_columns(self, cols: dict[str, np.ndarray], group_labels: list[int]) -> None:
        """Replace the contents with checkpointed columns (sorted by id and offset)."""
        self._sid = np.ascontiguousarray(cols["sid"], np.uint64)
        self._off = np.ascontiguousarray(cols["off"], np.uint32)
        self._len = np.ascontiguousarray(cols["len"], np.uint32)
        self._dev = np.ascontiguousarray(cols["dev"], np.uint64)
        self._grp = np.ascontiguousarray(cols["grp"], np.uint32)
        self._tail.clear()
        self._t_n = 0
        live = self._len != 0
        self._dead = int(self._len.size - live.sum())
        self._extents = int(live.sum())
        self._slices = int(np.unique(self._sid[live]).size)
        self.group_labels = list(group_labels)
        self._group_codes = {g: i for i, g in enumerate(self.group_labels)}
        self.zone_live[:] = 0
        zones = (self._dev[live] // np.uint64(self.zone_size)).astype(np.int64)
        np.add.at(self.zone_live, zones, self._len[live].astype(np.int64))
        self.live_bytes = int(self._len[live].sum(dtype=np.int64))

    def memory_bytes(self) -> int:
        """Bytes held by the base and tail columns (the tail dict is not counted)."""
        arrays = (self._sid, self._off, self._len, self._dev, self._grp, self._t_sid,
                  self._t_off, self._t_len, self._t_dev, self._t_grp)
        return sum(a.nbytes for a in arrays)


COLUMN_DTYPES = dict(_DTYPES)
