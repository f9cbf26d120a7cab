"""What one client remembers per inode between calls: open inodes, bounded memos, map windows.

:class:`InodeTable` holds the inodes this client has open (their
:class:`~shinglefs.client.writer.FileWriter`, handle count and last stamp)
and hints that are safe to forget: the ``(mtime, ctime, size)`` stamp seen
at the last close (the kernel's ``keep_cache``), the directory an inode was
seen in (lifetime groups), the absence of ``security.capability`` (one
metadata query a second instead of one per write(2)). :class:`MapCache`
holds windows of ``MetaStore.read_map`` results, valid for one generation
of their inode.

Every table outside the open inodes is bounded by ``INODE_MEMO_ENTRIES``:
the kernel may never ``forget`` an inode, so pruning on forget alone would
keep one entry per file touched for the life of the mount.

Locks: ``InodeTable``'s lock is taken before ``MapCache``'s; neither is held
across I/O and neither calls out while held. A file's ``FileWriter.lock`` is
taken before both.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from shinglefs.client.writer import FileWriter
from shinglefs.meta.api import InodeAttr, ReadPiece

__all__ = [
    "DIR_ATTRS_TTL",
    "DIR_NAMES_TTL",
    "INODE_MEMO_ENTRIES",
    "NO_CAPS_TTL",
    "DirAttrs",
    "DirNames",
    "InodeMemo",
    "InodeTable",
    "MapCache",
    "MapWindow",
    "OpenInode",
    "Stamp",
    "cut",
]

INODE_MEMO_ENTRIES = 1 << 16  # ~40 MiB for the three memos when full (measured ~600 MiB at 2^20)
# The absence of security.capability, learned at create or from a miss, is
# trusted this long (as long as attributes).
NO_CAPS_TTL = 1.0
# A directory resolved by path (the Python API) is trusted this long: as long
# as a mount's kernel trusts a name (fuse.operations.ENTRY_TIMEOUT).
DIR_NAMES_TTL = 1.0
# A directory's attributes read from meta are trusted this long for the
# kernel's getattr (fuse.operations.ATTR_TIMEOUT: as long as the kernel itself
# trusts attributes it was given).
DIR_ATTRS_TTL = 1.0
REMOVED_DIRS_KEPT = 1024
"""Directories this client removed, remembered (``InodeTable.removed_dirs``)."""
T = TypeVar("T")
Stamp = tuple[int, int, int]  # (mtime_ns, ctime_ns, size)


@dataclass(slots=True)
class OpenInode:
    """An inode with at least one handle open in this client."""

    ino: int
    writer: FileWriter
    handles: int = 0
    commits_per_chunk: dict[int, int] = field(default_factory=dict)
    # (mtime, ctime, size) after this client's last open or commit of the inode
    stamp: Stamp | None = None


class InodeMemo(OrderedDict[int, T]):
    """A bounded memo keyed by inode (oldest entries dropped): per-inode hints
    that are safe to forget (parent directory, last-seen stamp)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._guard = threading.Lock()

    def __setitem__(self, key: int, value: T) -> None:
        with self._guard:
            super().__setitem__(key, value)
            self.move_to_end(key)
            if len(self) > self.capacity:
                self.popitem(last=False)


K = TypeVar("K")


class _DirMemo(Generic[K]):
    """Directories' attributes by key, each trusted ``ttl`` seconds from when it
    was read from meta; bounded by ``capacity`` (emptied when full); only
    directories are kept. Thread-safe."""

    def __init__(self, ttl: float, capacity: int) -> None:
        self.ttl = ttl
        self.capacity = capacity
        self._lock = threading.Lock()
        self._entries: dict[K, tuple[InodeAttr, float]] = {}

    def _get(self, key: K) -> InodeAttr | None:
        with self._lock:
            hit = self._entries.get(key)
        if hit is None or hit[1] < time.monotonic():
            return None
        return hit[0]

    def _put(self, key: K, attr: InodeAttr) -> None:
        if not attr.is_dir:
            return
        with self._lock:
            if len(self._entries) >= self.capacity:
                self._entries.clear()
            self._entries[key] = (attr, time.monotonic() + self.ttl)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class DirNames(_DirMemo[tuple[int, bytes]]):
    """Directories resolved by name within the last ``DIR_NAMES_TTL`` seconds:
    ``(parent, name) -> attributes`` (the root under ``(0, b"/")``), bounded by
    ``INODE_MEMO_ENTRIES``.

    A memo for path resolution, like a mount's dentry cache: what another
    client renames or removes shows here at most ``DIR_NAMES_TTL`` late; what
    this client changes is forgotten at once (``clear``)."""

    def __init__(self, ttl: float = DIR_NAMES_TTL, capacity: int = INODE_MEMO_ENTRIES) -> None:
        super().__init__(ttl, capacity)

    def get(self, parent: int, name: bytes) -> InodeAttr | None:
        return self._get((parent, name))

    def put(self, parent: int, name: bytes, attr: InodeAttr) -> None:
        self._put((parent, name), attr)


