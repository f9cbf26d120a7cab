"""The VFS: an inode-based, thread-safe, blocking file-system API over meta and the node.

It mirrors pyfuse3's operations (see docs/client.md and the FUSE layer) so
that ``shinglefs.fuse`` is a thin translation, and the Python API
(``shinglefs.client.api``) and fsspec sit on the same code.

Every namespace operation is one metadata transaction. File bytes go through
a :class:`~shinglefs.client.writer.FileWriter` per open inode (slices streamed
to the node while the application writes) and come back through the shared
:class:`~shinglefs.client.reader.ExtentCache` (whole-extent drive reads,
readahead, no duplicate reads by concurrent readers).

Errors: every failure is a ``ShingleError`` with an ``errno``: metadata
failures are ``FsError`` (the POSIX errno), storage failures EIO/ENOSPC,
handle misuse EBADF, unsupported fallocate modes EOPNOTSUPP.

Threads: the caller's threads run every operation; a maintenance thread
consumes the deletion queue, heartbeats the session and compacts fragmented
chunks; ``io_threads`` pool threads run readahead. Lock order (outer first):
a file's ``FileWriter.lock`` -> ``VFS._lock`` (tables only, never held
across I/O) -> the extent cache's lock.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import shinglefs
from shinglefs.client.commit import LOCAL_SERVER, FinishedSlice, OrderedCommits
from shinglefs.client.config import ClientConfig
from shinglefs.client.errors import (
    BadHandle,
    ClientClosed,
    NotOpenForReading,
    NotOpenForWriting,
    UnsupportedFallocate,
)
from shinglefs.client.groups import GroupPolicy
from shinglefs.client.reader import (
    DirectReader,
    ExtentCache,
    ReadState,
    assemble,
    prefetch_pieces,
)
from shinglefs.client.recovery import MetadataBackup
from shinglefs.client.writer import FileWriter, WriteBudget
from shinglefs.meta.api import (
    ROOT_CTX,
    Ctx,
    DirEntry,
    InodeAttr,
    MetaStore,
    ReadPiece,
    Replica,
    SessionInfo,
    SliceInfo,
    SliceRef,
    SliceState,
    StatFs,
)
from shinglefs.meta.errors import ChunkChanged, FsError
from shinglefs.server.errors import NodeFull, SliceMissing
from shinglefs.server.node import StorageNode

log = logging.getLogger(__name__)

__all__ = ["VFS", "Ctx", "DirEntry", "InodeAttr", "SetAttrChanges", "StatFs"]

COMPACTION_ATTEMPTS = 3
INODE_MEMO_ENTRIES = 1 << 16  # ~40 MiB for the three memos when full (measured ~600 MiB at 2^20)
T = TypeVar("T")
HEARTBEAT_INTERVAL = 10.0
CLOSE_BATCH = 256  # queued closes that wake the maintenance thread early
# The kernel asks for this xattr before every write(2) (to strip file
# capabilities). Its absence, learned at create or from a miss, is trusted for
# NO_CAPS_TTL seconds (as long as attributes): one metadata query a second
# instead of one per write.
CAPS_XATTR = b"security.capability"
NO_CAPS_TTL = 1.0


@dataclass(frozen=True, slots=True)
class SetAttrChanges:
    """What ``setattr`` changes; None leaves a field alone.

    Times are nanoseconds or ``UTIME_NOW``/``UTIME_OMIT`` (shinglefs.meta.api).
    ``size`` truncates (up or down), including this client's buffered writes.
    """

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None


@dataclass(slots=True)
class FileHandle:
    fh: int
    ino: int
    flags: int
    keep_cache: bool
    read_state: ReadState = field(default_factory=ReadState)

    @property
    def readable(self) -> bool:
        return (self.flags & os.O_ACCMODE) in (os.O_RDONLY, os.O_RDWR)

    @property
    def writable(self) -> bool:
        return (self.flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)

    @property
    def append(self) -> bool:
        return bool(self.flags & os.O_APPEND)


@dataclass(slots=True)
class DirHandle:
    fh: int
    ino: int
    ctx: Ctx


@dataclass(slots=True)
class OpenInode:
    """An inode with at least one handle open in this client."""

    ino: int
    writer: FileWriter
    handles: int = 0
    commits_per_chunk: dict[int, int] = field(default_factory=dict)
    # (mtime, ctime, size) after this client's last open or commit of the inode
    stamp: tuple[int, int, int] | None = None


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


@dataclass(slots=True)
class MapWindow:
    """A cached ``read_map`` result covering ``[start, end)`` at local generation ``gen``."""

    gen: int
    start: int
    end: int
    pieces: list[ReadPiece]


def _cut(pieces: list[ReadPiece], start: int, end: int) -> list[ReadPiece]:
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
            )
        )
    return out


class VFS:
    """File operations as metadata transactions plus slice I/O. Thread-safe."""

    def __init__(
        self,
        meta: MetaStore,
        node: StorageNode,
        config: ClientConfig | None = None,
        *,
        groups: GroupPolicy | None = None,
        mountpoint: str = "",
    ) -> None:
        self.meta = meta
        self.node = node
        self.config = config or ClientConfig()
        self.groups = groups or GroupPolicy()
        self.chunk_size = meta.format_info().chunk_size
        self._session_info = SessionInfo(
            host=socket.gethostname(),
            pid=os.getpid(),
            mountpoint=mountpoint,
            version=shinglefs.__version__,
        )
        self.session = meta.register_session(self._session_info)
        self._lock = threading.Lock()
        self._handles: dict[int, FileHandle] = {}
        self._dirs: dict[int, DirHandle] = {}
        self._inodes: dict[int, OpenInode] = {}
        # ino -> (mtime, ctime, size) when this client last had it open (keep_cache)
        self._stamps: InodeMemo[tuple[int, int, int]] = InodeMemo(INODE_MEMO_ENTRIES)
        self._maps: dict[int, MapWindow] = {}
        # ino -> generation of its map cache, from one counter; an inode the
        # kernel forgot is dropped and reads ``_gen_floor``, renewed on every drop
        # so that a map fetched before the drop never matches after it.
        self._gen: dict[int, int] = {}
        self._gen_next = itertools.count(1)
        self._gen_floor = 0
        self._parents: InodeMemo[int] = InodeMemo(INODE_MEMO_ENTRIES)  # ino -> dir it was seen in
        self._no_caps: InodeMemo[float] = InodeMemo(INODE_MEMO_ENTRIES)  # ino -> trusted until
        self._next_fh = 1
        self._budget = WriteBudget(self.config.total_buffer_bytes)
        self._pool = ThreadPoolExecutor(self.config.io_threads, thread_name_prefix="shinglefs-io")
        # FIFO: a settle task waits only on its file's earlier task, started before it.
        self._settler = ThreadPoolExecutor(
            self.config.commit_threads, thread_name_prefix="shinglefs-commit"
        )
        self.cache = ExtentCache(
            self._read_slice,
            extent=self.config.read_extent,
            capacity=self.config.read_cache_bytes,
            pool=self._pool,
            hint=self.node.prefetch,
        )
        self._closed = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._compact_queue: list[tuple[int, int]] = []
        self._deletion_lock = threading.Lock()
        self._closes: list[tuple[int, int]] = []  # (session, ino) released, not yet closed in meta
        self.commits = OrderedCommits(self.meta, self.node.flush)
        self.deleted_slices = 0
        self.compactions = 0
        self.meta_backup = MetadataBackup(meta, node)  # to the drives, every interval
        self._maintenance = threading.Thread(
            target=self._maintenance_loop, name="shinglefs-maintenance", daemon=True
        )
        self._maintenance.start()

    # ================================================================== helpers
    @property
    def closed(self) -> bool:
        """True after ``shutdown`` or ``abandon``."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed()

    def _handle(self, fh: int) -> FileHandle:
        try:
            return self._handles[fh]
        except KeyError:
            raise BadHandle(fh) from None

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def _bump(self, ino: int) -> None:
        with self._lock:
            self._new_gen(ino)
            self._maps.pop(ino, None)

    def _new_gen(self, ino: int) -> None:
        """A new map-cache generation for ``ino`` (``_lock`` held). The table is
        bounded: when full it is emptied and the floor renewed, which only
        makes cached maps be fetched again (the kernel may never ``forget``)."""
        if len(self._gen) >= INODE_MEMO_ENTRIES:
            self._gen.clear()
            self._gen_floor = next(self._gen_next)
        self._gen[ino] = next(self._gen_next)

    def _note_parent(self, ino: int, parent: int) -> None:
        self._parents[ino] = parent

    def _with_buffered_size(self, attr: InodeAttr) -> InodeAttr:
        state = self._inodes.get(attr.ino)
        if state is not None:
            end = state.writer.buffered_end()
            if end > attr.size:
                return dataclasses.replace(attr, size=end)
        return attr

    def _flush_writer(self, ino: int) -> None:
        state = self._inodes.get(ino)
        if state is not None:
            state.writer.flush()

    # ================================================================== namespace
    def lookup(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        self._check_open()
        attr = self.meta.lookup(parent, name, ctx)
        if name not in (b".", b".."):
            self._note_parent(attr.ino, parent)
        return self._with_buffered_size(attr)

    def forget(self, ino: int, nlookup: int) -> None:
        """The kernel dropped ``nlookup`` references (and with them its cached
        pages). Data is never freed here: the metadata engine frees unlinked
        inodes on their last close (sessions). Drops this client's memos."""
        with self._lock:
            if ino not in self._inodes:
                self._stamps.pop(ino, None)
                self._parents.pop(ino, None)
                self._maps.pop(ino, None)
                if self._gen.pop(ino, None) is not None:
                    self._gen_floor = next(self._gen_next)

    def getattr(self, ino: int) -> InodeAttr:
        """Attributes from meta; ``size`` includes this client's buffered writes."""
        self._check_open()
        return self._with_buffered_size(self.meta.getattr(ino))

    def setattr(
        self, ino: int, changes: SetAttrChanges, fh: int | None = None, ctx: Ctx = ROOT_CTX,
        *, checked: bool = False,
    ) -> InodeAttr:
        """Change attributes; a size change first commits this client's buffered writes.

        ``fh``, a handle opened for writing, grants a size change (ftruncate);
        ``checked``: the kernel already applied the permission rules (see
        ``MetaStore.setattr``).
        """
        self._check_open()
        handle = self._handles.get(fh) if fh is not None else None
        by_fd = handle is not None and handle.writable
        if changes.size is not None:
            state = self._inodes.get(ino)
            if state is not None:
                with state.writer.lock:
                    state.writer.flush()
                    attr = self._meta_setattr(ino, changes, ctx, by_fd, checked)
                    state.writer.note_committed_size(attr.size)
            else:
                attr = self._meta_setattr(ino, changes, ctx, by_fd, checked)
            self._bump(ino)
            return attr
        return self._with_buffered_size(self._meta_setattr(ino, changes, ctx, by_fd, checked))

    def _meta_setattr(self, ino: int, c: SetAttrChanges, ctx: Ctx, open_for_write: bool,
                      checked: bool) -> InodeAttr:
        return self.meta.setattr(
            ino,
            mode=c.mode,
            uid=c.uid,
            gid=c.gid,
            size=c.size,
            atime_ns=c.atime_ns,
            mtime_ns=c.mtime_ns,
            ctx=ctx,
            open_for_write=open_for_write,
            checked=checked,
        )

    def readlink(self, ino: int, ctx: Ctx = ROOT_CTX) -> bytes:
        self._check_open()
        return self.meta.readlink(ino)

    def mknod(self, parent: int, name: bytes, mode: int, rdev: int, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        self._check_open()
        attr = self.meta.mknod(parent, name, mode, rdev, ctx)
        self._note_parent(attr.ino, parent)
        return attr

    def mkdir(self, parent: int, name: bytes, mode: int, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        self._check_open()
        attr = self.meta.mkdir(parent, name, mode, ctx)
        self._note_parent(attr.ino, parent)
        return attr

    def unlink(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> None:
        """Remove a name. An inode still open anywhere stays usable until its last close."""
        self._check_open()
        result = self.meta.unlink(parent, name, ctx)
        if result.released:
            self._wake.set()

    def rmdir(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> None:
        self._check_open()
        self.meta.rmdir(parent, name, ctx)

    def symlink(self, parent: int, name: bytes, target: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        self._check_open()
        attr = self.meta.symlink(parent, name, target, ctx)
        self._note_parent(attr.ino, parent)
        return attr

    def rename(
        self,
        parent_old: int,
        name_old: bytes,
        parent_new: int,
        name_new: bytes,
        flags: int = 0,
        ctx: Ctx = ROOT_CTX,
    ) -> None:
        """Atomic rename (replacing the target); see ``MetaStore.rename``."""
        self._check_open()
        result = self.meta.rename(parent_old, name_old, parent_new, name_new, flags, ctx)
        self._note_parent(result.ino, parent_new)
        if result.released:
            self._wake.set()

    def link(self, ino: int, new_parent: int, new_name: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        self._check_open()
        return self._with_buffered_size(self.meta.link(ino, new_parent, new_name, ctx))

    # ================================================================== open / close
    def _writer_for(self, ino: int, committed_size: int) -> FileWriter:
        def choose_group(small: bool) -> int:
            return self.groups.group_for(ino, self._parents.get(ino), small)

        return FileWriter(
            ino,
            node=self.node,
            config=self.config,
            chunk_size=self.chunk_size,
            budget=self._budget,
            new_slice_id=self.meta.next_slice_id,
            choose_group=choose_group,
            register=self._register_slice,
            commit=self._commit_slice,
            settler=self._settler,
            committed_size=committed_size,
        )

    def _attach(self, ino: int, flags: int, attr: InodeAttr) -> int:
        """Create a handle for an inode already opened in meta for our session."""
        stamp = (attr.mtime_ns, attr.ctime_ns, attr.size)
        with self._lock:
            state = self._inodes.get(ino)
            if state is None:
                state = self._inodes[ino] = OpenInode(ino, self._writer_for(ino, attr.size))
            state.handles += 1
            if state.handles == 1:
                state.stamp = stamp
            keep = self._stamps.get(ino) == stamp
            if not keep:
                self._maps.pop(ino, None)
                self._new_gen(ino)
            self._stamps[ino] = stamp
            fh = self._new_fh()
            self._handles[fh] = FileHandle(fh, ino, flags, keep)
        return fh

    def _access_for_flags(self, ino: int, flags: int, ctx: Ctx) -> None:
        if ctx.is_root:
            return
        mode = flags & os.O_ACCMODE
        mask = {os.O_RDONLY: os.R_OK, os.O_WRONLY: os.W_OK, os.O_RDWR: os.R_OK | os.W_OK}.get(
            mode, os.R_OK
        )
        if flags & os.O_TRUNC:
            mask |= os.W_OK
        self.meta.access(ctx, ino, mask)

    def open(self, ino: int, flags: int, ctx: Ctx = ROOT_CTX) -> int:
        """Open an inode; returns a file handle. O_TRUNC truncates (with write access).

        Close-to-open: the handle sees everything closed by other clients before
        this call; ``open_file_info(fh)`` says whether the kernel cache may be kept.
        """
        self._check_open()
        attr = self.meta.getattr(ino)
        if attr.is_dir:
            raise FsError(errno.EISDIR, f"inode {ino} is a directory", ino=ino)
        self._access_for_flags(ino, flags, ctx)
        self.meta.open_file(self.session, ino)
        try:
            if flags & os.O_TRUNC and (flags & os.O_ACCMODE) != os.O_RDONLY:
                attr = self._truncate_on_open(attr, ctx)
            return self._attach(ino, flags, attr)
        except BaseException:
            self.meta.close_file(self.session, ino)
            raise

    def _truncate_on_open(self, attr: InodeAttr, ctx: Ctx) -> InodeAttr:
        """O_TRUNC: empty the file, including bytes this client still buffers."""
        state = self._inodes.get(attr.ino)
        if state is None:
            if attr.size == 0:
                return attr
            attr = self.meta.truncate(attr.ino, 0, ctx)
        else:
            with state.writer.lock:
                state.writer.flush()
                attr = self.meta.truncate(attr.ino, 0, ctx)
                state.writer.note_committed_size(0)
        self._bump(attr.ino)
        return attr

    def open_file_info(self, fh: int) -> bool:
        """keep_cache for the handle: True when the kernel page cache may be kept
        (the file did not change since this client last cached it)."""
        return self._handle(fh).keep_cache

    def changed_since_open(self, ino: int) -> bool:
        """Has ``ino`` changed (mtime, ctime or size in meta) since this client last cached it?"""
        attr = self.meta.getattr(ino)
        return self._stamps.get(ino) != (attr.mtime_ns, attr.ctime_ns, attr.size)

    def create(
        self, parent: int, name: bytes, mode: int, flags: int, ctx: Ctx = ROOT_CTX
    ) -> tuple[int, InodeAttr]:
        """Create (O_EXCL: exclusively) and open a regular file in one transaction."""
        self._check_open()
        started = time.time_ns()
        attr = self.meta.create(
            parent, name, mode, ctx, exclusive=bool(flags & os.O_EXCL), session=self.session
        )
        self._note_parent(attr.ino, parent)
        if attr.ctime_ns >= started:  # made now (not an existing file opened): no xattrs
            self._note_no_caps(attr.ino, time.monotonic())
        try:
            if flags & os.O_TRUNC:
                attr = self._truncate_on_open(attr, ctx)
            fh = self._attach(attr.ino, flags, attr)
        except BaseException:
            self.meta.close_file(self.session, attr.ino)
            raise
        return fh, self._with_buffered_size(attr)

    def flush(self, fh: int) -> None:
        """close(2) of a descriptor: commit buffered writes (close-to-open)."""
        self._check_open()
        h = self._handle(fh)
        if h.writable:
            self._flush_writer(h.ino)

    def try_flush(self, fh: int) -> bool:
        """``flush`` if it needs no other thread (nothing buffered, or a small
        file's bytes stored in this thread: ``FileWriter.try_flush``); returns
        whether it did. False: call ``flush``, which may wait for a drive."""
        self._check_open()
        h = self._handle(fh)
        state = self._inodes.get(h.ino) if h.writable else None
        return state is None or state.writer.try_flush()

    def release(self, fh: int) -> None:
        """Last close of a handle: commit buffered writes, close the file in meta.

        An unlinked file whose last open this was is freed by meta; its slices
        are deleted by the maintenance thread. A write-back error is raised
        after the handle is released.
        """
        self._check_open()
        with self._lock:
            h = self._handles.pop(fh, None)
        if h is None:
            raise BadHandle(fh)
        error: BaseException | None = None
        state = self._inodes.get(h.ino)
        if state is not None:
            try:
                with state.writer.lock:
                    state.writer.flush()
            except BaseException as exc:
                error = exc
        try:
            if self.config.deferred_close:
                with self._lock:
                    self._closes.append((self.session, h.ino))
                    many = len(self._closes) >= CLOSE_BATCH
                if many:
                    self._wake.set()
            elif self.meta.close_file(self.session, h.ino):
                self._wake.set()
        finally:
            self._detach(h.ino)
        if error is not None:
            raise error

    def drain_closes(self) -> int:
        """Close in meta, in one transaction a session, the handles ``release``
        queued (``deferred_close``); returns the number of inodes freed.

        Deferring costs nothing visible: the row only keeps an unlinked inode
        alive, so the worst effect is a freed file's slices deleted up to one
        maintenance interval later. ``run_deletions`` and ``shutdown`` drain first.
        """
        with self._lock:
            closes, self._closes = self._closes, []
        if not closes:
            return 0
        by_session: dict[int, list[int]] = {}
        for session, ino in closes:
            by_session.setdefault(session, []).append(ino)
        freed = 0
        try:
            for session, inos in by_session.items():
                freed += len(self.meta.close_files(session, inos))
        except BaseException:
            with self._lock:  # retried by the next drain
                self._closes[:0] = [(s, i) for s, inos in by_session.items() for i in inos]
            raise
        return freed

    def _detach(self, ino: int) -> None:
        with self._lock:
            state = self._inodes.get(ino)
            if state is None:
                return
            state.handles -= 1
            if state.handles > 0:
                return
            del self._inodes[ino]
            if state.stamp is not None:
                # What this client saw or made last: a later change by anyone differs.
                self._stamps[ino] = state.stamp
                return
        try:
            attr = self.meta.getattr(ino)
            with self._lock:
                self._stamps[ino] = (attr.mtime_ns, attr.ctime_ns, attr.size)
        except FsError:
            with self._lock:
                self._stamps.pop(ino, None)
                self._maps.pop(ino, None)

    def fsync(self, fh: int, datasync: bool = False) -> None:
        """Make the file's data AND metadata durable before returning (both flavours)."""
        self._check_open()
        h = self._handle(fh)
        # Commit buffered bytes (ordered: flushed on their drives first), then
        # make meta's commits durable (SQLite synchronous=NORMAL defers that).
        self._flush_writer(h.ino)
        self.meta.sync()

    # ================================================================== data
    def write(self, fh: int, offset: int, data: bytes | memoryview) -> int:
        """Buffer ``data`` at ``offset`` (O_APPEND: at the end); returns the byte count."""
        self._check_open()
        h = self._handle(fh)
        if not h.writable:
            raise NotOpenForWriting(fh)
        try:
            return self._write_to(h, offset, data)
        except NodeFull:
            # Files deleted a moment ago hold their space until the deletion
            # queue is drained: drain it now and try once more before ENOSPC
            # (even when this pass deleted nothing: a concurrent pass it waited
            # for may have freed the space).
            self.run_deletions()
            return self._write_to(h, offset, data)

    def _write_to(self, h: FileHandle, offset: int, data: bytes | memoryview) -> int:
        state = self._inodes[h.ino]
        if h.append:
            with state.writer.lock:
                size = max(self.meta.getattr(h.ino).size, state.writer.buffered_end())
                return state.writer.write(size, data)
        return state.writer.write(offset, data)

    def try_write(self, fh: int, offset: int, data: bytes | memoryview) -> int | None:
        """``write`` if it completes at once, without waiting (the bytes fit the
        open slice's pending buffer: ``FileWriter.try_write``); else None with
        nothing done: call ``write``. Errors as ``write``."""
        self._check_open()
        h = self._handle(fh)
        if not h.writable:
            raise NotOpenForWriting(fh)
        if h.append:
            return None
        return self._inodes[h.ino].writer.try_write(offset, data)

    def read(self, fh: int, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (short only at EOF; holes read as zeros)."""
        data = self.read_buffer(fh, offset, size)
        return data if isinstance(data, bytes) else bytes(data)

    def read_buffer(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        """``read``, as a read-only buffer: a view of the read cache when the range
        lies in one cached extent (no copy; what the FUSE layer replies with)."""
        h = self._reading(fh)
        if size <= 0:
            return b""
        state = self._inodes.get(h.ino)
        if state is not None and state.writer.overlaps(offset, size):
            with state.writer.lock:
                if state.writer.overlaps(offset, size):
                    state.writer.flush()
        sequential = h.read_state.observe(offset, size)
        for attempt in (0, 1):
            pieces = self._map(h.ino, offset, size)
            try:
                data = assemble(pieces, self.cache, offset, size)
                break
            except SliceMissing:
                # Compaction or truncate elsewhere replaced the slices we had mapped.
                if attempt:
                    raise
                self._bump(h.ino)
        if sequential:
            self._readahead(h, offset + len(data))
        return data

    def try_read(self, fh: int, offset: int, size: int) -> bytes | memoryview | None:
        """``read`` if it needs neither the metadata nor a drive: the range's map
        is in this client's window and every byte in the extent cache (what
        sequential read-ahead prepares). Returns the bytes (a view of the cache
        when the range lies in one extent: no copy), or None having done
        nothing but note the access: call ``read``. Errors as ``read``."""
        h = self._reading(fh)
        if size <= 0:
            return b""
        state = self._inodes.get(h.ino)
        if state is not None and state.writer.overlaps(offset, size):
            return None
        pieces = self._cached_map(h.ino, offset, offset + size)
        if pieces is None:
            return None
        sid = pieces[0].slice_id if len(pieces) == 1 else None
        if sid is not None:
            p = pieces[0]
            data: bytes | memoryview | None = self.cache.peek(sid, p.slice_offset, p.length)
            if data is None or len(data) != p.length:
                return None
        else:
            out = bytearray()
            for p in pieces:
                part = (bytes(p.length) if p.slice_id is None
                        else self.cache.peek(p.slice_id, p.slice_offset, p.length))
                if part is None or len(part) != p.length:
                    return None
                out += part
            data = bytes(out)
        if h.read_state.observe(offset, size):
            self._readahead(h, offset + len(data))
        return data

    def _reading(self, fh: int) -> FileHandle:
        """The handle ``fh``, open for reading (else NotOpenForReading)."""
        self._check_open()
        h = self._handle(fh)
        if not h.readable:
            raise NotOpenForReading(fh)
        return h

    def _cached_map(self, ino: int, offset: int, end: int) -> list[ReadPiece] | None:
        """The pieces of ``[offset, end)`` from the map window, if it covers them."""
        with self._lock:
            window = self._maps.get(ino)
            gen = self._gen.get(ino, self._gen_floor)
        if window is not None and window.gen == gen and window.start <= offset and end <= window.end:
            return _cut(window.pieces, offset, end)
        return None

    def _map(self, ino: int, offset: int, length: int) -> list[ReadPiece]:
        end = offset + length
        pieces = self._cached_map(ino, offset, end)
        if pieces is not None:
            return pieces
        with self._lock:
            gen = self._gen.get(ino, self._gen_floor)
        fetch = max(length, self.config.readahead_bytes)
        pieces = self.meta.read_map(ino, offset, fetch)
        covered = offset + sum(p.length for p in pieces)
        if covered >= offset + fetch:  # a window that ends at EOF could grow: keep only full ones
            with self._lock:
                if self._gen.get(ino, self._gen_floor) == gen:
                    if len(self._maps) >= INODE_MEMO_ENTRIES:
                        self._maps.clear()  # a cache: bounded, refetched on demand
                    self._maps[ino] = MapWindow(gen, offset, covered, pieces)
        return _cut(pieces, offset, end)

    def _readahead(self, h: FileHandle, position: int) -> None:
        target = position + self.config.readahead_bytes
        state = h.read_state
        if state.prefetched_until >= target - self.config.read_extent:
            return
        start = max(position, state.prefetched_until)
        try:
            # Not through the map cache: its window stays on the read cursor.
            pieces = self.meta.read_map(h.ino, start, target - start)
        except FsError:
            return
        prefetch_pieces(pieces, self.cache)
        state.prefetched_until = target

    def _read_slice(self, slice_id: int, offset: int, length: int) -> memoryview:
        return self.node.read_view(slice_id, offset, length)

    def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        """Mode 0 only: grow the size to ``offset + length`` if below (holes read
        as zeros; space is taken when written). Other modes: EOPNOTSUPP."""
        self._check_open()
        h = self._handle(fh)
        if mode != 0:
            raise UnsupportedFallocate(mode)
        if offset < 0 or length <= 0:
            raise FsError(errno.EINVAL, f"fallocate offset {offset} length {length}")
        if not h.writable:
            raise NotOpenForWriting(fh)
        state = self._inodes[h.ino]
        with state.writer.lock:
            current = max(self.meta.getattr(h.ino).size, state.writer.buffered_end())
            new_size = offset + length
            if new_size <= current:
                return
            if new_size - current > self.node.stats().free_bytes:
                raise NodeFull(0, None, f"fallocate of {new_size - current} bytes")
            state.writer.flush()
            attr = self.meta.truncate(h.ino, new_size)
            state.writer.note_committed_size(attr.size)
        self._bump(h.ino)

    # ================================================================== slices <-> meta
    def _register_slice(self, slice_id: int, drive_id: int, group: int) -> None:
        self.meta.add_slice(
            SliceInfo(
                id=slice_id,
                length=0,
                group=group,
                state=SliceState.WRITING,
                replicas=(Replica(LOCAL_SERVER, str(drive_id)),),
            )
        )

    def _commit_slice(self, finished: FinishedSlice, file_end: int) -> None:
        attr = self.commits.commit(finished, file_end)
        self._bump(finished.ino)
        state = self._inodes.get(finished.ino)
        if state is not None:
            state.stamp = (attr.mtime_ns, attr.ctime_ns, attr.size)
        if state is not None and self.config.compaction:
            n = state.commits_per_chunk.get(finished.chunk_index, 0) + 1
            state.commits_per_chunk[finished.chunk_index] = n
            if n >= self.config.compact_threshold:
                state.commits_per_chunk[finished.chunk_index] = 0
                with self._lock:
                    self._compact_queue.append((finished.ino, finished.chunk_index))
                self._wake.set()

    # ================================================================== directories
    def opendir(self, ino: int, ctx: Ctx = ROOT_CTX) -> int:
        self._check_open()
        attr = self.meta.getattr(ino)
        if not attr.is_dir:
            raise FsError(errno.ENOTDIR, f"inode {ino} is not a directory", ino=ino)
        if not ctx.is_root:
            self.meta.access(ctx, ino, os.R_OK)
        with self._lock:
            fh = self._new_fh()
            self._dirs[fh] = DirHandle(fh, ino, ctx)
        return fh

    def readdir(self, fh: int, start_cookie: int = 0) -> Iterator[DirEntry]:
        """Entries after ``start_cookie`` in cookie order ('.' and '..' excluded)."""
        self._check_open()
        d = self._dirs.get(fh)
        if d is None:
            raise BadHandle(fh, "directory")
        cookie = start_cookie
        while True:
            batch = self.meta.readdir(d.ino, cookie, 1024, d.ctx)
            for entry in batch:
                self._note_parent(entry.ino, d.ino)
                if entry.ino in self._inodes:
                    entry = dataclasses.replace(entry, attr=self._with_buffered_size(entry.attr))
                yield entry
            if len(batch) < 1024:
                return
            cookie = batch[-1].cookie

    def releasedir(self, fh: int) -> None:
        with self._lock:
            if self._dirs.pop(fh, None) is None:
                raise BadHandle(fh, "directory")

    def fsyncdir(self, fh: int, datasync: bool = False) -> None:
        """Make the directory's changes (creates, renames, unlinks: metadata
        transactions) durable against power loss before returning: what
        ``rename`` + ``fsync(dir)`` — the atomic checkpoint commit — relies on."""
        self._check_open()
        if fh not in self._dirs:
            raise BadHandle(fh, "directory")
        self.meta.sync()

    # ================================================================== misc
    def statfs(self, ctx: Ctx = ROOT_CTX) -> StatFs:
        """Capacity and free space of the drives (store stats); inode counts from meta."""
        self._check_open()
        stats = self.node.stats()
        counted = self.meta.statfs(stats.capacity_bytes)
        return StatFs(
            block_size=counted.block_size,
            capacity_bytes=stats.capacity_bytes,
            used_bytes=stats.capacity_bytes - stats.free_bytes,
            free_bytes=stats.free_bytes,
            inodes=counted.inodes,
            inodes_free=counted.inodes_free,
            name_max=counted.name_max,
        )

    def getxattr(self, ino: int, name: bytes, ctx: Ctx = ROOT_CTX) -> bytes:
        """An xattr's value; ENODATA when absent. ``security.capability``'s absence
        is remembered for ``NO_CAPS_TTL`` s (another client's set may show that late)."""
        self._check_open()
        if name != CAPS_XATTR:
            return self.meta.getxattr(ino, name, ctx)
        now = time.monotonic()
        with self._lock:
            until = self._no_caps.get(ino)
        if until is not None and now < until:
            raise FsError(errno.ENODATA, f"no xattr {name!r} on inode {ino}", ino=ino)
        try:
            return self.meta.getxattr(ino, name, ctx)
        except FsError as exc:
            if exc.errno == errno.ENODATA:
                self._note_no_caps(ino, now)
            raise

    def _note_no_caps(self, ino: int, now: float) -> None:
        with self._lock:
            self._no_caps[ino] = now + NO_CAPS_TTL

    def _forget_no_caps(self, ino: int) -> None:
        with self._lock:
            self._no_caps.pop(ino, None)

    def setxattr(self, ino: int, name: bytes, value: bytes, flags: int = 0, ctx: Ctx = ROOT_CTX) -> None:
        self._check_open()
        self._forget_no_caps(ino)
        self.meta.setxattr(ino, name, value, flags, ctx)

    def listxattr(self, ino: int, ctx: Ctx = ROOT_CTX) -> list[bytes]:
        self._check_open()
        return self.meta.listxattr(ino, ctx)

    def removexattr(self, ino: int, name: bytes, ctx: Ctx = ROOT_CTX) -> None:
        self._check_open()
        self._forget_no_caps(ino)
        self.meta.removexattr(ino, name, ctx)

    def access(self, ino: int, mode: int, ctx: Ctx = ROOT_CTX) -> None:
        self._check_open()
        self.meta.access(ctx, ino, mode)

    def stats(self) -> dict[str, int]:
        """Client counters (tests and benchmarks)."""
        return {
            "buffered_bytes": self._budget.used,
            "drive_reads": self.cache.drive_reads,
            "drive_read_bytes": self.cache.drive_bytes,
            "cache_hits": self.cache.hits,
            "deleted_slices": self.deleted_slices,
            "compactions": self.compactions,
            "open_handles": len(self._handles),
            # Per-inode tables that outlive handles (bounded by INODE_MEMO_ENTRIES).
            "map_windows": len(self._maps),
            "map_generations": len(self._gen),
        }

    # ================================================================== background work
    def _maintenance_loop(self) -> None:
        last_heartbeat = last_scan = last_janitor = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(self.config.deletion_interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.drain_closes()
                if self.config.deletion_consumer:
                    self.run_deletions()
                self._run_queued_compactions()
                interval = self.config.compaction_scan_interval
                if self.config.compaction and interval and time.monotonic() - last_scan > interval:
                    # Chunks fragmented by any client (or by this one before a restart).
                    self.compact_fragmented()
                    last_scan = time.monotonic()
                janitor = self.config.janitor_interval
                if janitor and time.monotonic() - last_janitor > janitor:
                    self.run_janitor()
                    last_janitor = time.monotonic()
                if time.monotonic() - last_heartbeat > HEARTBEAT_INTERVAL:
                    self._heartbeat()
                    # Sessions of crashed clients release their unlinked-open files.
                    self.meta.expire_sessions(self.config.session_timeout)
                    last_heartbeat = time.monotonic()
                self.meta_backup.maybe_write()
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("maintenance pass failed; retrying later")

    def _heartbeat(self) -> None:
        """Keep the session alive; if it expired (this process stalled past the
        timeout), register again and re-open the inodes this client holds."""
        try:
            self.meta.heartbeat(self.session)
        except FsError as exc:
            if exc.errno != errno.ESTALE:
                raise
            log.warning("session %d expired; registering again", self.session)
            self.session = self.meta.register_session(self._session_info)
            with self._lock:
                held = [(ino, state.handles) for ino, state in self._inodes.items()]
            for ino, handles in held:
                for _ in range(handles):
                    try:
                        self.meta.open_file(self.session, ino)
                    except FsError:
                        log.warning("inode %d was freed while the session was expired", ino)
                        break

    def run_janitor(self, older_than_s: float | None = None, limit: int = 1000) -> int:
        """Queue for deletion the WRITING slices left by crashed clients; returns the count.

        A slice registered (``add_slice``) more than ``older_than_s`` ago
        (default ``config.abandoned_slice_age``) and never committed belongs to
        a writer that died mid-slice: meta's ``discard_slices`` queues it (only
        while it is still WRITING with no reference), and the deletion
        consumer then deletes its bytes from the drives its replicas name.
        Slices this client is writing right now are never discarded.
        """
        self._check_open()
        age = self.config.abandoned_slice_age if older_than_s is None else older_than_s
        with self._lock:
            writers = [state.writer for state in self._inodes.values()]
        mine = {sid for w in writers for sid in w.slice_ids_in_progress()}
        candidates = [i.id for i in self.meta.abandoned_slices(age, limit) if i.id not in mine]
        if not candidates:
            return 0
        queued = self.meta.discard_slices(candidates)
        if queued:
            log.info("janitor: %d abandoned slices queued for deletion", len(queued))
            self._wake.set()
        return len(queued)

    def run_deletions(self) -> int:
        """Delete the slices queued by meta from their drives, then acknowledge them.

        Deletes are made durable on the drives before the acknowledgment, so a
        crash never forgets a slice that still holds space. One pass at a time:
        a call made while the maintenance thread runs one waits for it, so on
        return everything queued before the call is deleted. Returns the count.
        """
        self.drain_closes()  # files freed by closes queued so far are deleted too
        with self._deletion_lock:  # a concurrent pass holds leases: wait for it to finish
            return self._run_deletions_locked()

    def _run_deletions_locked(self) -> int:
        total = 0
        while True:
            batch = self.meta.pop_deletions(self.config.deletion_batch)
            if not batch:
                return total
            done: list[int] = []
            drives: set[int] = set()
            for info in batch:
                try:
                    local = [int(r.drive) for r in info.replicas if r.server == LOCAL_SERVER]
                    if not local:  # no replica recorded (crash before add_slice): ask every drive
                        self.node.delete(info.id)
                        drives.update(self.node.drive_ids)
                    for drive_id in local:
                        if drive_id in self.node.drive_ids:
                            self.node.delete(info.id, drive_id)
                            drives.add(drive_id)
                    self.cache.drop_slice(info.id)
                    done.append(info.id)
                except Exception:
                    log.exception("deleting slice %#x failed; it stays queued", info.id)
            if drives or done:
                self.node.flush(sorted(drives) if drives else None)
            self.meta.ack_deletions(done)
            total += len(done)
            self.deleted_slices += len(done)
            if len(batch) < self.config.deletion_batch:
                return total

    def _run_queued_compactions(self) -> None:
        """Compact the chunks this client's commits flagged; a chunk that changed
        while being compacted (its writer is still busy) is retried a few times."""
        while True:
            with self._lock:
                if not self._compact_queue:
                    return
                ino, chunk_index = self._compact_queue.pop(0)
            for attempt in range(COMPACTION_ATTEMPTS):
                try:
                    if self.compact_chunk(ino, chunk_index):
                        break
                except FsError as exc:
                    log.info("compaction of inode %d chunk %d skipped: %s", ino, chunk_index, exc)
                    break
                if len(self.meta.get_chunk(ino, chunk_index).refs) < 2 or self._stop.wait(
                    0.1 * (attempt + 1)
                ):
                    break

    def compact_chunk(self, ino: int, chunk_index: int) -> bool:
        """Rewrite a fragmented chunk as one sequential slice (optimistic swap).

        Reads the chunk's overlay, writes its live bytes into one new slice
        (holes stay holes), makes it durable, then ``replace_chunk`` at the
        version read. Returns False when the chunk had < 2 references or
        changed meanwhile (the new slice is then deleted). Old slices are
        dereferenced by meta and deleted by the deletion consumer.
        """
        self._check_open()
        chunk = self.meta.get_chunk(ino, chunk_index)
        if len(chunk.refs) < 2:
            return False
        base = chunk_index * self.chunk_size
        end = max(r.chunk_offset + r.length for r in chunk.refs)
        pieces = self.meta.read_map(ino, base, end)
        runs: list[tuple[int, int]] = []  # (chunk_offset, length) of live runs
        for p in pieces:
            if p.slice_id is None:
                continue
            offset = p.file_offset - base
            if runs and runs[-1][0] + runs[-1][1] == offset:
                runs[-1] = (runs[-1][0], runs[-1][1] + p.length)
            else:
                runs.append((offset, p.length))
        if not runs:
            return False
        slice_id = self.meta.next_slice_id()
        state = self._inodes.get(ino)
        group = (
            state.writer.group
            if state is not None and state.writer.group is not None
            else self.groups.group_for(ino, self._parents.get(ino), small=False)
        )
        drive_id: int | None = None
        written = 0
        refs: list[SliceRef] = []
        try:
            for run_offset, run_length in runs:
                refs.append(SliceRef(slice_id, run_offset, run_length, written))
                pos = 0
                while pos < run_length:
                    n = min(self.config.piece_size, run_length - pos)
                    data = assemble(
                        _cut(pieces, base + run_offset + pos, base + run_offset + pos + n),
                        DirectReader(self._read_slice),
                        base + run_offset + pos,
                        n,
                    )
                    first = drive_id is None
                    drive_id = self.node.write(slice_id, written, data, group, drive_id=drive_id)
                    if first:
                        self._register_slice(slice_id, drive_id, group)
                    written += n
                    pos += n
            assert drive_id is not None
            self.node.flush([drive_id])
            self.meta.replace_chunk(
                ino, chunk_index, chunk.version, refs, group=group, slice_length=written
            )
        except (ChunkChanged, SliceMissing):
            if drive_id is not None:
                self.node.delete(slice_id, drive_id)
            return False
        self.node.forget(slice_id)
        self._bump(ino)
        self.compactions += 1
        self._wake.set()
        return True

    def compact_fragmented(self, min_refs: int | None = None, limit: int = 100) -> int:
        """Compact every chunk meta reports with at least ``min_refs`` references."""
        count = 0
        threshold = min_refs or self.config.compact_threshold
        for info in self.meta.compaction_candidates(threshold, limit):
            if self.compact_chunk(info.ino, info.chunk_index):
                count += 1
        return count

    # ================================================================== life cycle
    def _stop_background(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._maintenance.is_alive() and threading.current_thread() is not self._maintenance:
            self._maintenance.join(timeout=30)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._settler.shutdown(wait=True, cancel_futures=True)

    def shutdown(self) -> None:
        """Commit every buffered byte, close every handle, delete queued slices,
        end the session, close the drives and meta. Idempotent; raises the first
        error after finishing the rest."""
        if self._closed:
            return
        errors: list[BaseException] = []
        for fh in list(self._handles):
            try:
                self.release(fh)
            except BaseException as exc:
                errors.append(exc)
        self._dirs.clear()
        self._stop_background()
        self._closed = True
        for step in (
            self.drain_closes,
            lambda: self.meta.unregister_session(self.session),
            self.run_deletions if self.config.deletion_consumer else (lambda: 0),
            self.node.close,
            self.meta.close,
        ):
            try:
                step()
            except BaseException as exc:
                log.exception("shutdown step failed")
                errors.append(exc)
        if errors:
            raise errors[0]

    def abandon(self) -> None:
        """Simulate the death of this process (crash tests): stop background work,
        drop buffered bytes, release the drive locks WITHOUT flushing anything,
        leave the session registered. Only what was durable survives."""
        if self._closed:
            return
        self._stop_background()
        self._closed = True
        for state in list(self._inodes.values()):
            state.writer.abandon()
        self.node.abandon()
        try:
            self.meta.close()
        except Exception:
            log.debug("closing meta after abandon", exc_info=True)

    def __enter__(self) -> VFS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

