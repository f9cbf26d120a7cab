"""The namespace: looking names up, creating, linking and removing entries.

Directory entries are keyed by ``(parent, name)`` (lookup is one point read)
and carry a cookie assigned once at insertion from the parent's
``next_cookie`` (listing is one range scan on ``(parent, cookie)``). Each
public method is one transaction; checks run in Linux's order so the errno a
caller sees is the one Linux would give. Rename has a room of its own
(``rename.py``); attributes and permissions are in ``attrs.py`` and
``permissions.py``.
"""

from __future__ import annotations

import errno as E
import stat
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from shinglefs.meta import schema as S
from shinglefs.meta.backend import Tx
from shinglefs.meta.engine.core import SqlCore, attr_of, enoent, now_ns
from shinglefs.meta.engine.permissions import (
    check_may_write_dir,
    check_mutable,
    check_parent,
    permits,
    sticky_ok,
)
from shinglefs.meta.errors import FsError, TxConflict
from shinglefs.meta.records import (
    FIRST_COOKIE,
    LINK_MAX,
    NAME_MAX,
    R_OK,
    ROOT_CTX,
    SYMLINK_MAX,
    W_OK,
    X_OK,
    Created,
    Ctx,
    DirEntry,
    InodeAttr,
    UnlinkResult,
)

NAME_TYPES = (bytes, bytearray)
"""What a name may be (a tuple: ``bytes | bytearray`` would build a union on every call)."""


def check_name(name: bytes) -> None:
    """EINVAL for names no path component can be; ENAMETOOLONG above NAME_MAX."""
    if not isinstance(name, NAME_TYPES):
        raise FsError(E.EINVAL, f"a name must be bytes, not {type(name).__name__}")
    if not name or b"/" in name or b"\0" in name:
        raise FsError(E.EINVAL, f"invalid name {bytes(name)!r}", name=bytes(name))
    if len(name) > NAME_MAX:
        raise FsError(E.ENAMETOOLONG, f"name of {len(name)} bytes (max {NAME_MAX})")


def check_new_name(name: bytes) -> None:
    """``check_name``, and EEXIST for ``.`` and ``..`` (they always exist)."""
    check_name(name)
    if name in (b".", b".."):
        raise FsError(E.EEXIST, f"{name!r} always exists", name=name)


def no_entry(parent: int, name: bytes) -> FsError:
    return FsError(E.ENOENT, f"no entry {name!r} in directory {parent}", ino=parent, name=name)


def open_in_session(tx: Tx, session: int | None, ino: int) -> None:
    """Open ``ino`` for ``session`` inside ``tx`` (nothing when None); ESTALE
    for an unknown session."""
    if session is None:
        return
    tx.insert(S.OPEN_IN_SESSION, (session, ino),
              lambda: FsError(E.ESTALE, f"unknown session {session}"))


class _NotAsSeen(Exception):
    """A create tried on the parent as seen cannot be made so (``_create_on_seen``)."""


