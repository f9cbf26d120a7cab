"""Rename: one transaction that checks in Linux's order, then moves.

The checks, in the order ``do_renameat2`` makes them (so the errno is the one
Linux gives when several apply):

1. arguments: flags, names, ``.``/``..`` (before any transaction);
2. both ends: parents exist, are directories and searchable; the source
   exists; RENAME_EXCHANGE needs a target, RENAME_NOREPLACE refuses one;
3. ancestry: a directory cannot move into its own subtree (EINVAL) nor
   replace an ancestor of the source (ENOTEMPTY; EINVAL for an exchange);
4. two names of one inode: success, nothing changes;
5. rights and types (``may_delete``/``may_create`` of each side): write and
   search on both parents, the sticky bit, an immutable parent, source or
   target (EPERM: a read-only snapshot's), directory vs non-directory, write
   permission on a directory that changes parent;
6. emptiness of a replaced directory.

Only then do the moves run: ``_exchange`` swaps two entries, ``_move`` moves
one and releases what it replaced. On PostgreSQL the inode rows involved are
locked in ascending order before step 5 (``SqlCore._lock_rows``).
"""

from __future__ import annotations

import errno as E
from dataclasses import replace
from typing import NamedTuple

from shinglefs.meta import schema as S
from shinglefs.meta.backend import Tx
from shinglefs.meta.engine.core import SqlCore, attr_of, enoent, now_ns
from shinglefs.meta.engine.namespace import check_name, no_entry
from shinglefs.meta.engine.permissions import (
    check_may_write_dir,
    check_mutable,
    check_parent,
    permits,
    sticky_ok,
)
from shinglefs.meta.errors import FsError
from shinglefs.meta.records import (
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    ROOT_CTX,
    ROOT_INO,
    W_OK,
    Ctx,
    InodeAttr,
    RenameResult,
)


class RenameSides(NamedTuple):
    """Both ends of a rename as its transaction found them: each parent's
    ``(mode, uid, gid, flags)``, the source inode and the target inode (None: free);
    ``cross``: the entry changes directory. (A NamedTuple: built on every
    rename, it costs a fifth of a frozen dataclass's construction.)"""

    old_parent: int
    old_name: bytes
    new_parent: int
    new_name: bytes
    old_dir: tuple[int, int, int, int]
    new_dir: tuple[int, int, int, int]
    src: InodeAttr
    dst: InodeAttr | None
    exchange: bool
    cross: bool


def check_rename_args(old_name: bytes, new_name: bytes, flags: int) -> None:
    """Step 1: EINVAL for unknown or contradictory flags or a bad name; EBUSY
    for ``.``/``..`` (EEXIST onto them with RENAME_NOREPLACE)."""
    if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == (
        RENAME_NOREPLACE | RENAME_EXCHANGE
    ):
        raise FsError(E.EINVAL, f"bad rename flags {flags:#x}")
    check_name(old_name)
    check_name(new_name)
    if old_name in (b".", b".."):
        raise FsError(E.EBUSY, f"cannot rename {old_name!r}", name=old_name)
    if new_name in (b".", b".."):
        raise FsError(
            E.EEXIST if flags & RENAME_NOREPLACE else E.EBUSY,
            f"cannot rename onto {new_name!r}",
            name=new_name,
        )


