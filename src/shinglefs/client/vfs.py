"""The VFS: an inode-based, thread-safe, blocking file-system API over meta and the node.

SKELETON: method list agreed with the FUSE layer (see /tmp/vfs_contract.md);
bodies land as the metadata engine lands.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shinglefs.client.config import ClientConfig

Ctx = Any
InodeAttr = Any
DirEntry = Any
StatFs = Any
SetAttrChanges = Any


class VFS:
    """File operations as metadata transactions plus slice I/O (skeleton)."""

    def __init__(self, meta: Any, node: Any, config: ClientConfig | None = None) -> None:
        self.meta = meta
        self.node = node
        self.config = config or ClientConfig()

    def lookup(self, parent: int, name: bytes, ctx: Ctx) -> InodeAttr:
        raise NotImplementedError

    def forget(self, ino: int, nlookup: int) -> None:
        raise NotImplementedError

    def getattr(self, ino: int) -> InodeAttr:
        raise NotImplementedError

    def setattr(self, ino: int, changes: SetAttrChanges, fh: int | None, ctx: Ctx) -> InodeAttr:
        raise NotImplementedError

    def readlink(self, ino: int, ctx: Ctx) -> bytes:
        raise NotImplementedError

    def mknod(self, parent: int, name: bytes, mode: int, rdev: int, ctx: Ctx) -> InodeAttr:
        raise NotImplementedError

    def mkdir(self, parent: int, name: bytes, mode: int, ctx: Ctx) -> InodeAttr:
        raise NotImplementedError

    def unlink(self, parent: int, name: bytes, ctx: Ctx) -> None:
        raise NotImplementedError

    def rmdir(self, parent: int, name: bytes, ctx: Ctx) -> None:
        raise NotImplementedError

    def symlink(self, parent: int, name: bytes, target: bytes, ctx: Ctx) -> InodeAttr:
        raise NotImplementedError

    def rename(
        self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes, flags: int, ctx: Ctx
    ) -> None:
        raise NotImplementedError

    def link(self, ino: int, new_parent: int, new_name: bytes, ctx: Ctx) -> InodeAttr:
        raise NotImplementedError

    def open(self, ino: int, flags: int, ctx: Ctx) -> int:
        raise NotImplementedError

    def open_file_info(self, fh: int) -> bool:
        """keep_cache hint for the handle: True when the kernel page cache may be kept."""
        raise NotImplementedError

    def create(self, parent: int, name: bytes, mode: int, flags: int, ctx: Ctx) -> tuple[int, InodeAttr]:
        raise NotImplementedError

    def read(self, fh: int, offset: int, size: int) -> bytes:
        raise NotImplementedError

    def write(self, fh: int, offset: int, data: bytes | memoryview) -> int:
        raise NotImplementedError

    def flush(self, fh: int) -> None:
        raise NotImplementedError

    def release(self, fh: int) -> None:
        raise NotImplementedError

    def fsync(self, fh: int, datasync: bool) -> None:
        raise NotImplementedError

    def opendir(self, ino: int, ctx: Ctx) -> int:
        raise NotImplementedError

    def readdir(self, fh: int, start_cookie: int) -> Iterator[DirEntry]:
        raise NotImplementedError

    def releasedir(self, fh: int) -> None:
        raise NotImplementedError

    def fsyncdir(self, fh: int, datasync: bool) -> None:
        raise NotImplementedError

    def statfs(self, ctx: Ctx) -> StatFs:
        raise NotImplementedError

    def getxattr(self, ino: int, name: bytes, ctx: Ctx) -> bytes:
        raise NotImplementedError

    def setxattr(self, ino: int, name: bytes, value: bytes, flags: int, ctx: Ctx) -> None:
        raise NotImplementedError

    def listxattr(self, ino: int, ctx: Ctx) -> list[bytes]:
        raise NotImplementedError

    def removexattr(self, ino: int, name: bytes, ctx: Ctx) -> None:
        raise NotImplementedError

    def access(self, ino: int, mode: int, ctx: Ctx) -> None:
        raise NotImplementedError

    def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        raise NotImplementedError

    def changed_since_open(self, ino: int) -> bool:
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError
