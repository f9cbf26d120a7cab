"""Extended attributes: one row per ``(ino, name)``, Linux's namespaces and limits.

Reading needs read permission on the inode, writing needs write permission;
listing needs neither (as on Linux for user. names), and lists ``trusted.``
names to root alone (Linux: to CAP_SYS_ADMIN; the kernel already refuses the
others reading or writing them). Setting or removing one
sets the inode's ctime in the same transaction.

POSIX ACLs are not supported, as on a Linux file system mounted ``noacl``:
``system.posix_acl_access`` / ``_default`` are EOPNOTSUPP and never listed.
Stored as plain values they would not change the mode bits, and ``cp -p``
(which sets the ACL instead of calling chmod when that succeeds) would
leave its copies at the 0600 it created them with.
"""

from __future__ import annotations

import errno as E

from shinglefs.meta import schema as S
from shinglefs.meta.backend import Tx
from shinglefs.meta.engine.core import SqlCore, attr_of, enoent, now_ns
from shinglefs.meta.engine.namespace import NAME_TYPES
from shinglefs.meta.engine.permissions import check_mutable, permits
from shinglefs.meta.errors import FsError
from shinglefs.meta.records import (
    R_OK,
    ROOT_CTX,
    W_OK,
    XATTR_CREATE,
    XATTR_NAME_MAX,
    XATTR_REPLACE,
    XATTR_SIZE_MAX,
    Ctx,
    InodeAttr,
)

XATTR_NAMESPACES = (b"user.", b"trusted.", b"security.", b"system.")
ACL_XATTRS = (b"system.posix_acl_access", b"system.posix_acl_default")


def check_xattr_name(name: bytes) -> None:
    """EINVAL if not bytes, holding a NUL, or a bare namespace prefix (``user.``, as Linux's
    xattr_resolve_name); ERANGE if empty or longer than XATTR_NAME_MAX;
    EOPNOTSUPP outside the four namespaces and for the POSIX ACLs (module docstring)."""
    if not isinstance(name, NAME_TYPES):
        raise FsError(E.EINVAL, "an xattr name must be bytes")
    if not name or len(name) > XATTR_NAME_MAX:
        raise FsError(E.ERANGE, f"xattr name of {len(name)} bytes (1..{XATTR_NAME_MAX})")
    if b"\0" in name:  # the kernel's names are C strings: listxattr could not list it
        raise FsError(E.EINVAL, f"xattr name {bytes(name)!r} holds a NUL byte")
    if name in XATTR_NAMESPACES:
        raise FsError(E.EINVAL, f"xattr {bytes(name)!r} names a namespace, not an attribute")
    if not name.startswith(XATTR_NAMESPACES):
        raise FsError(
            E.EOPNOTSUPP, f"xattr {bytes(name)!r} is outside user./trusted./security./system."
        )
    if name in ACL_XATTRS:
        raise FsError(E.EOPNOTSUPP, "POSIX ACLs are not supported: access is the mode bits")


def xattr_target(tx: Tx, ino: int, ctx: Ctx, mask: int) -> InodeAttr:
    """The inode whose xattrs are touched: ENOENT, or EACCES without ``mask``;
    EPERM for a change (``W_OK``) of an immutable one."""
    row = tx.one(S.SEL_INODE, (ino,))
    if row is None:
        raise enoent(ino)
    a = attr_of(row)
    if mask & W_OK:
        check_mutable(a.flags, ino, "changing its extended attributes")
    if mask and not permits(a.mode, a.uid, a.gid, ctx, mask):
        raise FsError(E.EACCES, f"xattr access denied on inode {ino}", ino=ino)
    return a


class XattrOps(SqlCore):
    """getxattr, setxattr, listxattr, removexattr."""

    def getxattr(self, ino: int, name: bytes, ctx: Ctx = ROOT_CTX) -> bytes:
        check_xattr_name(name)

        def txn(tx: Tx) -> bytes:
            xattr_target(tx, ino, ctx, R_OK)
            row = tx.one(S.SEL_XATTR, (ino, name))
            if row is None:
                raise FsError(E.ENODATA, f"no xattr {name!r} on inode {ino}", ino=ino, name=name)
            return bytes(row[0])

        return self._run(txn, "read")

    def setxattr(
        self, ino: int, name: bytes, value: bytes, flags: int = 0, ctx: Ctx = ROOT_CTX
    ) -> None:
        check_xattr_name(name)
        if flags & ~(XATTR_CREATE | XATTR_REPLACE):
            raise FsError(E.EINVAL, f"bad setxattr flags {flags:#x}")
        if len(value) > XATTR_SIZE_MAX:
            raise FsError(E.E2BIG, f"xattr value of {len(value)} bytes (max {XATTR_SIZE_MAX})")
        value = bytes(value)

        def txn(tx: Tx) -> None:
            xattr_target(tx, ino, ctx, W_OK)
            if flags & XATTR_REPLACE:
                if not tx.run(S.UPD_XATTR, (value, ino, name)):
                    raise FsError(E.ENODATA, f"no xattr {name!r} to replace", ino=ino, name=name)
            elif not tx.run(S.INS_XATTR, (ino, name, value)):
                if flags & XATTR_CREATE:
                    raise FsError(E.EEXIST, f"xattr {name!r} exists", ino=ino, name=name)
                tx.run(S.UPD_XATTR, (value, ino, name))
            tx.run(S.SET_CTIME, (now_ns(), ino))

        self._run(txn)

    def listxattr(self, ino: int, ctx: Ctx = ROOT_CTX) -> list[bytes]:
        def txn(tx: Tx) -> list[bytes]:
            xattr_target(tx, ino, ctx, 0)
            names = (bytes(r[0]) for r in tx.all(S.LIST_XATTR, (ino,)))
            # trusted. names only for root (Linux: CAP_SYS_ADMIN); ACLs stored
            # before they were refused, for nobody.
            return [n for n in names if n not in ACL_XATTRS
                    and (ctx.is_root or not n.startswith(b"trusted."))]

        return self._run(txn, "read")

    def removexattr(self, ino: int, name: bytes, ctx: Ctx = ROOT_CTX) -> None:
        check_xattr_name(name)

        def txn(tx: Tx) -> None:
            xattr_target(tx, ino, ctx, W_OK)
            if not tx.run(S.DEL_XATTR, (ino, name)):
                raise FsError(E.ENODATA, f"no xattr {name!r} on inode {ino}", ino=ino, name=name)
            tx.run(S.SET_CTIME, (now_ns(), ino))

        self._run(txn)
