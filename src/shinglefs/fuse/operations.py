"""The pyfuse3 operations class: a thin translation from kernel requests to ``VFS`` calls.

Contract of every handler (as in S3QL): only ``pyfuse3.FUSEError`` leaves it.
A ``ShingleError`` becomes ``FUSEError(exc.errno)``; anything else becomes
``EIO`` and is logged once with its context (operation, inode, handle).

Threading (see docs/mount.md): pyfuse3 runs every request as a trio task on
one OS thread, so a blocking call stalls every other request. ``VFS`` calls
that may wait for a drive (read, write, fsync, truncate, and flush/release of
a file written since its last flush) run in trio worker threads via
``trio.to_thread.run_sync``, one hop per kernel request (up to 1 MiB with
libfuse's ``max_write``/``max_pages``), so the hop (~0.1 ms) is paid per
megabyte, not per page. Namespace operations are single metadata transactions
that cost less than a thread hop on SQLite; they run inline unless
``offload_metadata`` is set (the mount sets it for PostgreSQL, where each is a
network round trip). Even then a request runs inline when the mount is
otherwise idle (``_alone``: no request in a worker thread, none waiting in
the kernel's queue, see ``watch_queue``): nobody waits for the loop then,
and the hop (0.4-0.5 ms on the test VM, more than the round trip it wraps)
is saved. One FIFO lock per inode keeps a file's writes in the order the
kernel sent them.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import logging
import os
import select
import stat
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import pyfuse3
import trio

from shinglefs.client.inodes import INODE_MEMO_ENTRIES, InodeMemo, Stamp
from shinglefs.client.vfs import VFS, Declined, SetAttrChanges
from shinglefs.errors import ShingleError
from shinglefs.fuse.requests import (
    SNAPSHOT_XATTR,
    TIER_MOVE_XATTR,
    WRITABLE_XATTR,
    parse_entry_name,
    parse_snapshot_request,
)
from shinglefs.meta.api import Ctx, InodeAttr
from shinglefs.meta.errors import FsError
from shinglefs.meta.records import MAX_FILE_SIZE

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long the kernel may trust what we told it. With the writeback cache the
# kernel is the authority on size and mtime of files this host writes, so a
# short attribute timeout costs little locally and bounds how long another
# host's change (another mount on the same metadata) stays invisible: 1 s.
ATTR_TIMEOUT = 1.0
ENTRY_TIMEOUT = 1.0

# The virtual, read-only xattr on the root through which a running mount
# reports its meta URL and status to `shinglefs status MOUNTPOINT`.
STATUS_XATTR = b"user.shinglefs.status"

# readdir fetches at most this many entries per kernel request from the VFS;
# a readdirplus reply buffer (4 KiB to 128 KiB) holds far fewer.
READDIR_BATCH = 256


def fuse_device_fd() -> int | None:
    """This process's one /dev/fuse descriptor, for ``watch_queue`` (pyfuse3
    does not expose its session's), or None when there is not exactly one."""
    found = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                found.append(int(name))
        except OSError:
            continue
    return found[0] if len(found) == 1 else None