class DirAttrs(_DirMemo[int]):
    """Attributes of directories read from meta within the last ``DIR_ATTRS_TTL``
    seconds, kept current with the entries this client adds to them.

    The kernel invalidates a directory's attributes after every entry made in
    it and asks for them again at the next permission check: one getattr per
    file created. ``touched`` applies what this client's own create did to
    the directory (mtime = ctime = the new inode's ctime, both set in one
    transaction; a subdirectory adds a link), so that question is answered
    here; any other change this client makes through the VFS empties the memo
    (``clear``). Another client's change shows at most ``DIR_ATTRS_TTL`` late,
    as through the kernel's own attribute cache. Bounded by
    ``INODE_MEMO_ENTRIES``."""

    def __init__(self, ttl: float = DIR_ATTRS_TTL, capacity: int = INODE_MEMO_ENTRIES) -> None:
        super().__init__(ttl, capacity)

    def get(self, ino: int) -> InodeAttr | None:
        return self._get(ino)

    def put(self, attr: InodeAttr) -> None:
        """``attr`` was just read from meta (kept only for a directory)."""
        self._put(attr.ino, attr)

    def last_seen(self, ino: int) -> InodeAttr | None:
        """Directory ``ino``'s attributes as last read here, however old: a hint
        only (``MetaStore.create``'s ``parent_seen``); None if not remembered."""
        with self._lock:
            hit = self._entries.get(ino)
        return None if hit is None else hit[0]

    def touched(self, parent: int, when_ns: int, links: int = 0) -> None:
        """This client made an entry in ``parent`` at ``when_ns`` (``links``: 1
        for a subdirectory); the remembered attributes follow, their expiry not."""
        with self._lock:
            hit = self._entries.get(parent)
            if hit is not None:
                attr, until = hit
                self._entries[parent] = (replace(attr, mtime_ns=when_ns, ctime_ns=when_ns,
                                                 nlink=attr.nlink + links), until)


@dataclass(slots=True)
class MapWindow:
    """A cached ``read_map`` result covering ``[start, end)`` at local generation ``gen``."""

    gen: int
    start: int
    end: int
    pieces: list[ReadPiece]


def cut(pieces: list[ReadPiece], start: int, end: int) -> list[ReadPiece]:
    """The parts of contiguous ``pieces`` inside ``[start, end)``."""
    out = []
    for p in pieces:
        p_end = p.file_offset + p.length
        if p_end <= start or p.file_offset >= end:
            continue
        lo = max(start, p.file_offset)
        hi = min(end, p_end)
        shift = lo - p.file_offset
        out.append(
            ReadPiece(
                file_offset=lo,
                length=hi - lo,
                slice_id=p.slice_id,
                slice_offset=p.slice_offset + shift if p.slice_id is not None else 0,
                inline=p.inline[shift:shift + hi - lo] if p.inline is not None else None,
            )
        )
    return out


