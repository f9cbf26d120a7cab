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

Rooms: handles in ``client.handles``, per-inode state and map windows in
``client.inodes``, open/close in ``client.openfiles``, the write and read
paths in ``client.writepath`` and ``client.readpath``; the background jobs
(deferred closes, deletions, compaction, janitor, session) and their
scheduler in ``client.background``. The VFS builds them, wires them and
keeps the file operations: it checks the client is open and the handle is
fit for the call, then delegates.

Threads: the caller's threads run every operation; the maintenance thread
(``BackgroundScheduler``) drains deferred closes, consumes the deletion
queue, compacts fragmented chunks, runs the janitor and heartbeats the
session; ``io_threads`` pool threads run readahead; ``commit_threads``
settle slices ended while writing. Lock order (outer first): a file's
``FileWriter.lock`` -> the handle, inode, close and compaction tables' locks
(never held across I/O) -> the map cache's lock -> the extent cache's lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import shinglefs
from shinglefs.client.background import ClientJobs
from shinglefs.client.config import ClientConfig
from shinglefs.client.errors import (
    BadHandle,
    ClientClosed,
    ForkedClient,
    NotOpenForReading,
    NotOpenForWriting,
    UnsupportedFallocate,
)
from shinglefs.client.groups import GroupPolicy
from shinglefs.client.handles import FileHandle, HandleTable
from shinglefs.client.inodes import DirNames, InodeTable
from shinglefs.client.openfiles import OpenFiles
from shinglefs.client.reader import ExtentCache
from shinglefs.client.readpath import ReadPath
from shinglefs.client.writepath import WritePath
from shinglefs.meta.api import (
    RENAME_EXCHANGE,
    ROOT_CTX,
    ROOT_INO,
    Ctx,
    DirEntry,
    InodeAttr,
    MetaStore,
    SessionInfo,
    StatFs,
)
from shinglefs.meta.errors import FsError, MetaUnavailable
from shinglefs.server.errors import NodeFull
from shinglefs.server.node import Declined, SliceNode

log = logging.getLogger(__name__)

__all__ = ["VFS", "Ctx", "Declined", "DirEntry", "InodeAttr", "SetAttrChanges", "StatFs"]

# The kernel asks for this xattr before every write(2) (to strip file
# capabilities). Its absence, learned at create or from a miss, is trusted for
# NO_CAPS_TTL seconds (``client.inodes``): one metadata query a second instead
# of one per write.
CAPS_XATTR = b"security.capability"


@dataclass
class TierMove:
    """What ``VFS.move_to_tier`` did: files whose directory sets a tier, chunks
    rewritten onto it, chunks left because they changed meanwhile, chunks left
    because the tier's drives had no room for them."""

    files: int = 0
    chunks: int = 0
    skipped: int = 0
    no_room: int = 0


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

    def apply(self, meta: MetaStore, ino: int, ctx: Ctx, *, open_for_write: bool,
              checked: bool) -> InodeAttr:
        """Make the changes in meta (``MetaStore.setattr``); returns the new attributes."""
        return meta.setattr(
            ino,
            mode=self.mode,
            uid=self.uid,
            gid=self.gid,
            size=self.size,
            atime_ns=self.atime_ns,
            mtime_ns=self.mtime_ns,
            ctx=ctx,
            open_for_write=open_for_write,
            checked=checked,
        )


# This process's pid, kept up to date across forks: every VFS call compares it
# with its opener's (``_check_open``) without a getpid system call.
_this_process = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _this_process.__setitem__(0, os.getpid()))


