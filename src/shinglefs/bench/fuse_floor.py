"""The FUSE floor: the fastest a pyfuse3 file system can serve on this machine.

``FloorOperations`` is a pyfuse3 file system that does no storage work at
all: the namespace lives in dicts, a write only records the file's new size
(the bytes are dropped), a read answers with a slice of one preallocated
1 MiB block, and every handler runs inline on pyfuse3's trio thread (no
thread hop, no lock). What is left is the FUSE transport itself: the kernel
round trip, libfuse, and pyfuse3 copying each request into Python objects
while it holds the GIL. ``shinglefs bench mount`` drives it with the same
benchmark functions as the real mount, so its figures are the ceiling that
any pyfuse3 file system, ShingleFS included, can reach in that run.

It is mounted exactly like the real mount: the options of
``fuse.mount.fuse_options``, the loop of ``fuse.mount.run_fuse_loop`` (signals,
the raised bdi read-ahead), and the writeback cache, timeouts and attribute
replies (``ShingleOperations.entry``) of ``fuse.operations``.

Run ``python -m shinglefs.bench.fuse_floor MOUNTPOINT``: it mounts in the
foreground and serves until unmounted (``fusermount3 -u``) or sent
SIGINT/SIGTERM, then exits 0 with the mount gone. ``FloorMount`` runs that
process for a benchmark or a test and always unmounts it.

Not a file system to keep anything in: file contents are not stored, and
there are no permission checks beyond the kernel's ``default_permissions``.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyfuse3

from shinglefs.fuse.harness import MountedFileSystem
from shinglefs.fuse.mount import (
    check_fuse,
    check_mountpoint,
    fuse_options,
    run_fuse_loop,
)
from shinglefs.fuse.operations import ShingleOperations

log = logging.getLogger(__name__)

MiB = 1024**2
# Every read is answered from this one block; libfuse never asks for more than
# max_pages (256) pages, i.e. 1 MiB, in one request.
BLOCK = bytes(MiB)
_BLOCK_VIEW = memoryview(BLOCK)

FSNAME = "shinglefs-floor"
DIR_MODE = 0o040000  # stat.S_IFDIR, spelt out to keep the hot path free of lookups


@dataclass(slots=True)
class Node:
    """One inode; its fields are the ones ``ShingleOperations.entry`` reads."""

    ino: int
    mode: int
    uid: int
    gid: int
    nlink: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    size: int = 0
    rdev: int = 0
    generation: int = 0
    lookups: int = 0  # the kernel's references (lookup, create, mkdir, readdirplus)
    children: dict[bytes, int] | None = field(default=None)  # directories only

    @property
    def blocks(self) -> int:
        """``st_blocks``: 512-byte units of the size, as meta's ``InodeAttr`` counts them."""
        return (self.size + 511) // 512


