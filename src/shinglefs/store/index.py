"""The compact slice index: slice id -> extents, with no Python object per extent.

An extent is one data record: ``(slice id, slice offset, length, device
offset of the record, lifetime group)``. The bulk of the extents live in five
parallel numpy columns sorted by ``(slice id, slice offset)`` -- 28 bytes an
extent (u64 id, u32 offset, u32 length, u64 device offset, u32 group code;
group labels are interned in a small table). Recent extents sit in a Python
dict ``slice id -> [[offset, length, device offset, group code], ...]`` (the
tail) that is merged into the columns once it holds ``tail_limit`` extents.
Merging is column by column (``np.insert`` at ``searchsorted`` positions), so
the peak is the columns plus one column, not twice the index.

A deleted base extent is marked by length 0 and squeezed out at the next
merge. Live bytes per zone are kept up to date in ``zone_live``.

Not thread-safe: the slice log guards it with its index lock.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

_COLUMNS = (("sid", np.uint64), ("off", np.uint32), ("len", np.uint32), ("dev", np.uint64),
            ("grp", np.uint32))


class SliceIndex:
    """slice id -> sorted extents; see the module docstring for the layout."""

    def __init__(self, zone_size: int, zone_count: int, *, tail_limit: int = 65536) -> None:
        self.zone_size = zone_size
        self.zone_live = np.zeros(zone_count, dtype=np.int64)
        self.tail_limit = tail_limit
        self._sid = np.zeros(0, np.uint64)
        self._off = np.zeros(0, np.uint32)
        self._len = np.zeros(0, np.uint32)
        self._dev = np.zeros(0, np.uint64)
        self._grp = np.zeros(0, np.uint32)
        self._dead = 0
        self._tail: dict[int, list[list[int]]] = {}
        self._tail_extents = 0
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
        key = np.uint64(sid)
        lo = int(np.searchsorted(self._sid, key, "left"))
        hi = int(np.searchsorted(self._sid, key, "right"))
        return lo, hi

    def _base_live(self, lo: int, hi: int) -> np.ndarray:
        return np.flatnonzero(self._len[lo:hi]) + lo

    def contains(self, sid: int) -> bool:
        if sid in self._tail:
            return True
        lo, hi = self._base_range(sid)
        return hi > lo and bool(self._len[lo:hi].any())

    def extents(self, sid: int) -> list[tuple[int, int, int]]:
        """``[(slice offset, length, device offset), ...]`` sorted by offset; [] if unknown."""
        out: list[tuple[int, int, int]] = []
        lo, hi = self._base_range(sid)
        if hi > lo:
            for i in self._base_live(lo, hi):
                out.append((int(self._off[i]), int(self._len[i]), int(self._dev[i])))
        tail = self._tail.get(sid)
        if tail:
            out.extend((e[0], e[1], e[2]) for e in tail)
        return out

    def length(self, sid: int) -> int | None:
        """Bytes of the slice (end of its last extent), or None when unknown."""
        tail = self._tail.get(sid)
        if tail:
            last = tail[-1]
            return last[0] + last[1]
        lo, hi = self._base_range(sid)
        if hi > lo:
            live = self._base_live(lo, hi)
            if live.size:
                i = live[-1]
                return int(self._off[i]) + int(self._len[i])
        return None

    def slice_ids(self) -> Iterator[int]:
        """Every live slice id (a snapshot; base ids in ascending order, then the tail's)."""
        live = self._len != 0
        ids = np.unique(self._sid[live])
        tail = set(self._tail)
        for sid in ids.tolist():
            if sid not in tail:
                yield sid
        yield from sorted(tail)

    def extents_in_zone(self, zone: int) -> list[tuple[int, int, int, int, int]]:
        """Live ``(slice id, offset, length, device offset, group label)`` in ``zone``, by device offset."""
        start = zone * self.zone_size
        end = start + self.zone_size
        labels = self.group_labels
        found: list[tuple[int, int, int, int, int]] = []
        if self._dev.size:
            mask = (self._dev >= np.uint64(start)) & (self._dev < np.uint64(end))
            mask &= self._len != 0
            for i in np.flatnonzero(mask):
                found.append((int(self._sid[i]), int(self._off[i]), int(self._len[i]),
                              int(self._dev[i]), labels[int(self._grp[i])]))
        for sid, tail in self._tail.items():
            for e in tail:
                if start <= e[2] < end:
                    found.append((sid, e[0], e[1], e[2], labels[e[3]]))
        found.sort(key=lambda x: x[3])
        return found

    def groups_of(self, sid: int) -> set[int]:
        codes: set[int] = set()
        lo, hi = self._base_range(sid)
        if hi > lo:
            codes.update(int(c) for c in self._grp[self._base_live(lo, hi)])
        for e in self._tail.get(sid, ()):
            codes.add(e[3])
        return {self.group_labels[c] for c in codes}

    # -- updates -----------------------------------------------------------------------
    def _zone_add(self, dev: int, length: int) -> None:
        self.zone_live[dev // self.zone_size] += length
        self.live_bytes += length

    def add(self, sid: int, off: int, length: int, dev: int, group: int) -> None:
        """Add an extent after the slice's last one (pieces are appended in order)."""
        code = self.group_code(group)
        tail = self._tail.get(sid)
        if tail is None:
            if not self.contains(sid):
                self._slices += 1
            self._tail[sid] = [[off, length, dev, code]]
        else:
            tail.append([off, length, dev, code])
        self._tail_extents += 1
        self._extents += 1
        self._zone_add(dev, length)
        if self._tail_extents >= self.tail_limit:
            self.merge()

    def relocate(self, sid: int, off: int, old_dev: int | None, new_dev: int) -> bool:
        """Point extent ``(sid, off)`` at ``new_dev`` if it is (still) at ``old_dev``.

        ``old_dev`` None accepts any current location. Returns False (changing
        nothing) when the extent is gone or has moved.
        """
        for e in self._tail.get(sid, ()):
            if e[0] == off:
                if old_dev is not None and e[2] != old_dev:
                    return False
                self._zone_add(e[2], -e[1])
                e[2] = new_dev
                self._zone_add(new_dev, e[1])
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

    def remove(self, sid: int) -> int:
        """Drop every extent of ``sid``; returns the bytes it held (0 when unknown)."""
        freed = 0
        found = False
        tail = self._tail.pop(sid, None)
        if tail:
            found = True
            for e in tail:
                self._zone_add(e[2], -e[1])
                freed += e[1]
            self._tail_extents -= len(tail)
            self._extents -= len(tail)
        lo, hi = self._base_range(sid)
        if hi > lo:
            live = self._base_live(lo, hi)
            if live.size:
                found = True
                for i in live:
                    length = int(self._len[i])
                    self._zone_add(int(self._dev[i]), -length)
                    freed += length
                self._len[live] = 0
                self._dead += int(live.size)
                self._extents -= int(live.size)
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
        tail = self._tail.get(sid)
        if tail:
            keep = [e for e in tail if e[0] < off]
            for e in tail:
                if e[0] >= off:
                    self._zone_add(e[2], -e[1])
            dropped = len(tail) - len(keep)
            self._tail_extents -= dropped
            self._extents -= dropped
            if keep:
                self._tail[sid] = keep
            else:
                del self._tail[sid]
                if not self.contains(sid):
                    self._slices -= 1
        lo, hi = self._base_range(sid)
        if hi > lo:
            for i in self._base_live(lo, hi):
                if int(self._off[i]) >= off:
                    self._zone_add(int(self._dev[i]), -int(self._len[i]))
                    self._len[i] = 0
                    self._dead += 1
                    self._extents -= 1
            if not self.contains(sid) and sid not in self._tail:
                self._slices -= 1

    def remove_group(self, group: int) -> list[int]:
        """Drop every slice with an extent in ``group``; returns their ids."""
        code = self._group_codes.get(group)
        if code is None:
            return []
        victims: set[int] = set()
        if self._grp.size:
            mask = (self._grp == np.uint32(code)) & (self._len != 0)
            victims.update(np.unique(self._sid[mask]).tolist())
        for sid, tail in self._tail.items():
            if any(e[3] == code for e in tail):
                victims.add(sid)
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
        if not self._tail:
            return
        n = self._tail_extents
        t_sid = np.empty(n, np.uint64)
        t_off = np.empty(n, np.uint32)
        t_len = np.empty(n, np.uint32)
        t_dev = np.empty(n, np.uint64)
        t_grp = np.empty(n, np.uint32)
        i = 0
        for sid in sorted(self._tail):
            for off, length, dev, code in self._tail[sid]:
                t_sid[i] = sid
                t_off[i] = off
                t_len[i] = length
                t_dev[i] = dev
                t_grp[i] = code
                i += 1
        # A tail extent of a slice also in the base comes after its base extents.
        pos = np.searchsorted(self._sid, t_sid, "right")
        self._sid = np.insert(self._sid, pos, t_sid)
        self._off = np.insert(self._off, pos, t_off)
        self._len = np.insert(self._len, pos, t_len)
        self._dev = np.insert(self._dev, pos, t_dev)
        self._grp = np.insert(self._grp, pos, t_grp)
        self._tail.clear()
        self._tail_extents = 0

    # -- persistence -------------------------------------------------------------------
    def columns(self) -> dict[str, np.ndarray]:
        """The merged columns (merges first); for checkpoints."""
        self.merge()
        return {"sid": self._sid, "off": self._off, "len": self._len, "dev": self._dev,
                "grp": self._grp}

    def load_columns(self, cols: dict[str, np.ndarray], group_labels: list[int]) -> None:
        """Replace the contents with checkpointed columns (sorted, no deleted extents)."""
        self._sid = np.ascontiguousarray(cols["sid"], np.uint64)
        self._off = np.ascontiguousarray(cols["off"], np.uint32)
        self._len = np.ascontiguousarray(cols["len"], np.uint32)
        self._dev = np.ascontiguousarray(cols["dev"], np.uint64)
        self._grp = np.ascontiguousarray(cols["grp"], np.uint32)
        self._tail.clear()
        self._tail_extents = 0
        self._dead = int((self._len == 0).sum())
        self._extents = int(self._len.size) - self._dead
        live = self._len != 0
        self._slices = int(np.unique(self._sid[live]).size)
        self.group_labels = list(group_labels)
        self._group_codes = {g: i for i, g in enumerate(self.group_labels)}
        self.zone_live[:] = 0
        zones = (self._dev[live] // np.uint64(self.zone_size)).astype(np.int64)
        np.add.at(self.zone_live, zones, self._len[live].astype(np.int64))
        self.live_bytes = int(self._len[live].sum(dtype=np.int64))

    def memory_bytes(self) -> int:
        """Bytes held by the columns (the tail's Python objects are not counted)."""
        return sum(c.nbytes for c in (self._sid, self._off, self._len, self._dev, self._grp))


COLUMN_DTYPES = dict(_COLUMNS)