class VFS:
    """File operations as metadata transactions plus slice I/O. Thread-safe."""

    def __init__(
        self,
        meta: MetaStore,
        node: SliceNode,
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
        self.handles = HandleTable()
        self.inodes = InodeTable()  # bounded by inodes.INODE_MEMO_ENTRIES
        self.dir_names = DirNames()
        self._pool = ThreadPoolExecutor(self.config.io_threads, thread_name_prefix="shinglefs-io")
        self.cache = ExtentCache(
            self._read_slice,
            extent=self.config.read_extent,
            capacity=self.config.read_cache_bytes,
            pool=self._pool,
            hint=self.node.prefetch,
        )
        self.reads = ReadPath(meta, self.cache, self.inodes, self.config)
        self.jobs = ClientJobs(
            meta, node, self.config, chunk_size=self.chunk_size, inodes=self.inodes,
            groups=self.groups, cache=self.cache, read_slice=self._read_slice,
            dir_names=self.dir_names,
            session=SessionInfo(
                host=socket.gethostname(),
                pid=os.getpid(),
                mountpoint=mountpoint,
                version=shinglefs.__version__,
            ),
        )
        self.writes = WritePath(
            meta, node, self.config, chunk_size=self.chunk_size, inodes=self.inodes,
            groups=self.groups, on_commit=self.jobs.compactor.note_commit,
            in_doubt=self.jobs.in_doubt.note,
        )
        self.files = OpenFiles(
            meta, handles=self.handles, inodes=self.inodes, writes=self.writes,
            session=lambda: self.jobs.session.id, closes=self.jobs.closes,
            deferred=self.config.deferred_close, wake=self.jobs.wake,
        )
        self.meta_backup = self.jobs.backup
        # Run first by shutdown and abandon: what serves this client's drives
        # to other processes (server/share.py) stops before they close.
        self.before_close: list[Callable[[], None]] = []
        self._closed = False
        self.pid = _this_process[0]  # the process whose threads and session these are
        self.jobs.start()

    # ================================================================== helpers
    @property
    def closed(self) -> bool:
        """True after ``shutdown`` or ``abandon``."""
        return self._closed

    @property
    def session(self) -> int:
        """This client's session id in meta (renewed if it ever expired)."""
        return self.jobs.session.id

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed()
        if self.pid != _this_process[0]:
            raise ForkedClient(self.pid)

    @property
    def inherited(self) -> bool:
        """Opened by the parent of this forked process: unusable here."""
        return self.pid != _this_process[0]

    # ================================================================== namespace
    def lookup(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        self._check_open()
        attr = self.meta.lookup(parent, name, ctx)
        if name not in (b".", b".."):
            self.inodes.note_parent(attr.ino, parent)
        self.inodes.dirs.put(attr)  # a directory's, as read: creates in it start from it
        return self.writes.with_buffered_size(attr)

    def forget(self, ino: int, nlookup: int) -> None:
        """The kernel dropped ``nlookup`` references (and with them its cached
        pages). Data is never freed here: the metadata engine frees unlinked
        inodes on their last close (sessions). Drops this client's memos."""
        self.inodes.forget(ino)

    def getattr(self, ino: int, *, cached: bool = False, wait: bool = True) -> InodeAttr:
        """Attributes from meta; ``size`` includes this client's buffered writes.
        ``cached`` (the kernel's getattr): a directory's attributes may come
        from ``InodeTable.dirs`` (at most ``DIR_ATTRS_TTL`` old, kept current
        with this client's own entries). ``wait=False``: only that, else
        ``Declined`` having done nothing."""
        self._check_open()
        if cached:
            attr = self.inodes.dirs.get(ino)
            if attr is not None:
                return attr
        if not wait:
            raise Declined()
        try:
            attr = self.meta.getattr(ino)
        except FsError as exc:
            removed = self.inodes.removed_dirs.get(ino) if exc.errno == errno.ENOENT else None
            if removed is None:
                raise
            return removed
        self.inodes.dirs.put(attr)
        return self.writes.with_buffered_size(attr)

    def setattr(
        self, ino: int, changes: SetAttrChanges, fh: int | None = None, ctx: Ctx = ROOT_CTX,
        *, checked: bool = False,
    ) -> InodeAttr:
        """Change attributes; a size or mtime change first commits this client's
        buffered writes (their commit would otherwise set mtime to "now" after
        it: ``cp -p``, ``tar x`` and ``rsync -t`` set times before closing).

        ``fh``, a handle opened for writing, grants a size change (ftruncate);
        ``checked``: the kernel already applied the permission rules (see
        ``MetaStore.setattr``).
        """
        self._check_open()
        handle = self.handles.find_file(fh) if fh is not None else None
        by_fd = handle is not None and handle.writable

        self.dir_names.clear()  # a directory's mode or owner may change
        self.inodes.dirs.clear()

        def change() -> InodeAttr:
            return changes.apply(self.meta, ino, ctx, open_for_write=by_fd, checked=checked)

        if changes.size is not None or changes.mtime_ns is not None:
            return self.writes.after_commit(ino, change)
        return self.writes.with_buffered_size(change())

    def readlink(self, ino: int, ctx: Ctx = ROOT_CTX) -> bytes:
        self._check_open()
        return self.meta.readlink(ino)

    def mknod(self, parent: int, name: bytes, mode: int, rdev: int, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        self._check_open()
        attr = self.meta.mknod(parent, name, mode, rdev, ctx)
        self.inodes.note_made(attr, parent)
        self.jobs.retention.note(parent)
        return attr

    def mkdir(self, parent: int, name: bytes, mode: int, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        self._check_open()
        attr = self.meta.mkdir(parent, name, mode, ctx)
        self.inodes.note_made(attr, parent, links=1)
        self.jobs.retention.note(parent)
        return attr

    def unlink(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> None:
        """Remove a name. An inode still open anywhere stays usable until its last close."""
        self._check_open()
        self.inodes.dirs.clear()
        result = self.meta.unlink(parent, name, ctx)
        if result.released:
            self.jobs.wake()

    def rmdir(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> None:
        self._check_open()
        self.dir_names.clear()
        self.inodes.dirs.clear()
        self._removed_dir(self.meta.rmdir(parent, name, ctx).attr)

    def _removed_dir(self, attr: InodeAttr) -> None:
        """Remember a directory this client removed (``InodeTable.removed_dirs``)."""
        self.inodes.removed_dirs[attr.ino] = dataclasses.replace(attr, nlink=0)

    def symlink(self, parent: int, name: bytes, target: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        self._check_open()
        attr = self.meta.symlink(parent, name, target, ctx)
        self.inodes.note_made(attr, parent)
        self.jobs.retention.note(parent)
        return attr

    def rename(self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes,
               flags: int = 0, ctx: Ctx = ROOT_CTX) -> None:
        """Atomic rename (replacing the target); see ``MetaStore.rename``."""
        self._check_open()
        self.dir_names.clear()
        self.inodes.dirs.clear()
        result = self.meta.rename(parent_old, name_old, parent_new, name_new, flags, ctx)
        if result.replaced is not None and result.replaced.is_dir \
                and not flags & RENAME_EXCHANGE:
            self._removed_dir(result.replaced)
        self.inodes.note_parent(result.ino, parent_new)
        self.jobs.retention.note(parent_new)
        if result.released:
            self.jobs.wake()

    def link(self, ino: int, new_parent: int, new_name: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        self._check_open()
        self.inodes.dirs.clear()
        attr = self.meta.link(ino, new_parent, new_name, ctx)
        self.jobs.retention.note(new_parent)
        return self.writes.with_buffered_size(attr)

    def snapshot(self, src: int, parent: int, name: bytes, ctx: Ctx = ROOT_CTX, *,
                 read_only: bool = False) -> InodeAttr:
        """``MetaStore.snapshot``: ``name`` in ``parent`` becomes a copy of ``src``
        sharing its slices, holding what this client would read now: its own
        buffered writes are committed first (another client's are not in it
        until that client closes or fsyncs). A file whose bytes fail to store
        meanwhile is not this call's error: its own next call reports it (and
        the copy holds what that file had committed)."""
        self._check_open()
        for writer in self.inodes.writers():
            writer.flush_for_another()
        self.inodes.dirs.clear()
        attr = self.meta.snapshot(src, parent, name, ctx, read_only=read_only)
        self.jobs.retention.note(parent)
        return attr

    def make_writable(self, ino: int, ctx: Ctx = ROOT_CTX) -> int:
        """``MetaStore.make_writable``: the read-only snapshot at ``ino`` becomes
        an ordinary tree; returns how many of its inodes were immutable."""
        self._check_open()
        self.inodes.dirs.clear()
        return self.meta.make_writable(ino, ctx)

    def snapshot_path(self, src: bytes, parent: int, name: bytes, ctx: Ctx = ROOT_CTX, *,
                      read_only: bool = False) -> InodeAttr:
        """``snapshot`` of the entry at ``src``, an absolute path inside the file
        system looked up as ``ctx`` (search permission on each directory; no
        symlink followed, the last one copied as a link)."""
        ino = ROOT_INO
        for part in (p for p in src.split(b"/") if p):
            ino = self.lookup(ino, part, ctx).ino
        return self.snapshot(ino, parent, name, ctx, read_only=read_only)

    def move_to_tier(self, ino: int, ctx: Ctx = ROOT_CTX) -> TierMove:
        """The tier mover (docs/cluster.md, "Tiers"): every chunk of the files
        at or below ``ino`` holding a slice with no copy on a drive of its
        file's tier (``placement_tiers``) is rewritten as one new slice, which
        placement puts on the tier's drives (the compactor's optimistic swap:
        a chunk written meanwhile is left as it is, ``skipped``). A chunk
        the tier's drives have no room for is left where it is (``no_room``):
        once placement has put one rewritten chunk on another tier (the tier
        is a preference, never an error), the rest for that tier are not
        rewritten at all. The old slices are freed once
        nothing names them (a snapshot still may). Inline data (in meta)
        stays. Returns what it did; EPERM unless ``ctx`` is root or owns
        ``ino``; ENOENT; ENOSPC when the drives of every tier are full."""
        self._check_open()
        top = self.meta.getattr(ino)
        if ctx.uid not in (0, top.uid):
            raise FsError(errno.EPERM, f"only the owner moves the data of {ino}", ino=ino)
        move = TierMove()
        if len(self.node.tiers_offered()) < 2:
            return move  # one tier: nothing can be elsewhere
        compactor = self.jobs.compactor
        full: set[str] = set()  # tiers whose drives had no room for a chunk
        pending = [top]
        while pending:
            attr = pending.pop()
            if attr.is_dir:
                cookie = 0
                while page := self.meta.readdir(attr.ino, cookie):
                    pending.extend(e.attr for e in page)
                    cookie = page[-1].cookie
                continue
            if not attr.is_file:
                continue
            tier = self.meta.placement_tiers([attr.ino]).get(attr.ino)
            if tier is None or tier not in self.node.tiers_offered():
                continue
            move.files += 1
            self.node.forget_tier(attr.ino)
            for index in range(-(-attr.size // self.chunk_size)):
                if not self._chunk_elsewhere(attr.ino, index, tier):
                    continue
                if tier in full:
                    move.no_room += 1
                elif not compactor.compact_chunk(attr.ino, index, min_refs=1):
                    move.skipped += 1
                elif self._chunk_elsewhere(attr.ino, index, tier):
                    # Placement found no room on the tier (a preference) and
                    # put the copy elsewhere: the tier is full for this move.
                    move.no_room += 1
                    full.add(tier)
                else:
                    move.chunks += 1
        return move

    def _chunk_elsewhere(self, ino: int, index: int, tier: str) -> bool:
        """Whether a slice of chunk ``index`` of ``ino`` has no copy on a drive of
        ``tier`` but one on another tier's (inline slices have none). One copy
        on the tier is enough: with two copies and one server holding the
        tier's drives, the other copy cannot be there too."""
        for sid in {r.slice_id for r in self.meta.get_chunk(ino, index).refs}:
            tiers = set()
            for replica in self.meta.get_slice(sid).replicas:
                drive = self.node.drive_of_replica(replica)
                if drive is not None:
                    tiers.add(self.node.tier_of_drive(drive))
            if tier not in tiers and tiers - {None}:
                return True
        return False

    # ================================================================== open / close
    def open(self, ino: int, flags: int, ctx: Ctx = ROOT_CTX) -> int:
        """Open an inode; returns a file handle. O_TRUNC truncates (with write access).

        Close-to-open: the handle sees everything closed by other clients before
        this call; ``open_file_info(fh)`` says whether the kernel cache may be kept.
        """
        self._check_open()
        return self.files.open(ino, flags, ctx)

    def open_file_info(self, fh: int) -> bool:
        """keep_cache for the handle: True when the kernel page cache may be kept
        (the file did not change since this client last cached it)."""
        return self.handles.file(fh).keep_cache

    def opened_stamp(self, fh: int) -> tuple[int, int, int] | None:
        """Meta's ``(mtime_ns, ctime_ns, size)`` of the handle's file when it was
        opened (None: not known)."""
        return self.handles.file(fh).stamp

    def changed_since_open(self, ino: int) -> bool:
        """Has ``ino`` changed (mtime, ctime or size in meta) since this client last cached it?"""
        return self.files.changed_since_open(ino)

    def create(
        self, parent: int, name: bytes, mode: int, flags: int, ctx: Ctx = ROOT_CTX
    ) -> tuple[int, InodeAttr]:
        """Create (O_EXCL: exclusively) and open a regular file in one transaction."""
        self._check_open()
        opened = self.files.create(parent, name, mode, flags, ctx)
        self.jobs.retention.note(parent)
        return opened

    def written_ns(self, ino: int) -> int | None:
        """The time of the last write to ``ino`` through this client while it is
        open here (None: not open, or not written): the mtime its buffered bytes
        commit with, so a stat before close can show what one after will."""
        writer = self.inodes.writer(ino)
        return None if writer is None else writer.written_ns

    def flush(self, fh: int, *, wait: bool = True) -> None:
        """close(2) of a descriptor: commit buffered writes (close-to-open).

        ``wait=False``: only if it needs no other thread (nothing buffered, or
        a small file's bytes stored in this thread: ``FileWriter.flush``); else
        raises ``Declined`` having done nothing ``flush`` would not redo."""
        self._check_open()
        h = self.handles.file(fh)
        if h.writable:
            self.writes.flush(h.ino, wait=wait)

    def release(self, fh: int) -> None:
        """Last close of a handle: commit buffered writes, close the file in meta.

        An unlinked file whose last open this was is freed by meta; its slices
        are deleted by the maintenance thread. With ``deferred_close`` the close
        reaches meta with the next drain (``CloseQueue``). A write-back error is
        raised after the handle is released.
        """
        self._check_open()
        try:
            self.files.release(fh)
        finally:
            self.reads.forget(fh)

    def fsync(self, fh: int, datasync: bool = False) -> None:
        """Make the file's data AND metadata durable before returning (both flavours)."""
        self._check_open()
        h = self.handles.file(fh)
        # Commit buffered bytes (ordered: flushed on their drives first), then
        # make meta's commits durable (SQLite synchronous=NORMAL defers that).
        self.writes.flush(h.ino)
        self.meta.sync()

    # ================================================================== data
    def write(self, fh: int, offset: int, data: bytes | memoryview, *, wait: bool = True,
              from_kernel: bool = False) -> int:
        """Buffer ``data`` at ``offset`` (O_APPEND: at the end); returns the byte count.

        ``wait=False``: only if it completes at once, without waiting (the
        bytes fit the open slice's pending buffer: ``FileWriter.write``); else
        raises ``Declined`` with nothing done. Other errors as with ``wait``.
        ``from_kernel``: the mount's writes, which include the pages of shared
        mappings written back (``WritePath.write``)."""
        self._check_open()
        h = self.handles.file(fh)
        if not h.writable:
            raise NotOpenForWriting(fh)
        if not wait:
            return self.writes.write(h, offset, data, wait=False, from_kernel=from_kernel)
        try:
            return self.writes.write(h, offset, data, from_kernel=from_kernel)
        except NodeFull:
            # Files deleted a moment ago hold their space until the deletion
            # queue is drained: drain it now and try once more before ENOSPC
            # (even when this pass deleted nothing: a concurrent pass it waited
            # for may have freed the space).
            self.run_deletions()
            return self.writes.write(h, offset, data, from_kernel=from_kernel)

    def read(self, fh: int, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (short only at EOF; holes read as zeros)."""
        data = self.read_buffer(fh, offset, size)
        return data if isinstance(data, bytes) else bytes(data)

    def read_buffer(self, fh: int, offset: int, size: int, *,
                    wait: bool = True) -> bytes | memoryview:
        """``read``, as a read-only buffer: a view of the read cache when the range
        lies in one cached extent (no copy; what the FUSE layer replies with).

        ``wait=False``: only if it needs no drive: every byte is in the extent
        cache (what sequential read-ahead prepares) or in meta (an inline
        slice); the range's map may be asked of meta, so only a caller whose
        metadata is local asks this. Else raises ``Declined`` having done
        nothing but note the access. Other errors as with ``wait``."""
        return self.reads.read(self._reading(fh), offset, size, wait=wait)

    def _reading(self, fh: int) -> FileHandle:
        """The handle ``fh``, open for reading (else NotOpenForReading)."""
        self._check_open()
        h = self.handles.file(fh)
        if not h.readable:
            raise NotOpenForReading(fh)
        return h

    def _read_slice(self, slice_id: int, offset: int, length: int) -> memoryview:
        return self.node.read_view(slice_id, offset, length)

    def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        """Mode 0 only: grow the size to ``offset + length`` if below (holes read
        as zeros; space is taken when written). Other modes: EOPNOTSUPP."""
        self._check_open()
        h = self.handles.file(fh)
        if mode != 0:
            raise UnsupportedFallocate(mode)
        if offset < 0 or length <= 0:
            raise FsError(errno.EINVAL, f"fallocate offset {offset} length {length}")
        if not h.writable:
            raise NotOpenForWriting(fh)
        self.writes.allocate(h, offset + length)

    # ================================================================== directories
    def opendir(self, ino: int, ctx: Ctx = ROOT_CTX) -> int:
        """A handle on directory ``ino``; on one this client removed, an empty listing."""
        self._check_open()
        attr = self.getattr(ino)
        if not attr.is_dir:
            raise FsError(errno.ENOTDIR, f"inode {ino} is not a directory", ino=ino)
        if not ctx.is_root:
            self.meta.access(ctx, ino, os.R_OK)
        return self.handles.add_dir(ino, ctx)

    def readdir(self, fh: int, start_cookie: int = 0) -> Iterator[DirEntry]:
        """Entries after ``start_cookie`` in cookie order ('.' and '..' excluded)."""
        self._check_open()
        d = self.handles.dir(fh)
        cookie = start_cookie
        while True:
            try:
                batch = self.meta.readdir(d.ino, cookie, 1024, d.ctx)
            except FsError as exc:
                if exc.errno == errno.ENOENT and d.ino in self.inodes.removed_dirs:
                    return  # removed: empty, as Linux lists a removed directory
                raise
            for entry in batch:
                self.inodes.note_parent(entry.ino, d.ino)
                if entry.ino in self.inodes:
                    entry = dataclasses.replace(entry, attr=self.writes.with_buffered_size(entry.attr))
                yield entry
            if len(batch) < 1024:
                return
            cookie = batch[-1].cookie

    def releasedir(self, fh: int) -> None:
        self.handles.pop_dir(fh)

    def fsyncdir(self, fh: int, datasync: bool = False) -> None:
        """Make the directory's changes (creates, renames, unlinks: metadata
        transactions) durable against power loss before returning: what
        ``rename`` + ``fsync(dir)`` — the atomic checkpoint commit — relies on."""
        self._check_open()
        self.handles.dir(fh)
        self.meta.sync()

    # ================================================================== misc
    def statfs(self, ctx: Ctx = ROOT_CTX) -> StatFs:
        """The drives' capacity and what can still be written (store stats); the
        files' bytes (``used_bytes``: logical sizes) and inode counts (meta)."""
        self._check_open()
        stats = self.node.stats()
        counted = self.meta.statfs(stats.capacity_bytes)
        return StatFs(
            block_size=counted.block_size,
            capacity_bytes=stats.capacity_bytes,
            used_bytes=counted.used_bytes,
            free_bytes=stats.free_bytes,
            inodes=counted.inodes,
            inodes_free=counted.inodes_free,
            name_max=counted.name_max,
        )

    def getxattr(self, ino: int, name: bytes, ctx: Ctx = ROOT_CTX, *, wait: bool = True) -> bytes:
        """An xattr's value; ENODATA when absent. ``security.capability``'s absence is
        remembered for ``NO_CAPS_TTL`` s (another client's set may show that late);
        ``wait=False`` answers only that, else raises ``Declined``."""
        self._check_open()
        now = time.monotonic()
        if name == CAPS_XATTR and self.inodes.caps_absent(ino, now):
            raise FsError(errno.ENODATA, f"no xattr {name!r} on inode {ino}", ino=ino)
        if not wait:
            raise Declined
        if name != CAPS_XATTR:
            return self.meta.getxattr(ino, name, ctx)
        try:
            return self.meta.getxattr(ino, name, ctx)
        except FsError as exc:
            if exc.errno == errno.ENODATA:
                self.inodes.note_no_caps(ino, now)
            raise

    def setxattr(self, ino: int, name: bytes, value: bytes, flags: int = 0, ctx: Ctx = ROOT_CTX) -> None:
        self._check_open()
        self.inodes.forget_no_caps(ino)
        self.inodes.dirs.clear()  # a ctime change
        self.meta.setxattr(ino, name, value, flags, ctx)

    def listxattr(self, ino: int, ctx: Ctx = ROOT_CTX) -> list[bytes]:
        self._check_open()
        return self.meta.listxattr(ino, ctx)

    def removexattr(self, ino: int, name: bytes, ctx: Ctx = ROOT_CTX) -> None:
        self._check_open()
        self.inodes.forget_no_caps(ino)
        self.inodes.dirs.clear()  # a ctime change
        self.meta.removexattr(ino, name, ctx)

    def access(self, ino: int, mode: int, ctx: Ctx = ROOT_CTX) -> None:
        self._check_open()
        self.meta.access(ctx, ino, mode)

    def stats(self) -> dict[str, int]:
        """Client counters (tests and benchmarks)."""
        cache, maps = self.cache, self.inodes.maps
        return {
            "buffered_bytes": self.writes.budget.used, "open_handles": len(self.handles),
            "drive_reads": cache.drive_reads, "drive_read_bytes": cache.drive_bytes,
            "cache_hits": cache.hits, "deleted_slices": self.jobs.deletions.deleted_slices,
            "compactions": self.jobs.compactor.compactions,
            "compacted_bytes": self.jobs.compactor.compacted_bytes,
            # Per-inode tables that outlive handles (bounded by inodes.INODE_MEMO_ENTRIES).
            "map_windows": maps.windows, "map_generations": maps.generations,
        }

    # ================================================================== background work
    # The jobs live in ``client.background``; these are their entry points for
    # callers and tests (each runs in the caller's thread).
    def run_deletions(self) -> int:
        """Drain deferred closes, then delete every slice meta queued (durably,
        before acknowledging); returns the count (``DeletionConsumer.run``)."""
        return self.jobs.deletions.run()

    def compact_chunk(self, ino: int, chunk_index: int) -> bool:
        """Rewrite a fragmented chunk as one sequential slice (``Compactor.compact_chunk``)."""
        self._check_open()
        return self.jobs.compactor.compact_chunk(ino, chunk_index)

    def compact_fragmented(self, min_refs: int | None = None, limit: int = 100) -> int:
        """Compact every chunk meta reports with at least ``min_refs`` references."""
        self._check_open()
        return self.jobs.compactor.compact_fragmented(min_refs, limit)

    # ================================================================== life cycle
    def _stop_background(self) -> None:
        self.jobs.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.writes.close()

    def shutdown(self) -> None:
        """Commit every buffered byte, close every handle, delete queued slices,
        end the session, close the drives and meta. Idempotent; raises the first
        error after finishing the rest."""
        if self._closed:
            return
        errors: list[BaseException] = []
        self._run_before_close(errors)
        # Once the metadata is found unreachable, the steps that need it are
        # skipped: each waited for it in turn (30 s on PostgreSQL), and an
        # unmount while the database was down took minutes. What they would
        # have done is another client's to finish (this session expires, its
        # closes with it) or fsck's.
        unreachable: list[MetaUnavailable] = []

        def attempt(step: Callable[[], object], needs_meta: bool = True) -> None:
            if needs_meta and unreachable:
                return
            try:
                step()
            except MetaUnavailable as exc:
                log.error("shutdown: the metadata is unreachable (%s): what is left of "
                          "this client's closes, session and deletions is skipped", exc)
                unreachable.append(exc)
                errors.append(exc)
            except BaseException as exc:
                log.exception("shutdown step failed")
                errors.append(exc)

        for fh in self.handles.file_numbers():
            attempt(functools.partial(self.release, fh))
            if unreachable:  # buffered bytes cannot be committed: dropped with the handle
                with contextlib.suppress(BadHandle):  # (a failed release popped it)
                    self.handles.pop_file(fh)
        self.handles.clear_dirs()
        self._stop_background()
        self._closed = True
        attempt(self.jobs.closes.drain)
        # A short-lived process (connect(), write a checkpoint, exit) ends
        # with its arrivals' retention enforced, not left for a pass that
        # never comes (docs/client.md, "Retention").
        attempt(self.jobs.retention.run)
        attempt(self.jobs.session.end)
        if self.config.deletion_consumer:
            attempt(self.jobs.deletions.run)
        attempt(self.jobs.backup.write_at_shutdown)  # the drives keep the metadata as left
        attempt(self.node.close, needs_meta=False)
        attempt(self.meta.close, needs_meta=False)
        if errors:
            raise errors[0]

    def abandon(self) -> None:
        """Simulate the death of this process (crash tests): stop background work,
        drop buffered bytes, release the drive locks WITHOUT flushing anything,
        leave the session registered. Only what was durable survives."""
        if self._closed:
            return
        self._run_before_close([])
        self._stop_background()
        self._closed = True
        self.writes.abandon()
        self.node.abandon()
        try:
            self.meta.close()
        except Exception:
            log.debug("closing meta after abandon", exc_info=True)

    def _run_before_close(self, errors: list[BaseException]) -> None:
        hooks, self.before_close = self.before_close, []
        for hook in hooks:
            try:
                hook()
            except BaseException as exc:
                log.exception("a close hook failed")
                errors.append(exc)

    def __enter__(self) -> VFS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