class FloorOperations(pyfuse3.Operations):
    """An in-memory pyfuse3 file system with the real mount's FUSE settings.

    Every handler is inline and either answers or raises ``FUSEError``.
    ``fh`` of a file is its inode (there is no per-handle state); directory
    handles hold a snapshot of the entries taken at ``opendir``.
    """

    # The same switches as the real operations class: they change what the
    # kernel sends (writeback cache: page-sized writes gathered into 1 MiB).
    enable_writeback_cache = ShingleOperations.enable_writeback_cache
    supports_dot_lookup = ShingleOperations.supports_dot_lookup
    enable_acl = ShingleOperations.enable_acl

    def __init__(self) -> None:
        super().__init__()
        now = time.time_ns()
        root = Node(pyfuse3.ROOT_INODE, DIR_MODE | 0o755, os.getuid(), os.getgid(), 2,
                    now, now, now, children={})
        root.lookups = 1  # the kernel's reference to the root is never forgotten
        self.nodes: dict[int, Node] = {root.ino: root}
        self._next_ino = pyfuse3.ROOT_INODE + 1
        self._dir_handles: dict[int, list[tuple[bytes, int]]] = {}
        self._next_dir_fh = 1

    # -- inodes ---------------------------------------------------------------------------

    def _node(self, ino: int) -> Node:
        node = self.nodes.get(ino)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _dir(self, ino: int) -> dict[bytes, int]:
        children = self._node(ino).children
        if children is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return children

    def _new(self, parent: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext,
             is_dir: bool) -> Node:
        children = self._dir(parent)
        if name in children:
            raise pyfuse3.FUSEError(errno.EEXIST)
        now = time.time_ns()
        node = Node(self._next_ino, mode & ~ctx.umask, ctx.uid, ctx.gid,
                    2 if is_dir else 1, now, now, now, children={} if is_dir else None)
        self._next_ino += 1
        self.nodes[node.ino] = node
        children[name] = node.ino
        parent_node = self.nodes[parent]
        parent_node.mtime_ns = parent_node.ctime_ns = now
        if is_dir:
            parent_node.nlink += 1
        return node

    def _remove(self, parent: int, name: bytes, want_dir: bool) -> None:
        children = self._dir(parent)
        ino = children.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        node = self.nodes[ino]
        if want_dir:
            if node.children is None:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            if node.children:
                raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        elif node.children is not None:
            raise pyfuse3.FUSEError(errno.EISDIR)
        del children[name]
        now = time.time_ns()
        parent_node = self.nodes[parent]
        parent_node.mtime_ns = parent_node.ctime_ns = now
        if want_dir:
            parent_node.nlink -= 1
        node.nlink = 0
        node.ctime_ns = now
        self._drop_if_unused(node)

    def _drop_if_unused(self, node: Node) -> None:
        # An unlinked inode lives on while the kernel references it (open files
        # keep their dentry, hence their lookup): it goes with the last forget.
        if node.nlink == 0 and node.lookups <= 0:
            del self.nodes[node.ino]

    def _entry(self, node: Node) -> pyfuse3.EntryAttributes:
        node.lookups += 1
        return ShingleOperations.entry(node)

    # -- namespace ------------------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        ino = self._dir(parent_inode).get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(self.nodes[ino])

    async def forget(self, inode_list: Any) -> None:
        for ino, nlookup in inode_list:
            node = self.nodes.get(ino)
            if node is not None:
                node.lookups -= nlookup
                self._drop_if_unused(node)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return ShingleOperations.entry(self._node(inode))

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes,
                      fields: pyfuse3.SetattrFields, fh: int | None,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        if fields.update_size:
            if node.children is not None:
                raise pyfuse3.FUSEError(errno.EISDIR)
            node.size = attr.st_size
            node.mtime_ns = time.time_ns()
        if fields.update_mode:
            node.mode = (node.mode & ~0o7777) | (attr.st_mode & 0o7777)
        if fields.update_uid:
            node.uid = attr.st_uid
        if fields.update_gid:
            node.gid = attr.st_gid
        if fields.update_atime:
            node.atime_ns = attr.st_atime_ns
        if fields.update_mtime:
            node.mtime_ns = attr.st_mtime_ns
        node.ctime_ns = time.time_ns()
        return ShingleOperations.entry(node)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(self._new(parent_inode, name, DIR_MODE | (mode & 0o7777), ctx,
                                     is_dir=True))

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._remove(parent_inode, name, want_dir=False)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._remove(parent_inode, name, want_dir=True)

    # -- files ----------------------------------------------------------------------------

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext
                     ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        node = self._new(parent_inode, name, mode, ctx, is_dir=False)
        return pyfuse3.FileInfo(fh=node.ino, keep_cache=True), self._entry(node)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if node.children is not None:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & os.O_TRUNC:
            node.size = 0
        # Nothing but this mount changes a file, so the kernel may keep its pages
        # (what the real VFS answers for a file only this client wrote).
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> Any:
        node = self.nodes.get(fh)
        if node is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        n = min(size, node.size - off)
        if n <= 0:
            return b""
        if n <= MiB:
            return _BLOCK_VIEW[:n]  # pyfuse3 replies from the buffer: no copy
        return bytes(n)  # never with max_pages 256; correct anyway

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        node = self.nodes.get(fh)
        if node is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        end = off + len(buf)
        if end > node.size:
            node.size = end
        return len(buf)

    async def flush(self, fh: int) -> None:
        pass

    async def fsync(self, fh: int, datasync: bool) -> None:
        # Answered (not ENOSYS) so that every fsync costs the round trip the
        # real mount pays; the kernel writes the dirty pages back before it.
        pass

    async def release(self, fh: int) -> None:
        pass

    # -- directories ----------------------------------------------------------------------

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        fh = self._next_dir_fh
        self._next_dir_fh += 1
        self._dir_handles[fh] = list(self._dir(inode).items())
        return fh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = self._dir_handles.get(fh)
        if entries is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        for i in range(start_id, len(entries)):
            name, ino = entries[i]
            node = self.nodes.get(ino)
            if node is None:  # removed since opendir
                continue
            # readdirplus: an accepted entry is a lookup the kernel will forget.
            if not pyfuse3.readdir_reply(token, name, ShingleOperations.entry(node), i + 1):
                break
            node.lookups += 1

    async def releasedir(self, fh: int) -> None:
        self._dir_handles.pop(fh, None)

    # -- file system ----------------------------------------------------------------------

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 4096
        data.f_blocks = data.f_bfree = data.f_bavail = 1 << 40  # 4 PiB: never full
        data.f_files = 1 << 32
        data.f_ffree = data.f_favail = data.f_files - len(self.nodes)
        data.f_namemax = 255
        return data

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        self._node(inode)
        raise pyfuse3.FUSEError(errno.ENODATA)

    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        self._node(inode)
        return []