class NamespaceOps(SqlCore):
    """lookup, mknod, mkdir, create, symlink, link, unlink, rmdir, readlink, readdir."""

    def lookup(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        check_name(name)
        if name in (b".", b".."):

            def dots(tx: Tx) -> InodeAttr:
                row = tx.one(S.SEL_INODE_EXTRA, (parent,))
                check_parent(row and row[1:4], parent, ctx)
                if name == b".":
                    return attr_of(row)
                up = tx.one(S.SEL_INODE, (row[12],))
                if up is None:
                    raise enoent(row[12])
                return attr_of(up)

            return self._run(dots, "read")

        def txn(tx: Tx) -> InodeAttr:
            row = tx.one(S.LOOKUP_ATTR, (name, parent))
            check_parent(row, parent, ctx)
            if row[4] is None:
                raise no_entry(parent, name)
            return attr_of(row, 4)

        return self._run(txn, "single")

    # ---- creating ------------------------------------------------------------------------

    def _new_inode(
        self,
        tx: Tx,
        parent: int,
        name: bytes,
        ino: int,
        mode: int,
        ctx: Ctx,
        now: int,
        *,
        rdev: int = 0,
        size: int = 0,
        target: bytes | None = None,
        row: Any = None,
        changed: Callable[[], BaseException] | None = None,
        exists: Callable[[], BaseException] | None = None,
    ) -> InodeAttr:
        """Insert entry + inode under ``parent`` (checks, cookie, parent touch,
        counters). ``row``: PARENT_AND_CHILD's row, when the caller read it.
        One round trip to PostgreSQL: the rest is sent with the COMMIT.

        Safe at READ COMMITTED (mode "committed"): the parent is written only
        if its mode, owner and group are still those checked, and the entry
        takes its cookie only from that write (``INS_NEW_DENTRY``): a parent
        changed or removed since the read (chmod, rmdir) fails the insert and
        the operation runs again (``TxConflict``); a concurrent create in the
        same directory only makes the write wait for its row. The absent name
        is guarded by the entry's primary key, the new inode and counter
        delta are fresh rows. A session it opens in is locked
        (``OPEN_IN_SESSION``; gone: ESTALE); an expiry of that session that
        still commits after it leaves an open record the next expiry pass
        collects (``SEL_STRAY_OPEN``). An existing file ``create`` opens (not
        exclusive) must still have a link when written (``TOUCH_INODE``).
        ``changed``/``exists``: what a changed parent (else ``TxConflict``) or
        an existing name (else EEXIST) raises instead."""
        is_dir = stat.S_ISDIR(mode)
        if row is None:
            row = tx.one(S.PARENT_AND_CHILD, (name, parent))
        check_parent(row, parent, ctx)
        pmode, puid, pgid, pnlink, tier, retention = row[:6]

        def name_exists() -> BaseException:
            if exists is not None:
                return exists()
            return FsError(E.EEXIST, f"{name!r} exists in directory {parent}", ino=parent, name=name)

        def parent_changed() -> BaseException:
            if changed is not None:
                return changed()
            return TxConflict(f"directory {parent} changed under a create")

        if row[6] is not None:
            raise name_exists()  # before EACCES, as on Linux
        check_mutable(row[S.PARENT_AND_CHILD_FLAGS], parent, "a new entry")
        check_may_write_dir(pmode, puid, pgid, ctx, parent)
        seen = (pmode, puid, pgid)  # as checked: the writes apply only if still so
        tx.put(S.TOUCH_PARENT_TAKE_COOKIE, (now, now, 1 if is_dir else 0, parent, *seen))
        tx.insert(S.INS_NEW_DENTRY, (parent, name, ino, parent, *seen), name_exists,
                  parent_changed)  # name_exists: a racing create
        if is_dir and pnlink + 1 > LINK_MAX:  # pnlink: before this entry
            raise FsError(E.EMLINK, f"directory {parent} has {LINK_MAX} subdirectories")
        gid = ctx.gid
        if pmode & stat.S_ISGID:
            gid = pgid
            if is_dir:
                mode |= stat.S_ISGID
        if not is_dir:
            tier = None
        retention = None  # a rule keeps its own directory's entries, not its subdirectories'
        attr = InodeAttr(
            ino, mode, ctx.uid, gid, 2 if is_dir else 1, size, now, now, now, rdev, 1, 0
        )
        tx.put(
            S.INS_INODE,
            (
                ino, mode, ctx.uid, gid, attr.nlink, size, now, now, now, rdev, 1, 0,
                parent, FIRST_COOKIE, tier, retention, target,
            ),
        )  # fmt: skip
        self._counters(tx, size, 1)
        return attr

    def mknod(
        self, parent: int, name: bytes, mode: int, rdev: int = 0, ctx: Ctx = ROOT_CTX
    ) -> InodeAttr:
        check_new_name(name)
        kind = stat.S_IFMT(mode)
        if kind == 0:
            kind = stat.S_IFREG
        if kind == stat.S_IFDIR:
            raise FsError(E.EPERM, "mknod cannot make a directory (use mkdir)")
        if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK):
            raise FsError(E.EINVAL, f"mknod of unknown type {kind:o}")
        if kind in (stat.S_IFCHR, stat.S_IFBLK) and ctx.uid != 0:
            raise FsError(E.EPERM, "only root may make device nodes")
        if kind not in (stat.S_IFCHR, stat.S_IFBLK):
            rdev = 0
        full = kind | (mode & ~ctx.umask & 0o7777)
        ino = self._alloc("inode")
        return self._run(
            lambda tx: self._new_inode(tx, parent, name, ino, full, ctx, now_ns(), rdev=rdev),
            "committed",
        )

    def mkdir(self, parent: int, name: bytes, mode: int, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        check_new_name(name)
        full = stat.S_IFDIR | (mode & ~ctx.umask & 0o7777)
        ino = self._alloc("inode")
        return self._run(lambda tx: self._new_inode(tx, parent, name, ino, full, ctx, now_ns()),
                         "committed")

    def create_file(
        self,
        parent: int,
        name: bytes,
        mode: int,
        ctx: Ctx = ROOT_CTX,
        *,
        exclusive: bool = True,
        session: int | None = None,
        parent_seen: tuple[int, int, int] | None = None,
    ) -> Created:
        check_new_name(name)
        full = stat.S_IFREG | (mode & ~ctx.umask & 0o7777)
        ino = self._alloc("inode")
        if parent_seen is not None:
            try:
                return Created(self._create_on_seen(parent, name, ino, full, ctx, exclusive,
                                                    session, parent_seen), True)
            except _NotAsSeen:
                pass  # read the parent and the name: as if nothing had been seen

        def txn(tx: Tx) -> InodeAttr:
            row = tx.one(S.PARENT_AND_CHILD, (name, parent))
            if not exclusive and row is not None and row[6] is not None:
                check_parent(row, parent, ctx)
                attr = attr_of(row, 6)
                if attr.is_dir:
                    raise FsError(E.EISDIR, f"{name!r} is a directory", ino=attr.ino, name=name)
                if attr.is_symlink:  # the caller follows it (the kernel does, before create)
                    raise FsError(E.EEXIST, f"{name!r} is a symbolic link", ino=attr.ino,
                                  name=name)
                if self._b.dialect.row_locks:  # write what is read: see _new_inode
                    tx.need(S.TOUCH_INODE, (attr.ino,),
                            lambda: TxConflict(f"{name!r} was unlinked under an open"))
                open_in_session(tx, session, attr.ino)
                return attr
            attr = self._new_inode(tx, parent, name, ino, full, ctx, now_ns(), row=row)
            open_in_session(tx, session, ino)
            return attr

        attr = self._run(txn, "committed")
        return Created(attr, attr.ino == ino)  # ``ino`` is this call's: no one else has it

    def _create_on_seen(self, parent: int, name: bytes, ino: int, mode: int, ctx: Ctx,
                        exclusive: bool, session: int | None,
                        seen: tuple[int, int, int]) -> InodeAttr:
        """``create`` of a new name, the checks made on the parent's mode, owner
        and group as the caller saw them (``seen``) instead of reading them:
        the writes apply only if they are still those (``_new_inode``), so the
        whole transaction is sent at once (one round trip on PostgreSQL, one
        statement fewer on SQLite). ``_NotAsSeen`` (nothing written) when the
        parent changed or is gone, when ``seen`` forbids the create (the
        answer is then the parent's current rights, read anew), or when the
        name exists and the create is not exclusive (the file is opened)."""
        if not (stat.S_ISDIR(seen[0]) and permits(seen[0], seen[1], seen[2], ctx, W_OK | X_OK)):
            raise _NotAsSeen()
        # PARENT_AND_CHILD's row as seen: no child; flags 0, as the writes
        # check (an immutable parent fails them: _NotAsSeen, then read anew).
        row = (*seen, 0, None, None, *(None,) * 12, 0)

        def txn(tx: Tx) -> InodeAttr:
            attr = self._new_inode(tx, parent, name, ino, mode, ctx, now_ns(), row=row,
                                   changed=_NotAsSeen, exists=None if exclusive else _NotAsSeen)
            open_in_session(tx, session, ino)
            return attr

        return self._run(txn, "committed")

    def symlink(self, parent: int, name: bytes, target: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        check_new_name(name)
        if not target:
            raise FsError(E.ENOENT, "empty symlink target")
        if len(target) > SYMLINK_MAX:
            raise FsError(
                E.ENAMETOOLONG, f"symlink target of {len(target)} bytes (max {SYMLINK_MAX})"
            )
        ino = self._alloc("inode")
        mode = stat.S_IFLNK | 0o777
        return self._run(
            lambda tx: self._new_inode(
                tx, parent, name, ino, mode, ctx, now_ns(), size=len(target), target=bytes(target)
            ),
            "committed",
        )

    def link(self, ino: int, new_parent: int, new_name: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        check_new_name(new_name)

        def txn(tx: Tx) -> InodeAttr:
            now = now_ns()
            row = tx.one(S.SEL_INODE, (ino,))
            if row is None or row[4] == 0:
                raise FsError(E.ENOENT, f"inode {ino} has no links left", ino=ino)
            a = attr_of(row)
            self._lock_rows(tx, ino, new_parent)
            prow = tx.one(S.TOUCH_PARENT_FOR_INSERT, (now, now, 0, new_parent))
            check_parent(prow, new_parent, ctx)
            if not tx.run(S.INS_DENTRY, (new_parent, new_name, ino, prow[4])):
                raise FsError(
                    E.EEXIST,
                    f"{new_name!r} exists in directory {new_parent}",
                    ino=new_parent,
                    name=new_name,
                )
            check_mutable(prow[7], new_parent, "a new entry")
            check_may_write_dir(prow[0], prow[1], prow[2], ctx, new_parent)
            check_mutable(a.flags, ino, "a new link")
            if a.is_dir:
                raise FsError(E.EPERM, f"cannot hard-link directory {ino}", ino=ino)
            if a.nlink >= LINK_MAX:
                raise FsError(E.EMLINK, f"inode {ino} already has {a.nlink} links", ino=ino)
            nlink = tx.one(S.SET_NLINK_CTIME, (1, now, ino))[0]
            return replace(a, nlink=nlink, ctime_ns=now)

        return self._run(txn)

    # ---- removing ------------------------------------------------------------------------

    def unlink(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> UnlinkResult:
        check_name(name)
        if name in (b".", b".."):
            raise FsError(E.EISDIR, f"cannot unlink {name!r}", name=name)
        return self._run(lambda tx: self._remove(tx, parent, name, ctx, want_dir=False))

    def rmdir(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> UnlinkResult:
        check_name(name)
        if name == b".":
            raise FsError(E.EINVAL, "cannot rmdir '.'", name=name)
        if name == b"..":
            raise FsError(E.ENOTEMPTY, "cannot rmdir '..'", name=name)
        return self._run(lambda tx: self._remove(tx, parent, name, ctx, want_dir=True))

    def _remove(
        self, tx: Tx, parent: int, name: bytes, ctx: Ctx, *, want_dir: bool
    ) -> UnlinkResult:
        now = now_ns()
        row = tx.one(S.LOOKUP_ATTR, (name, parent))
        check_parent(row, parent, ctx)
        if row[4] is None:
            raise no_entry(parent, name)
        pmode, puid, pgid = row[0], row[1], row[2]
        victim = attr_of(row, 4)
        self._lock_rows(tx, parent, victim.ino)
        check_mutable(row[S.LOOKUP_ATTR_FLAGS], parent, "removing an entry")
        check_may_write_dir(pmode, puid, pgid, ctx, parent)
        if not sticky_ok(pmode, puid, victim.uid, ctx):
            raise FsError(
                E.EPERM, f"sticky directory {parent}: {name!r} is not yours", ino=parent, name=name
            )
        check_mutable(victim.flags, victim.ino, "removing it")
        if want_dir and not victim.is_dir:
            raise FsError(E.ENOTDIR, f"{name!r} is not a directory", ino=victim.ino, name=name)
        if not want_dir and victim.is_dir:
            raise FsError(E.EISDIR, f"{name!r} is a directory", ino=victim.ino, name=name)
        if want_dir and tx.one(S.ANY_CHILD, (victim.ino,)) is not None:
            raise FsError(
                E.ENOTEMPTY, f"directory {name!r} is not empty", ino=victim.ino, name=name
            )
        tx.run(S.DEL_DENTRY, (parent, name))
        tx.run(S.TOUCH_DIR, (now, now, -1 if want_dir else 0, parent))
        if want_dir:
            self._free_inode(tx, victim.ino, victim.size, now)
            return UnlinkResult(replace(victim, nlink=0, ctime_ns=now), True)
        nlink = tx.one(S.SET_NLINK_CTIME, (-1, now, victim.ino))[0]
        released = nlink <= 0 and self._free_if_orphan(tx, victim.ino, now)
        return UnlinkResult(replace(victim, nlink=nlink, ctime_ns=now), released)

    # ---- reading -------------------------------------------------------------------------

    def readlink(self, ino: int) -> bytes:
        row = self._run(lambda tx: tx.one(S.SEL_INODE_EXTRA, (ino,)), "single")
        if row is None:
            raise enoent(ino)
        if not stat.S_ISLNK(row[1]):
            raise FsError(E.EINVAL, f"inode {ino} is not a symlink", ino=ino)
        return bytes(row[13])

    def readdir(
        self, ino: int, cookie: int = 0, limit: int = 1024, ctx: Ctx = ROOT_CTX
    ) -> list[DirEntry]:
        def txn(tx: Tx) -> list[DirEntry]:
            row = tx.one(S.SEL_INODE, (ino,))
            if row is None:
                raise enoent(ino)
            if not stat.S_ISDIR(row[1]):
                raise FsError(E.ENOTDIR, f"inode {ino} is not a directory", ino=ino)
            if not permits(row[1], row[2], row[3], ctx, R_OK):
                raise FsError(E.EACCES, f"no read permission on directory {ino}", ino=ino)
            rows = tx.all(S.READDIR, (ino, cookie, limit))
            return [DirEntry(bytes(r[0]), r[2], attr_of(r, 2), r[1]) for r in rows]

        return self._run(txn, "read")