def supplementary_groups(pid: int) -> tuple[int, ...]:
    """The supplementary groups of process ``pid`` from /proc (empty if it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Groups:"):
                    return tuple(int(g) for g in line.split()[1:])
    except OSError:
        pass
    return ()


class InodeTurn:
    """``async with`` an inode's FIFO lock, without a trio checkpoint when it is free.

    ``trio.Lock``'s own ``async with`` always yields to the scheduler: one more
    pass of the event loop (an ``epoll_wait``) per request. Taking a free lock
    with ``acquire_nowait`` skips it; a held one is waited for in FIFO order.
    """

    __slots__ = ("lock",)

    def __init__(self, lock: trio.Lock) -> None:
        self.lock = lock

    async def __aenter__(self) -> None:
        try:
            self.lock.acquire_nowait()
        except trio.WouldBlock:
            await self.lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.lock.release()


class OpStats:
    """Count and wall time of each kind of request, as the application waits for it.

    ``snapshot()`` is served in the mount's status (``fuse_ops``): for each
    operation the count, mean and max latency in microseconds. Recording costs
    one ``perf_counter`` pair a request.
    """

    __slots__ = ("_max", "_n", "_ns", "_threaded")

    def __init__(self) -> None:
        self._n: dict[str, int] = {}
        self._ns: dict[str, int] = {}
        self._max: dict[str, int] = {}
        self._threaded: dict[str, int] = {}

    def record(self, op: str, ns: int, threaded: bool = False) -> None:
        self._n[op] = self._n.get(op, 0) + 1
        self._ns[op] = self._ns.get(op, 0) + ns
        if ns > self._max.get(op, 0):
            self._max[op] = ns
        if threaded:
            self._threaded[op] = self._threaded.get(op, 0) + 1

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per operation: ``count``, ``mean_us``, ``max_us`` and ``threaded`` (how
        many ran in a worker thread rather than inline on the FUSE loop)."""
        # Called from a worker thread while the loop records: copy each dict in
        # one C-level step (atomic under the GIL) before looking at it.
        counts, ns, top, threaded = (dict(self._n), dict(self._ns), dict(self._max),
                                     dict(self._threaded))
        return {
            op: {"count": n, "mean_us": round(ns.get(op, 0) / n / 1e3, 1),
                 "max_us": round(top.get(op, 0) / 1e3, 1),
                 "threaded": threaded.get(op, 0)}
            for op, n in sorted(counts.items())
        }