def check_rename_rights(s: RenameSides, ctx: Ctx) -> None:
    """Step 5: may ``ctx`` take the source out of its directory and put it (or,
    for an exchange, the target too) into the other; do the types fit?"""
    src, dst = s.src, s.dst
    omode, ouid, ogid, oflags = s.old_dir  # unpacked, not *-passed: a rename is a hot path
    nmode, nuid, ngid, nflags = s.new_dir
    check_mutable(oflags, s.old_parent, "removing an entry")
    check_may_write_dir(omode, ouid, ogid, ctx, s.old_parent)
    if not sticky_ok(omode, ouid, src.uid, ctx):
        raise FsError(E.EPERM, f"sticky directory {s.old_parent}: {s.old_name!r} is not yours")
    check_mutable(src.flags, src.ino, "renaming it")
    check_mutable(nflags, s.new_parent, "a new entry")
    check_may_write_dir(nmode, nuid, ngid, ctx, s.new_parent)
    if dst is not None:
        if not sticky_ok(nmode, nuid, dst.uid, ctx):
            raise FsError(E.EPERM, f"sticky directory {s.new_parent}: {s.new_name!r} is not yours")
        check_mutable(dst.flags, dst.ino, "replacing it")
        if not s.exchange and src.is_dir and not dst.is_dir:
            raise FsError(E.ENOTDIR, f"{s.new_name!r} is not a directory", ino=dst.ino)
        if not s.exchange and not src.is_dir and dst.is_dir:
            raise FsError(E.EISDIR, f"{s.new_name!r} is a directory", ino=dst.ino)
    # A directory that changes parent rewrites its "..": it must be writable.
    if s.cross and src.is_dir and not permits(src.mode, src.uid, src.gid, ctx, W_OK):
        raise FsError(E.EACCES, f"moving directory {src.ino} needs write permission on it")
    if (
        s.exchange
        and s.cross
        and dst is not None
        and dst.is_dir
        and not permits(dst.mode, dst.uid, dst.gid, ctx, W_OK)
    ):
        raise FsError(E.EACCES, f"moving directory {dst.ino} needs write permission on it")