class MapCache:
    """One window of an inode's chunk map per inode, valid for one generation.

    Every change of an inode's map by this client (a commit, a truncate, a
    compaction, an open that found the file changed) gives the inode a new
    generation from one counter, which invalidates its window. An inode
    dropped from the table reads the *floor*, renewed on every drop, so that
    a map fetched before the drop never matches after it. Both tables are
    bounded: when full they are emptied (a cache: refetched on demand).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._windows: dict[int, MapWindow] = {}
        self._gen: dict[int, int] = {}
        self._gen_next = itertools.count(1)
        self._gen_floor = 0

    @property
    def windows(self) -> int:
        """How many windows are cached (stats)."""
        return len(self._windows)

    @property
    def generations(self) -> int:
        """How many inodes have a generation of their own (stats)."""
        return len(self._gen)

    def invalidate(self, ino: int) -> None:
        """``ino``'s map changed: a new generation, its window dropped."""
        with self._lock:
            if len(self._gen) >= self.capacity:
                self._gen.clear()
                self._gen_floor = next(self._gen_next)
            self._gen[ino] = next(self._gen_next)
            self._windows.pop(ino, None)

    def drop(self, ino: int) -> None:
        """Forget ``ino`` entirely (the kernel forgot it)."""
        with self._lock:
            self._windows.pop(ino, None)
            if self._gen.pop(ino, None) is not None:
                self._gen_floor = next(self._gen_next)

    def drop_window(self, ino: int) -> None:
        """Forget ``ino``'s window only."""
        with self._lock:
            self._windows.pop(ino, None)

    def generation(self, ino: int) -> int:
        """The generation a map fetched now belongs to (pass it to ``remember``)."""
        with self._lock:
            return self._gen.get(ino, self._gen_floor)

    def cached(self, ino: int, offset: int, end: int) -> list[ReadPiece] | None:
        """The pieces of ``[offset, end)`` from the window, if it covers them."""
        with self._lock:
            window = self._windows.get(ino)
            gen = self._gen.get(ino, self._gen_floor)
        if window is not None and window.gen == gen and window.start <= offset and end <= window.end:
            return cut(window.pieces, offset, end)
        return None

    def remember(self, ino: int, gen: int, start: int, end: int, pieces: list[ReadPiece]) -> None:
        """Keep ``pieces`` (covering ``[start, end)``, fetched at ``gen``) unless
        the inode changed since."""
        with self._lock:
            if self._gen.get(ino, self._gen_floor) == gen:
                if len(self._windows) >= self.capacity:
                    self._windows.clear()
                self._windows[ino] = MapWindow(gen, start, end, pieces)