class EntrySource(Protocol):
    """What ``ShingleOperations.entry`` reads of an inode; meta's ``InodeAttr`` is one."""

    @property
    def ino(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def mode(self) -> int: ...
    @property
    def nlink(self) -> int: ...
    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def rdev(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def blocks(self) -> int: ...
    @property
    def atime_ns(self) -> int: ...
    @property
    def mtime_ns(self) -> int: ...
    @property
    def ctime_ns(self) -> int: ...


class ShingleOperations(pyfuse3.Operations):
    """pyfuse3 handlers delegating to one ``VFS``.

    ``status_provider`` (optional) returns the JSON bytes served as the
    virtual ``user.shinglefs.status`` xattr of the root. ``kernel_checks``:
    the mount has ``default_permissions``, so ``setattr`` applies what the
    kernel allowed (False: the metadata engine checks it again).
    """

    # Off by default (docs/mount.md, "The writeback cache"): with it the
    # kernel throttles sustained writes to a FUSE mount at ~200 MiB/s here,
    # even for a file system that does nothing (measured with the floor).
    enable_writeback_cache = False
    # We do not export over NFS, so the kernel never needs to look up "." / "..".
    supports_dot_lookup = False
    enable_acl = False

    def __init__(
        self,
        vfs: VFS,
        *,
        offload_metadata: bool = False,
        status_provider: Callable[[], bytes] | None = None,
        writeback_cache: bool = False,
        kernel_checks: bool = True,
    ) -> None:
        super().__init__()
        # The mount has default_permissions (always, see fuse_options): the
        # kernel is the authority on who may change attributes.
        self.kernel_checks = kernel_checks
        self.enable_writeback_cache = writeback_cache  # read by pyfuse3.init
        self.vfs = vfs
        self.offload_metadata = offload_metadata
        self.status_provider = status_provider
        # Per-inode FIFO locks (trio.Lock is fair) that keep one inode's writes in
        # the order the kernel sent them; see ``write``.
        self._inode_of: dict[int, int] = {}
        self._write_locks: dict[int, trio.Lock] = {}
        self._lock_users: dict[int, int] = {}
        # Inodes written since their last flush, with the time of their last
        # write: only those may make flush or release wait for a drive (a
        # clean flush/release is a metadata call); stat shows that time.
        self._dirty: dict[int, int] = {}
        self.op_stats = OpStats()
        self._in_threads = 0  # requests running in worker threads now
        self._queue: select.poll | None = None  # the kernel's request queue (watch_queue)
        self._moves: dict[int, bytes] = {}  # inode -> its last tier move's figures (JSON)
        # Regular file -> the (mtime, ctime, size) of the attributes last given
        # to the kernel by lookup, getattr, readdir, create or setattr: an open
        # that finds meta at another version drops the kernel's (``open``).
        self._told: InodeMemo[Stamp] = InodeMemo(INODE_MEMO_ENTRIES)

    def watch_queue(self, fuse_fd: int) -> None:
        """Let networked metadata run inline while the mount is otherwise idle:
        ``fuse_fd`` is the session's /dev/fuse descriptor, readable while the
        kernel holds requests nobody has read yet."""
        self._queue = select.poll()
        self._queue.register(fuse_fd, select.POLLIN)

    def _alone(self) -> bool:
        """No other request is in a worker thread or waiting in the kernel: a
        request run inline now delays nobody (``watch_queue``)."""
        return self._queue is not None and not self._in_threads and not self._queue.poll(0)

    # -- plumbing -----------------------------------------------------------------

    @staticmethod
    def _ctx(ctx: pyfuse3.RequestContext) -> Ctx:
        # Root needs no group check; for anyone else read the supplementary groups
        # (≈20 µs from /proc) so that group permissions work as on a local disk.
        groups = supplementary_groups(ctx.pid) if ctx.uid != 0 else ()
        return Ctx(uid=ctx.uid, gid=ctx.gid, pid=ctx.pid, groups=groups, umask=ctx.umask)

    async def _call(
        self,
        op: str,
        offload: bool,
        func: Callable[..., T],
        *args: Any,
        ino: int | None = None,
        fh: int | None = None,
        record: bool = True,
    ) -> T:
        """Run ``func(*args)`` inline or in a worker thread; translate every error.
        ``record``: count the call as one request in ``op_stats``."""
        start = time.perf_counter_ns()
        try:
            if offload:
                self._in_threads += 1
                try:
                    return await trio.to_thread.run_sync(func, *args)
                finally:
                    self._in_threads -= 1
            return func(*args)
        except (pyfuse3.FUSEError, Declined):
            raise
        except ShingleError as exc:
            if exc.errno == errno.EIO:
                log.warning("%s(inode=%s, fh=%s): %s", op, ino, fh, exc)
            raise pyfuse3.FUSEError(exc.errno) from None
        except Exception:
            log.exception("%s(inode=%s, fh=%s) failed unexpectedly; returning EIO", op, ino, fh)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            if record:
                self.op_stats.record(op, time.perf_counter_ns() - start, offload)

    async def _inline_or_thread(
        self,
        op: str,
        func: Callable[..., T],
        *args: Any,
        fh: int | None = None,
        inline: bool = True,
    ) -> T:
        """One request, the event loop's fast path: ``func(*args, wait=False)``
        inline (it never waits: it does the work or raises ``Declined`` having
        done nothing); when declined, or ``inline`` is False, ``func(*args)``
        in a worker thread. Recorded once."""
        start = time.perf_counter_ns()
        threaded = False
        try:
            if inline:
                try:
                    return await self._call(op, False, functools.partial(func, wait=False),
                                            *args, fh=fh, record=False)
                except Declined:
                    pass
            threaded = True
            return await self._call(op, True, func, *args, fh=fh, record=False)
        finally:
            self.op_stats.record(op, time.perf_counter_ns() - start, threaded)

    async def _meta(self, op: str, func: Callable[..., T], *args: Any, ino: int | None = None) -> T:
        offload = self.offload_metadata and not self._alone()
        return await self._call(op, offload, func, *args, ino=ino)

    @staticmethod
    def entry(attr: EntrySource) -> pyfuse3.EntryAttributes:
        """An ``EntryAttributes`` for the kernel from a VFS ``InodeAttr`` (or any
        ``EntrySource``: the FUSE floor's nodes)."""
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = attr.ino
        entry.generation = attr.generation
        entry.entry_timeout = ENTRY_TIMEOUT
        entry.attr_timeout = ATTR_TIMEOUT
        entry.st_mode = attr.mode
        entry.st_nlink = attr.nlink
        entry.st_uid = attr.uid
        entry.st_gid = attr.gid
        entry.st_rdev = attr.rdev
        entry.st_size = attr.size
        entry.st_blksize = 1 << 20  # tell applications to write in 1 MiB units
        entry.st_blocks = attr.blocks
        entry.st_atime_ns = attr.atime_ns
        entry.st_mtime_ns = attr.mtime_ns
        entry.st_ctime_ns = attr.ctime_ns
        return entry

    def _attach(self, fh: int, ino: int) -> None:
        self._inode_of[fh] = ino
        self._lock_users[ino] = self._lock_users.get(ino, 0) + 1
        if ino not in self._write_locks:
            self._write_locks[ino] = trio.Lock()

    def _detach(self, fh: int) -> None:
        ino = self._inode_of.pop(fh, None)
        if ino is None:
            return
        self._lock_users[ino] -= 1
        if not self._lock_users[ino]:
            del self._lock_users[ino]
            del self._write_locks[ino]

    def _write_lock(self, fh: int) -> InodeTurn:
        ino = self._inode_of.get(fh)
        return InodeTurn(self._write_locks[ino] if ino is not None else trio.Lock())

    def _file_info(self, fh: int) -> pyfuse3.FileInfo:
        keep_cache = self.vfs.open_file_info(fh)
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep_cache)

    @staticmethod
    def _forget_cached_attributes(ino: int) -> None:
        """Close-to-open for the size: the kernel may hold ``ino``'s attributes
        from a reply up to ``ATTR_TIMEOUT`` old, and its cached reads stop at
        that size (a file another client grew read short, with no error).
        ``keep_cache=False`` drops only the pages: this drops the attributes
        too, so the first read past them asks (getattr). Called (in a worker
        thread) when meta's version at open is not the one last told
        (``_told``); the usual cold open, right after its lookup, costs
        nothing. Attributes only: no page is written back or dropped."""
        try:
            pyfuse3.invalidate_inode(ino, attr_only=True)
        except OSError:  # ENOENT: the kernel holds no attributes of it
            pass

    def _tell(self, attr: InodeAttr) -> InodeAttr:
        """Note the version of a regular file's attributes a reply gives the kernel."""
        if stat.S_ISREG(attr.mode):
            self._told[attr.ino] = (attr.mtime_ns, attr.ctime_ns, attr.size)
        return attr

    # -- namespace ------------------------------------------------------------------

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        attr = await self._meta("lookup", self.vfs.lookup, parent_inode, name, self._ctx(ctx),
                                ino=parent_inode)
        return self._written_since_flush(self.entry(self._tell(attr)))

    async def forget(self, inode_list: Any) -> None:
        # Must not raise: log and carry on with the rest of the list.
        for ino, nlookup in inode_list:
            # The kernel holds nothing of the inode now: it looks the file up
            # again before any open, and that tells it anew.
            self._told.pop(ino, None)
            try:
                self.vfs.forget(ino, nlookup)
            except Exception:
                log.exception("forget(inode=%s, nlookup=%s) failed", ino, nlookup)

    def inode_entries(self) -> dict[str, int]:
        """Entries of each table this class keeps per inode or handle: they
        follow the inodes the kernel holds and the handles open, never the
        files ever seen (tests/fuse/test_operations.py churns and counts)."""
        return {"told": len(self._told), "dirty": len(self._dirty),
                "moves": len(self._moves), "handles": len(self._inode_of),
                "write_locks": len(self._write_locks), "lock_users": len(self._lock_users)}

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        # A directory's attributes the VFS remembers (the kernel asks after every
        # entry made in it) are answered on the event loop, whatever the backend.
        getattr_ = functools.partial(self.vfs.getattr, cached=True)
        if self.offload_metadata:
            attr = await self._inline_or_thread("getattr", getattr_, inode)
        else:
            attr = await self._meta("getattr", getattr_, inode, ino=inode)
        return self._written_since_flush(self.entry(self._tell(attr)))

    def _written_since_flush(self, entry: pyfuse3.EntryAttributes) -> pyfuse3.EntryAttributes:
        """``entry`` of a file written through this mount since its last flush:
        write(2) changed its mtime and ctime, but meta records them only when the
        bytes commit (flush). So: the time of its last write (as a local disk
        shows it: the same on every stat until the next write), and not to be
        kept by the kernel, or a stat(2) after close(2) would show the time
        before the write for a second (ATTR_TIMEOUT) when an fstat(2) between
        write and close had asked."""
        written = self._dirty.get(entry.st_ino)
        if written is not None:
            # The writer's own time is what the commit will set (FinishedSlice).
            written = self.vfs.written_ns(entry.st_ino) or written
            entry.st_mtime_ns = written
            entry.st_ctime_ns = max(written, entry.st_ctime_ns)
            entry.attr_timeout = 0
        return entry

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        """Apply what the kernel asks, as the kernel allowed it (see docs/mount.md,
        "Permissions"): with ``default_permissions`` it has checked the change by
        Linux's rules and sends some no caller could make by itself, which the
        metadata engine would refuse: the mode change clearing setuid/setgid
        when a non-owner writes or truncates (FATTR_MODE from the writer),
        ``ftruncate`` through a descriptor the caller may no longer open
        (FATTR_SIZE|FATTR_FH), and "now" times (FATTR_ATIME_NOW, which pyfuse3
        turns into an explicit time) from a user with write permission. An
        empty request from a non-root caller drops setgid (``_setgid_to_drop``)."""
        changes = SetAttrChanges(
            mode=attr.st_mode if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            size=attr.st_size if fields.update_size else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
        )  # ctime: the metadata engine sets it to now on any change
        vctx = self._ctx(ctx)
        log.debug("setattr(inode=%s, fh=%s, uid=%s): %s", inode, fh, vctx.uid, changes)
        if changes == SetAttrChanges() and vctx.uid != 0 and self.kernel_checks:
            changes = await self._meta("setattr", self._setgid_to_drop, inode, vctx, ino=inode)
        # A size or mtime change commits buffered bytes first (VFS.setattr):
        # that can wait on a drive.
        commits = fields.update_size or (fields.update_mtime and inode in self._dirty)
        new = await self._call(
            "setattr", commits or self.offload_metadata,
            functools.partial(self.vfs.setattr, checked=self.kernel_checks),
            inode, changes, fh, vctx, ino=inode, fh=fh,
        )
        if commits:
            self._dirty.pop(inode, None)  # nothing written since: meta's times hold
        return self.entry(self._tell(new))

    def _setgid_to_drop(self, inode: int, ctx: Ctx) -> SetAttrChanges:
        """The change behind an empty SETATTR from a non-root caller.

        The kernel sends one when a write, truncate or chown must drop
        privileges that its FUSE code cannot express as a mode: setgid
        without group execute on a file whose group the caller is not in
        (Linux's setattr_should_drop_sgid; ext4 clears it). Nothing else
        to change: ctime only.
        """
        attr = self.vfs.getattr(inode)
        mode = attr.mode
        if mode & stat.S_ISGID and not mode & stat.S_IXGRP and not stat.S_ISDIR(mode) \
                and not ctx.in_group(attr.gid):
            return SetAttrChanges(mode=stat.S_IMODE(mode) & ~stat.S_ISGID)
        return SetAttrChanges()

    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return await self._meta("readlink", self.vfs.readlink, inode, self._ctx(ctx), ino=inode)

    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        attr = await self._meta("mknod", self.vfs.mknod, parent_inode, name, mode, rdev,
                                self._ctx(ctx), ino=parent_inode)
        return self.entry(attr)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        attr = await self._meta("mkdir", self.vfs.mkdir, parent_inode, name, mode,
                                self._ctx(ctx), ino=parent_inode)
        return self.entry(attr)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._meta("unlink", self.vfs.unlink, parent_inode, name, self._ctx(ctx),
                         ino=parent_inode)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._meta("rmdir", self.vfs.rmdir, parent_inode, name, self._ctx(ctx),
                         ino=parent_inode)

    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        attr = await self._meta("symlink", self.vfs.symlink, parent_inode, name, target,
                                self._ctx(ctx), ino=parent_inode)
        return self.entry(attr)

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        await self._meta("rename", self.vfs.rename, parent_inode_old, name_old,
                         parent_inode_new, name_new, flags, self._ctx(ctx), ino=parent_inode_old)

    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        attr = await self._meta("link", self.vfs.link, inode, new_parent_inode, new_name,
                                self._ctx(ctx), ino=inode)
        return self.entry(attr)

    # -- files ------------------------------------------------------------------------

    def _writeback_flags(self, flags: int) -> int:
        """Open flags as the writeback cache needs them, when it is on (as libfuse's
        passthrough_ll does); otherwise the application's flags unchanged.

        The kernel may read pages through any handle of the inode to fill a
        partly written page, so a write-only open becomes read-write; and it
        appends itself (it owns the size), so O_APPEND is dropped. The
        kernel already checked the caller's permissions for the real flags
        (``default_permissions``).
        """
        if not self.enable_writeback_cache:
            return flags
        if flags & os.O_ACCMODE == os.O_WRONLY:
            flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
        return flags & ~os.O_APPEND

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        wanted = self._writeback_flags(flags)
        vctx = self._ctx(ctx)
        if wanted != flags and flags & os.O_ACCMODE == os.O_WRONLY:
            # The VFS would check read permission for the O_RDWR we made up.
            vctx = Ctx(uid=0, gid=vctx.gid, pid=vctx.pid, groups=vctx.groups, umask=vctx.umask)
        fh = await self._meta("open", self.vfs.open, inode, wanted, vctx, ino=inode)
        self._attach(fh, inode)
        info = self._file_info(fh)
        opened = self.vfs.opened_stamp(fh)
        if opened is None or self._told.get(inode) != opened:
            self._told.pop(inode, None)
            # In a worker thread, the loop free meanwhile: a notification sent
            # from inside a request handler can wait on the kernel (its inode
            # table, an unmount in progress) for something only this loop
            # would answer.
            await trio.to_thread.run_sync(self._forget_cached_attributes, inode)
        return info

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        fh, attr = await self._meta("create", self.vfs.create, parent_inode, name, mode,
                                    self._writeback_flags(flags), self._ctx(ctx),
                                    ino=parent_inode)
        self._attach(fh, attr.ino)
        return self._file_info(fh), self.entry(self._tell(attr))

    async def read(  # type: ignore[override]  # pyfuse3 takes any contiguous buffer
        self, fh: int, off: int, size: int
    ) -> bytes | memoryview:
        # Bytes already read ahead into the cache, and a small file's bytes
        # kept in meta, are served inline (a view of the cache, no copy, no
        # thread hop); the rest waits in a thread. Not with networked
        # metadata: a file's map, and its read-ahead, are round trips.
        data: bytes | memoryview = await self._inline_or_thread(
            "read", self.vfs.read_buffer, fh, off, size, fh=fh,
            inline=not self.offload_metadata)
        return data

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        # Concurrent requests for one file (the writeback cache sends dirty
        # pages in ascending order as several at once) must reach the VFS in
        # the kernel's order even when some fall back to threads, or they cut
        # its sequential slices into fragments: one FIFO lock per inode.
        # A write that only lands in the file's buffer, or hands pieces to the
        # drive's queue without waiting, runs inline: it saves the hop. (It may
        # touch meta once per 64 MiB slice: registering it.)
        async with self._write_lock(fh):
            self._dirty[self._inode_of.get(fh, -1)] = time.time_ns()
            written: int = await self._inline_or_thread(
                "write", self._write_from_kernel, fh, off, buf, fh=fh)
            return written

    def _write_from_kernel(self, fh: int, off: int, buf: bytes, *, wait: bool = True) -> int:
        if self.enable_writeback_cache and off + len(buf) > MAX_FILE_SIZE:
            # The kernel took a write(2) past the largest file size into its
            # cache and now writes it back: a short count would drop the rest
            # unsaid; an error is kept by the kernel for fsync and close.
            raise FsError(errno.EFBIG, f"write back at {off}: past the largest file size, "
                          f"{MAX_FILE_SIZE}", ino=self._inode_of.get(fh))
        return self.vfs.write(fh, off, buf, wait=wait, from_kernel=True)

    async def flush(self, fh: int) -> None:
        ino = self._inode_of.get(fh, -1)
        async with self._write_lock(fh):
            # Clean (read-only handles, files with nothing written since the
            # last flush), or a small file whose bytes the idle drive writer
            # takes in this thread: inline, no hop. Not with networked
            # metadata: the commit is a round trip other requests would wait for.
            if ino not in self._dirty:
                await self._call("flush", False, self.vfs.flush, fh, fh=fh)
            else:
                await self._inline_or_thread("flush", self.vfs.flush, fh, fh=fh,
                                             inline=not self.offload_metadata or self._alone())
            self._dirty.pop(ino, None)

    async def release(self, fh: int) -> None:
        ino = self._inode_of.get(fh, -1)
        try:
            async with self._write_lock(fh):
                try:
                    await self._call("release", ino in self._dirty, self.vfs.release, fh, fh=fh)
                finally:  # a release that failed leaves nothing to write either
                    if self._lock_users.get(ino, 0) <= 1:
                        self._dirty.pop(ino, None)
        finally:
            self._detach(fh)

    async def fsync(self, fh: int, datasync: bool) -> None:
        ino = self._inode_of.get(fh, -1)
        async with self._write_lock(fh):
            await self._call("fsync", True, self.vfs.fsync, fh, datasync, fh=fh)
            self._dirty.pop(ino, None)

    # -- directories ----------------------------------------------------------------------

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return await self._meta("opendir", self.vfs.opendir, inode, self._ctx(ctx), ino=inode)

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = await self._meta("readdir", self._readdir_batch, fh, start_id)
        for entry in entries:
            # readdirplus: each accepted entry counts as a lookup in the kernel;
            # the VFS keeps no lookup counts (meta frees inodes on last close),
            # so nothing is recorded here.
            if not pyfuse3.readdir_reply(token, entry.name, self.entry(entry.attr), entry.cookie):
                break
            self._tell(entry.attr)

    def _readdir_batch(self, fh: int, start_id: int) -> list[Any]:
        batch = []
        for entry in self.vfs.readdir(fh, start_id):
            batch.append(entry)
            if len(batch) >= READDIR_BATCH:
                break
        return batch

    async def releasedir(self, fh: int) -> None:
        await self._meta("releasedir", self.vfs.releasedir, fh)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        await self._call("fsyncdir", True, self.vfs.fsyncdir, fh, datasync, fh=fh)

    # -- file system ----------------------------------------------------------------------

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        st = await self._meta("statfs", self.vfs.statfs, self._ctx(ctx))
        data = pyfuse3.StatvfsData()
        data.f_bsize = st.block_size
        data.f_frsize = st.block_size
        data.f_blocks = st.capacity_bytes // st.block_size
        # As ext4 keeps its reserved blocks: free but not available. df's "Used"
        # is the files' bytes, not the GC reserve and zone granularity an empty
        # file system already keeps back; "Avail" is what can still be written.
        data.f_bfree = max(st.free_bytes, st.capacity_bytes - st.used_bytes) // st.block_size
        data.f_bavail = st.free_bytes // st.block_size
        data.f_files = st.inodes + st.inodes_free
        data.f_ffree = st.inodes_free
        data.f_favail = st.inodes_free
        data.f_namemax = st.name_max
        return data

    # -- extended attributes ----------------------------------------------------------------

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if inode == pyfuse3.ROOT_INODE and name == STATUS_XATTR and self.status_provider:
            return await self._call("getxattr", True, self.status_provider, ino=inode)
        if name == TIER_MOVE_XATTR and inode in self._moves:
            return self._moves[inode]
        if self.offload_metadata:  # a remembered absence is answered on the event loop
            return await self._inline_or_thread("getxattr", self.vfs.getxattr, inode, name,
                                                self._ctx(ctx))
        return await self._meta("getxattr", self.vfs.getxattr, inode, name, self._ctx(ctx),
                                ino=inode)

    async def setxattr(
        self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext
    ) -> None:
        if inode == pyfuse3.ROOT_INODE and name == STATUS_XATTR:
            raise pyfuse3.FUSEError(errno.EPERM)
        if name == TIER_MOVE_XATTR:  # a request, never stored (fuse/requests.py)
            move = await self._call("tier-move", True, self.vfs.move_to_tier, inode,
                                    self._ctx(ctx), ino=inode)
            self._moves[inode] = json.dumps(dataclasses.asdict(move)).encode()
            while len(self._moves) > 64:
                self._moves.pop(next(iter(self._moves)))
            return
        if name == WRITABLE_XATTR:  # a request, never stored (fuse/requests.py)
            await self._call("make-writable", True, self._make_writable, inode, value,
                             self._ctx(ctx), ino=inode)
            return
        if name == SNAPSHOT_XATTR:  # a request, never stored (fuse/requests.py)
            # Always in a worker thread: a big tree's copy takes seconds.
            await self._call("snapshot", True, self._snapshot, inode, value, self._ctx(ctx),
                             ino=inode)
            return
        # pyfuse3 checks XATTR_CREATE/REPLACE itself (getxattr first) and passes no flags.
        await self._meta("setxattr", self.vfs.setxattr, inode, name, value, 0, self._ctx(ctx),
                         ino=inode)

    def _make_writable(self, parent: int, request: bytes, ctx: Ctx) -> None:
        """The read-only snapshot named ``request`` in ``parent`` made writable
        (``MetaStore.make_writable``'s refusals: EINVAL, EPERM)."""
        self.vfs.make_writable(self.vfs.lookup(parent, parse_entry_name(request), ctx).ino, ctx)

    def _snapshot(self, parent: int, request: bytes, ctx: Ctx) -> None:
        src, name, read_only = parse_snapshot_request(request)
        self.vfs.snapshot_path(src, parent, name, ctx, read_only=read_only)

    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return await self._meta("listxattr", self.vfs.listxattr, inode, self._ctx(ctx), ino=inode)

    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._meta("removexattr", self.vfs.removexattr, inode, name, self._ctx(ctx),
                         ino=inode)

    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        # Only called without the default_permissions mount option.
        try:
            self.vfs.access(inode, mode, self._ctx(ctx))
        except ShingleError as exc:
            if exc.errno == errno.EACCES:
                return False
            raise pyfuse3.FUSEError(exc.errno) from None
        except Exception:
            log.exception("access(inode=%s, mode=%o) failed unexpectedly", inode, mode)
            raise pyfuse3.FUSEError(errno.EIO) from None
        return True


__all__ = ["ATTR_TIMEOUT", "ENTRY_TIMEOUT", "STATUS_XATTR", "OpStats", "ShingleOperations",
           "fuse_device_fd", "supplementary_groups"]