class RenameOps(SqlCore):
    """``rename``: its checks (``check_rename_*``, ``_find_sides``,
    ``_check_ancestry``) and its moves (``_exchange``, ``_move``)."""

    def rename(
        self,
        old_parent: int,
        old_name: bytes,
        new_parent: int,
        new_name: bytes,
        flags: int = 0,
        ctx: Ctx = ROOT_CTX,
    ) -> RenameResult:
        check_rename_args(old_name, new_name, flags)

        def txn(tx: Tx) -> RenameResult:
            now = now_ns()
            s = self._find_sides(tx, old_parent, old_name, new_parent, new_name, flags, ctx)
            self._check_ancestry(tx, s)
            if s.dst is not None and s.dst.ino == s.src.ino:
                return RenameResult(s.src.ino, None, False)
            self._lock_rows(tx, old_parent, new_parent, s.src.ino, s.dst.ino if s.dst else None)
            check_rename_rights(s, ctx)
            if s.exchange:
                return self._exchange(tx, s, now)
            dst = s.dst
            if dst is not None and dst.is_dir and tx.one(S.ANY_CHILD, (dst.ino,)) is not None:
                raise FsError(E.ENOTEMPTY, f"directory {new_name!r} is not empty", ino=dst.ino)
            return self._move(tx, s, now)

        return self._run(txn)

    # ---- checks --------------------------------------------------------------------------

    @staticmethod
    def _find_sides(
        tx: Tx,
        old_parent: int,
        old_name: bytes,
        new_parent: int,
        new_name: bytes,
        flags: int,
        ctx: Ctx,
    ) -> RenameSides:
        """Step 2: read both entries with their parents and check what the
        flags ask of the target."""
        srow = tx.one(S.LOOKUP_ATTR, (old_name, old_parent))
        check_parent(srow, old_parent, ctx)
        drow = tx.one(S.LOOKUP_ATTR, (new_name, new_parent))
        check_parent(drow, new_parent, ctx)
        if srow[4] is None:
            raise no_entry(old_parent, old_name)
        dst = attr_of(drow, 4) if drow[4] is not None else None
        exchange = bool(flags & RENAME_EXCHANGE)
        if exchange and dst is None:
            raise FsError(
                E.ENOENT, f"no entry {new_name!r} to exchange with", ino=new_parent, name=new_name
            )
        if dst is not None and flags & RENAME_NOREPLACE:
            raise FsError(
                E.EEXIST,
                f"{new_name!r} exists in directory {new_parent}",
                ino=new_parent,
                name=new_name,
            )
        return RenameSides(
            old_parent, old_name, new_parent, new_name,
            (srow[0], srow[1], srow[2], srow[S.LOOKUP_ATTR_FLAGS]),
            (drow[0], drow[1], drow[2], drow[S.LOOKUP_ATTR_FLAGS]),
            attr_of(srow, 4), dst, exchange, old_parent != new_parent,
        )  # fmt: skip

    def _check_ancestry(self, tx: Tx, s: RenameSides) -> None:
        """Step 3: no directory moves into its own subtree or replaces one of
        the source's ancestors (Linux checks this before anything else)."""
        if not s.cross:
            return
        if s.src.is_dir and self._is_ancestor(tx, s.src.ino, s.new_parent):
            raise FsError(
                E.EINVAL, f"cannot move directory {s.src.ino} into its own subtree", ino=s.src.ino
            )
        dst = s.dst
        if dst is not None and dst.is_dir and self._is_ancestor(tx, dst.ino, s.old_parent):
            raise FsError(
                E.EINVAL if s.exchange else E.ENOTEMPTY,
                f"directory {dst.ino} is an ancestor of the source",
                ino=dst.ino,
            )

    def _is_ancestor(self, tx: Tx, dir_ino: int, start: int) -> bool:
        """True if directory ``dir_ino`` is ``start`` or lies on its path to the root."""
        cur = start
        for _ in range(100_000):
            if cur == dir_ino:
                return True
            if cur == ROOT_INO:
                return False
            row = tx.one(S.SEL_INODE_EXTRA, (cur,))
            if row is None:
                raise enoent(cur)
            cur = row[12]
        raise FsError(E.ELOOP, "directory parent chain does not reach the root")

    # ---- moves ---------------------------------------------------------------------------

    def _exchange(self, tx: Tx, s: RenameSides, now: int) -> RenameResult:
        """RENAME_EXCHANGE: swap the inodes of the two entries; directories that
        change parent take their subdirectory link along."""
        src, dst = s.src, s.dst
        assert dst is not None
        tx.run(S.SET_DENTRY_INO, (dst.ino, s.old_parent, s.old_name))
        tx.run(S.SET_DENTRY_INO, (src.ino, s.new_parent, s.new_name))
        old_delta = new_delta = 0
        if s.cross:
            shift = int(src.is_dir) - int(dst.is_dir)
            old_delta, new_delta = -shift, shift
            if src.is_dir:
                tx.run(S.SET_PARENT, (s.new_parent, now, src.ino))
            if dst.is_dir:
                tx.run(S.SET_PARENT, (s.old_parent, now, dst.ino))
        tx.run(S.SET_CTIME, (now, src.ino))
        tx.run(S.SET_CTIME, (now, dst.ino))
        tx.run(S.TOUCH_DIR, (now, now, old_delta, s.old_parent))
        if s.cross:
            tx.run(S.TOUCH_DIR, (now, now, new_delta, s.new_parent))
        return RenameResult(src.ino, replace(dst, ctime_ns=now), False)

    def _move(self, tx: Tx, s: RenameSides, now: int) -> RenameResult:
        """Move the source entry to the target name (a new cookie there), after
        dropping the target's entry: a replaced directory is freed (it is
        empty), a replaced file loses a link and is freed if that was its last
        and nobody holds it open."""
        src, dst = s.src, s.dst
        released = False
        replaced: InodeAttr | None = None
        old_delta = new_delta = 0
        if dst is not None:
            tx.run(S.DEL_DENTRY, (s.new_parent, s.new_name))
            if dst.is_dir:
                self._free_inode(tx, dst.ino, dst.size, now)
                new_delta -= 1
                released = True
                replaced = replace(dst, nlink=0, ctime_ns=now)
            else:
                nlink = tx.one(S.SET_NLINK_CTIME, (-1, now, dst.ino))[0]
                released = nlink <= 0 and self._free_if_orphan(tx, dst.ino, now)
                replaced = replace(dst, nlink=nlink, ctime_ns=now)
        cookie = tx.one(S.TAKE_COOKIE, (s.new_parent,))[0]
        tx.run(S.MOVE_DENTRY, (s.new_parent, s.new_name, cookie, s.old_parent, s.old_name))
        if src.is_dir and s.cross:
            old_delta -= 1
            new_delta += 1
            tx.run(S.SET_PARENT, (s.new_parent, now, src.ino))
        else:
            tx.run(S.SET_CTIME, (now, src.ino))
        if s.cross:
            tx.run(S.TOUCH_DIR, (now, now, old_delta, s.old_parent))
            tx.run(S.TOUCH_DIR, (now, now, new_delta, s.new_parent))
        else:
            tx.run(S.TOUCH_DIR, (now, now, old_delta + new_delta, s.old_parent))
        return RenameResult(src.ino, replaced, released)