class InodeTable:
    """The inodes this client holds open and its bounded per-inode memos.

    ``capacity`` (default ``INODE_MEMO_ENTRIES``, read when the table is made)
    bounds every memo and the map cache. Thread-safe.
    """

    def __init__(self, capacity: int | None = None) -> None:
        capacity = INODE_MEMO_ENTRIES if capacity is None else capacity
        self._lock = threading.Lock()
        self._open: dict[int, OpenInode] = {}
        self._stamps: InodeMemo[Stamp] = InodeMemo(capacity)
        self._parents: InodeMemo[int] = InodeMemo(capacity)  # ino -> dir it was seen in
        self._no_caps: InodeMemo[float] = InodeMemo(capacity)  # ino -> trusted until
        self.maps = MapCache(capacity)
        self.dirs = DirAttrs(capacity=capacity)
        # Directories this client removed (rmdir, renamed over), nlink 0: a
        # descriptor or a working directory still on one behaves as on Linux
        # (fstat works, a listing is empty) instead of ENOENT. Bounded.
        self.removed_dirs: InodeMemo[InodeAttr] = InodeMemo(REMOVED_DIRS_KEPT)

    # ------------------------------------------------------------------ open inodes
    def get(self, ino: int) -> OpenInode | None:
        """The state of ``ino`` if this client has it open."""
        return self._open.get(ino)

    def __contains__(self, ino: object) -> bool:
        return ino in self._open

    def writer(self, ino: int) -> FileWriter | None:
        """The write buffer of ``ino`` while this client has it open."""
        state = self._open.get(ino)
        return state.writer if state is not None else None

    def writers(self) -> list[FileWriter]:
        """The writers of every open inode (a snapshot)."""
        with self._lock:
            return [state.writer for state in self._open.values()]

    def held(self) -> list[tuple[int, int]]:
        """``(ino, handles)`` of every open inode (a snapshot)."""
        with self._lock:
            return [(ino, state.handles) for ino, state in self._open.items()]

    def attach(self, ino: int, stamp: Stamp, new_writer: Callable[[], FileWriter]) -> bool:
        """One more handle on ``ino``, whose attributes read ``stamp``; returns
        ``keep_cache``: whether the file is unchanged since this client last
        cached it (else its map window is invalidated)."""
        with self._lock:
            state = self._open.get(ino)
            if state is None:
                state = self._open[ino] = OpenInode(ino, new_writer())
            state.handles += 1
            if state.handles == 1:
                state.stamp = stamp
            keep = self._stamps.get(ino) == stamp
            if not keep:
                self.maps.invalidate(ino)
            self._stamps[ino] = stamp
        return keep

    def detach(self, ino: int) -> bool:
        """One handle fewer on ``ino``. On the last, the inode is no longer open
        and its stamp is remembered; returns True when no stamp was known (the
        caller then records meta's with ``note_stamp``, or ``drop_stamp``)."""
        with self._lock:
            state = self._open.get(ino)
            if state is None:
                return False
            state.handles -= 1
            if state.handles > 0:
                return False
            del self._open[ino]
            if state.stamp is not None:
                # What this client saw or made last: a later change by anyone differs.
                self._stamps[ino] = state.stamp
                return False
        return True

    def forget(self, ino: int) -> None:
        """The kernel forgot ``ino``: drop its memos unless it is open here."""
        with self._lock:
            self._no_caps.pop(ino, None)
            self.removed_dirs.pop(ino, None)  # no descriptor or cwd is on it any more
            if ino not in self._open:
                self._stamps.pop(ino, None)
                self._parents.pop(ino, None)
                self.maps.drop(ino)

    def memo_entries(self) -> dict[str, int]:
        """How many entries each per-inode table holds now (tests, stats)."""
        with self._lock:
            return {"open": len(self._open), "stamps": len(self._stamps),
                    "parents": len(self._parents), "no_caps": len(self._no_caps),
                    "map_windows": self.maps.windows, "map_generations": self.maps.generations,
                    "removed_dirs": len(self.removed_dirs)}

    # ------------------------------------------------------------------ memos
    def stamp(self, ino: int) -> Stamp | None:
        """The stamp this client last saw for ``ino`` (None: never, or forgotten)."""
        return self._stamps.get(ino)

    def note_stamp(self, ino: int, stamp: Stamp) -> None:
        with self._lock:
            self._stamps[ino] = stamp

    def drop_stamp(self, ino: int) -> None:
        """``ino`` is gone: forget its stamp and map window."""
        with self._lock:
            self._stamps.pop(ino, None)
            self.maps.drop_window(ino)

    def parent(self, ino: int) -> int | None:
        """The directory ``ino`` was last seen in, if remembered."""
        return self._parents.get(ino)

    def note_parent(self, ino: int, parent: int) -> None:
        self._parents[ino] = parent

    def note_made(self, attr: InodeAttr, parent: int, links: int = 0) -> None:
        """This client made ``attr`` in ``parent`` (``links``: 1 for a directory)."""
        self._parents[attr.ino] = parent
        self.dirs.touched(parent, attr.ctime_ns, links)

    def caps_absent(self, ino: int, now: float) -> bool:
        """Is ``security.capability`` known to be absent from ``ino`` at ``now``?"""
        with self._lock:
            until = self._no_caps.get(ino)
        return until is not None and now < until

    def note_no_caps(self, ino: int, now: float) -> None:
        """``ino`` has no ``security.capability`` (trusted ``NO_CAPS_TTL`` s).

        Notes expire in the order they were made (one TTL for all): the
        expired ones at the old end are dropped here, so the memo holds the
        inodes noted in the last ``NO_CAPS_TTL`` s, not one per file created
        over the life of the mount (every create notes one; the kernel does
        not always ``forget`` the inode, and the note outlived the forget)."""
        with self._lock:
            memo = self._no_caps
            while memo and next(iter(memo.values())) <= now:
                memo.popitem(last=False)
            memo[ino] = now + NO_CAPS_TTL

    def forget_no_caps(self, ino: int) -> None:
        with self._lock:
            self._no_caps.pop(ino, None)