# -- serving --------------------------------------------------------------------------------


def serve(mountpoint: str) -> None:
    """Mount the floor at ``mountpoint`` and serve until unmounted or SIGINT/SIGTERM.

    Returns with the mount gone. Raises ``ShingleError`` (from the mount
    point and /dev/fuse checks) before mounting anything.
    """
    path = check_mountpoint(mountpoint)
    check_fuse()
    pyfuse3.init(FloorOperations(), path, fuse_options(False, (), FSNAME))

    try:
        run_fuse_loop(path)  # nothing to write back before unmounting
    finally:
        # Unmounts (lazily) only if the loop ended without the kernel unmounting.
        pyfuse3.close(unmount=True)


class FloorMount(MountedFileSystem):
    """``python -m shinglefs.bench.fuse_floor MOUNTPOINT`` as a child process.

    A context manager: ``__enter__`` returns once ``os.path.ismount`` is true;
    ``__exit__`` (also when the body raised) unmounts and reaps the child with
    the harness's escalation: ``fusermount3 -u``, SIGTERM, SIGKILL, aborting
    the FUSE connection, a lazy unmount. The child's output goes to
    ``log_path`` (default: ``<mountpoint>.log`` beside the mount point).
    """

    def __init__(self, mountpoint: str | os.PathLike[str], *,
                 log_path: str | os.PathLike[str] | None = None) -> None:
        mountpoint = Path(mountpoint)
        super().__init__(mountpoint.parent, mountpoint)
        self.log_path = Path(log_path) if log_path else mountpoint.with_name(
            mountpoint.name + ".log")

    def format(self) -> None:
        """Nothing to format: only the mount point has to exist."""
        self.mountpoint.mkdir(parents=True, exist_ok=True)

    def start(self, timeout: float = 60.0) -> None:
        """Mount in a child process; return when the mount serves.

        Raises ``AlreadyMountedError`` if something is mounted there already
        (polling ``ismount`` would otherwise take it for the floor), and
        ``RuntimeError`` if the child fails.
        """
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        check_mountpoint(self.mountpoint)
        super().start(timeout)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "shinglefs.bench.fuse_floor", str(self.mountpoint)]

    def __enter__(self) -> FloorMount:
        self.start()
        return self


def main(argv: list[str] | None = None) -> int:
    from shinglefs.errors import ShingleError

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m shinglefs.bench.fuse_floor MOUNTPOINT", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("SHINGLEFS_LOG", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(args[0])
    except ShingleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
