"""``SnapshotOps``: an instant copy of a file or a directory tree that shares
its slices (``MetaStore.snapshot``; docs/metadata.md, "Snapshots").

A slice is immutable and reference-counted by the chunk references naming
it, so a copy is metadata only: new inodes, entries, extended attributes,
chunks and chunk references beside the source's, and each slice's
``refcount`` raised by the references the copy adds. A later write to either
side makes new slices for that side alone; deleting either side drops only
its own references, and a slice is queued for deletion when the last side
naming it is gone (``core.deref_slices``). No byte is read or written on a
drive.

The copy is ONE transaction, so it is the source exactly as committed at one
instant (bytes a writer still holds in its buffers are not in it, as after a
crash). On PostgreSQL it runs at ``REPEATABLE READ`` (mode ``"snapshot"``):
every row it reads and another transaction changes before it commits is
either a row it also writes (the destination directory, each slice's
refcount) or one whose change does not matter to a copy of the instant it
read (a file of the source rewritten or moved meanwhile), so a concurrent
unlink that frees a slice the copy references makes one of the two fail and
run again. The destination directory is written first, before the walk: an
operation in that directory then waits for the copy instead of making it
start over (a busy destination would otherwise never let a large copy
commit). On SQLite it holds the write lock while it runs (other writers
wait; docs/metadata.md gives the rate).

Everything that can refuse the copy without walking the tree (the source
gone or unlinked, the destination taken, not writable, inside the source,
full of links) is checked before the tree is counted, so a refusal costs
two rows, not two walks.

A user (not root) copies as ``cp -p`` would let them: the copy is theirs,
files lose their set-id bits, only ``user.*`` and ``system.*`` extended
attributes come along (not ``security.capability`` or ``trusted.*``), and a
tree holding a device node is refused (EPERM, as ``mknod`` would be).

A read-only copy is immutable (``records.IMMUTABLE`` on every inode, write
bits cleared): the metadata engine refuses every change to it with EPERM,
root's included, until ``make_writable`` clears the flag on the tree (one
transaction; root or the copy's owner). A copy of a read-only copy is
writable unless asked for read-only too: that is how a version is restored.

Inode numbers are taken before the transaction, as every operation does
(``SqlCore._alloc``): the tree is counted in a read snapshot, that many
numbers plus a margin are allocated at once, and a tree that grew past them
before the copy ran is counted again.
"""

from __future__ import annotations

import errno as E
import functools
import stat
from collections import Counter
from dataclasses import dataclass, field

from shinglefs.meta import schema as S
from shinglefs.meta.backend import Tx
from shinglefs.meta.engine.core import SqlCore, attr_of, enoent, now_ns
from shinglefs.meta.engine.namespace import check_new_name
from shinglefs.meta.engine.permissions import check_may_write_dir, check_mutable, check_parent
from shinglefs.meta.errors import FsError, TxConflict
from shinglefs.meta.records import (
    IMMUTABLE,
    LINK_MAX,
    R_OK,
    ROOT_CTX,
    ROOT_INO,
    X_OK,
    Ctx,
    InodeAttr,
    permits,
)

SPARE_INODES = 64
"""Inode numbers allocated beyond the counted tree, for files made meanwhile."""
RECOUNTS = 5
"""How often a tree that outgrew its allocated numbers is counted again."""
_BATCH = 256  # source inodes per refcount query (an ``in_list`` size)

_CHILDREN = (
    f"SELECT d.name, d.cookie, {S.INODE_COLS_I} FROM dentries d JOIN inodes i ON i.ino = d.ino "
    "WHERE d.parent = ? ORDER BY d.cookie"
)
# The copy's inode: the source's row with a new number, link count, ctime,
# parent, owner (a user's copy is theirs) and mode (read-only copies, set-id
# bits); no retention rule (a snapshot keeps what it holds); generation 1 as
# for any new inode.
_COPY_INODE = (
    "INSERT INTO inodes (ino, mode, uid, gid, nlink, size, atime_ns, mtime_ns, ctime_ns, rdev, "
    "generation, flags, parent, next_cookie, tier, retention, target, replicas) "
    "SELECT ?, mode & ?, COALESCE(?, uid), COALESCE(?, gid), ?, size, atime_ns, mtime_ns, ?, "
    "rdev, 1, (flags & ?) | ?, ?, "
    "next_cookie, tier, NULL, target, replicas FROM inodes WHERE ino = ?"
)
_FLAGS_OF_PARENTS = (
    "SELECT p.flags FROM dentries d JOIN inodes p ON p.ino = d.parent WHERE d.ino = ?"
)
_COPY_DENTRY = "INSERT INTO dentries (parent, name, ino, cookie) VALUES (?, ?, ?, ?)"
_COPY_XATTRS = "INSERT INTO xattrs (ino, name, value) SELECT ?, name, value FROM xattrs WHERE ino = ?"
_COPY_CHUNKS = (
    "INSERT INTO chunks (ino, chunk_index, version, nrefs) "
    "SELECT ?, chunk_index, version, nrefs FROM chunks WHERE ino = ?"
)
_COPY_REFS = (
    "INSERT INTO chunk_refs (ino, chunk_index, seq, slice_id, chunk_offset, length, slice_offset) "
    "SELECT ?, chunk_index, seq, slice_id, chunk_offset, length, slice_offset "
    "FROM chunk_refs WHERE ino = ?"
)
_XATTRS_OF = "SELECT name, value FROM xattrs WHERE ino = ?"
_PUT_XATTR = "INSERT INTO xattrs (ino, name, value) VALUES (?, ?, ?)"
# The extended attributes a user's copy keeps: what an unprivileged ``cp -p``
# can set (not file capabilities or other security labels, nor trusted.*).
_USER_XATTRS = (b"user.", b"system.")
_ADD_REFS = "UPDATE slices SET refcount = refcount + ? WHERE id = ?"
_PARENT_OF = "SELECT parent FROM inodes WHERE ino = ?"


def _thaw(count: int) -> str:
    return f"UPDATE inodes SET flags = flags & ?, ctime_ns = ? WHERE ino IN ({S.in_marks(count)})"


def _refs_of(count: int) -> str:
    return (f"SELECT slice_id, COUNT(*) FROM chunk_refs WHERE ino IN ({S.in_marks(count)}) "
            "GROUP BY slice_id")


class _Outgrown(Exception):
    """The tree holds more inodes than were allocated for its copy."""


@dataclass
class _Tree:
    """A source tree as one transaction read it: its inodes in first-seen order
    (the root first) and its entries ``(parent, name, ino, cookie)``."""

    root: int
    inos: list[int] = field(default_factory=list)
    attrs: dict[int, InodeAttr] = field(default_factory=dict)
    entries: list[tuple[int, bytes, int, int]] = field(default_factory=list)
    links: Counter[int] = field(default_factory=Counter)  # entries naming each inode
    subdirs: Counter[int] = field(default_factory=Counter)  # subdirectories of each directory
    home: dict[int, int] = field(default_factory=dict)  # each inode's first directory


def _walk(tx: Tx, root: InodeAttr, *, only_immutable: bool = False) -> _Tree:
    """Every inode and entry below ``root`` (depth first), with their attributes;
    ``only_immutable``: not below (nor) an inode that is not ``IMMUTABLE``."""
    tree = _Tree(root.ino, [root.ino], {root.ino: root})
    if not stat.S_ISDIR(root.mode):
        return tree
    dirs = [root.ino]
    while dirs:
        parent = dirs.pop()
        for row in tx.all(_CHILDREN, (parent,)):
            name, cookie, a = bytes(row[0]), row[1], attr_of(row, 2)
            if only_immutable and not a.immutable:
                continue
            tree.entries.append((parent, name, a.ino, cookie))
            tree.links[a.ino] += 1
            if stat.S_ISDIR(a.mode):
                tree.subdirs[parent] += 1
                dirs.append(a.ino)
            if a.ino not in tree.attrs:
                tree.attrs[a.ino] = a
                tree.inos.append(a.ino)
                tree.home[a.ino] = parent
    return tree


def _check_copyable(tree: _Tree, ctx: Ctx) -> None:
    """EACCES unless ``ctx`` may read every file and list every directory of
    ``tree`` (what ``cp -a`` would need); EPERM for a user's copy of a device
    node (only root makes them)."""
    if ctx.uid == 0:
        return
    for a in tree.attrs.values():
        if stat.S_ISCHR(a.mode) or stat.S_ISBLK(a.mode):
            raise FsError(E.EPERM, f"inode {a.ino} is a device node: only root may copy it",
                          ino=a.ino)
        if stat.S_ISREG(a.mode) or stat.S_ISDIR(a.mode):
            want = R_OK | X_OK if stat.S_ISDIR(a.mode) else R_OK
            if not permits(a.mode, a.uid, a.gid, ctx, want):
                raise FsError(E.EACCES, f"no read permission on inode {a.ino}", ino=a.ino)


class SnapshotOps(SqlCore):
    """snapshot: a copy-on-write copy of a file or a directory tree."""

    def snapshot(
        self,
        src: int,
        parent: int,
        name: bytes,
        ctx: Ctx = ROOT_CTX,
        *,
        read_only: bool = False,
    ) -> InodeAttr:
        check_new_name(name)
        self._require_formatted()
        spare = SPARE_INODES
        for _ in range(RECOUNTS):
            count = self._run(functools.partial(self._count, src=src, parent=parent, name=name,
                                                ctx=ctx), "read")
            first = self._alloc_range(count + spare)
            numbers = range(first, first + count + spare)
            try:
                return self._run(
                    functools.partial(self._copy, src=src, parent=parent, name=name,
                                      numbers=numbers, ctx=ctx, read_only=read_only),
                    "snapshot",
                )
            except _Outgrown:
                spare *= 4
        raise TxConflict(f"the tree under inode {src} kept growing while it was copied")

    def make_writable(self, ino: int, ctx: Ctx = ROOT_CTX) -> int:
        def txn(tx: Tx) -> int:
            row = tx.one(S.SEL_INODE, (ino,))
            if row is None:
                raise enoent(ino)
            root = attr_of(row)
            if not root.immutable:
                raise FsError(E.EINVAL, f"inode {ino} is not a read-only snapshot", ino=ino)
            if any(p[0] & IMMUTABLE for p in tx.all(_FLAGS_OF_PARENTS, (ino,))):
                raise FsError(E.EPERM, f"inode {ino} is inside a read-only snapshot: only the "
                                       "whole snapshot is made writable", ino=ino)
            if ctx.uid not in (0, root.uid):
                raise FsError(E.EPERM, f"only root or the owner of inode {ino} may make it "
                                       "writable", ino=ino)
            now = now_ns()
            frozen = _walk(tx, root, only_immutable=True).inos
            for start in range(0, len(frozen), _BATCH):
                batch = S.in_list(frozen[start : start + _BATCH])
                tx.put(_thaw(len(batch)), (~IMMUTABLE, now, *batch))
            return len(frozen)

        return self._run(txn)

    def _alloc_range(self, count: int) -> int:
        """The first of ``count`` consecutive fresh inode numbers (one autocommit
        statement, outside any transaction, like ``_alloc``)."""
        row = self._run(lambda tx: tx.one(S.ALLOC_IDS, (count, "inode")), "autocommit")
        return int(row[0]) - count

    def _count(self, tx: Tx, src: int, parent: int, name: bytes, ctx: Ctx) -> int:
        """The inodes of the tree to copy, once every cheap refusal was checked."""
        root = self._source(tx, src)
        self._destination(tx, root, parent, name, ctx)
        tree = _walk(tx, root)
        _check_copyable(tree, ctx)
        return len(tree.inos)

    @staticmethod
    def _source(tx: Tx, src: int) -> InodeAttr:
        """The source's attributes: ENOENT when it is gone or unlinked (an open,
        unlinked file is not brought back, as ``link`` refuses to)."""
        row = tx.one(S.SEL_INODE, (src,))
        if row is None:
            raise enoent(src)
        root = attr_of(row)
        if root.nlink == 0:
            raise FsError(E.ENOENT, f"inode {src} is unlinked", ino=src)
        return root

    def _destination(self, tx: Tx, root: InodeAttr, parent: int, name: bytes,
                     ctx: Ctx) -> tuple[int, int, int]:
        """Checks on the new name: ``parent`` a directory ``ctx`` may write,
        ``name`` free in it, not inside a copied tree, room for one more
        subdirectory. Returns the parent's (mode, uid, gid) as read."""
        row = tx.one(S.PARENT_AND_CHILD, (name, parent))
        check_parent(row, parent, ctx)
        pmode, puid, pgid, pnlink = row[:4]
        if row[6] is not None:
            raise FsError(E.EEXIST, f"{name!r} exists in directory {parent}", ino=parent, name=name)
        check_mutable(row[S.PARENT_AND_CHILD_FLAGS], parent, "a new entry")
        check_may_write_dir(pmode, puid, pgid, ctx, parent)
        if stat.S_ISDIR(root.mode):
            self._refuse_inside(tx, root.ino, parent)
            if pnlink + 1 > LINK_MAX:
                raise FsError(E.EMLINK, f"directory {parent} has {LINK_MAX} subdirectories")
        return pmode, puid, pgid

    def _copy(
        self,
        tx: Tx,
        src: int,
        parent: int,
        name: bytes,
        numbers: range,
        ctx: Ctx,
        read_only: bool,
    ) -> InodeAttr:
        now = now_ns()
        root = self._source(tx, src)
        seen = self._destination(tx, root, parent, name, ctx)
        is_dir = stat.S_ISDIR(root.mode)
        # The destination first: a create there now waits for this copy rather
        # than making it start over (module docstring).
        tx.put(S.TOUCH_PARENT_TAKE_COOKIE, (now, now, 1 if is_dir else 0, parent, *seen))
        tree = _walk(tx, root)
        _check_copyable(tree, ctx)
        if len(tree.inos) > len(numbers):
            raise _Outgrown
        new = dict(zip(tree.inos, numbers, strict=False))
        # As ``cp -p`` by a user: the copy is the caller's, in the group a file
        # they made in ``parent`` would get (its own under a set-group-ID
        # directory), and a file loses its set-id bits (no one makes a setuid
        # file of another owner's by copying).
        group = seen[2] if seen[0] & stat.S_ISGID else ctx.gid
        owner = (None, None) if ctx.uid == 0 else (ctx.uid, group)
        size = 0
        flags = IMMUTABLE if read_only else 0
        for ino in tree.inos:
            old = tree.attrs[ino]
            size += old.size
            mask = ~0o222 if read_only else ~0
            if stat.S_ISDIR(old.mode):
                nlink = 2 + tree.subdirs[ino]
            else:
                nlink = max(tree.links[ino], 1)
                if ctx.uid != 0:
                    mask &= ~(stat.S_ISUID | stat.S_ISGID)
            home = new[tree.home[ino]] if ino in tree.home else parent
            tx.put(_COPY_INODE, (new[ino], mask, *owner, nlink, now, ~IMMUTABLE, flags, home,
                                 ino))
            self._copy_xattrs(tx, ino, new[ino], ctx)
            if stat.S_ISREG(old.mode):
                tx.put(_COPY_CHUNKS, (new[ino], ino))
                tx.put(_COPY_REFS, (new[ino], ino))
        for old_parent, entry, ino, cookie in tree.entries:
            tx.put(_COPY_DENTRY, (new[old_parent], entry, new[ino], cookie))
        self._add_references(tx, tree.inos)
        tx.insert(
            S.INS_NEW_DENTRY, (parent, name, new[src], parent, *seen),
            lambda: FsError(E.EEXIST, f"{name!r} exists in directory {parent}", ino=parent,
                            name=name),
            lambda: TxConflict(f"directory {parent} changed under a snapshot"),
        )
        self._counters(tx, size, len(tree.inos))
        return attr_of(tx.one(S.SEL_INODE, (new[src],)))

    @staticmethod
    def _copy_xattrs(tx: Tx, ino: int, copy: int, ctx: Ctx) -> None:
        """The extended attributes of ``ino`` onto ``copy``: all of them for root,
        a user's only those ``_USER_XATTRS`` name."""
        if ctx.uid == 0:
            tx.put(_COPY_XATTRS, (copy, ino))
            return
        for xname, value in tx.all(_XATTRS_OF, (ino,)):
            if bytes(xname).startswith(_USER_XATTRS):
                tx.put(_PUT_XATTR, (copy, bytes(xname), bytes(value)))

    @staticmethod
    def _refuse_inside(tx: Tx, src: int, parent: int) -> None:
        """EINVAL when ``parent`` is ``src`` or below it (a tree copied into itself)."""
        at = parent
        while True:
            if at == src:
                raise FsError(E.EINVAL, f"cannot copy directory {src} into itself", ino=src)
            if at == ROOT_INO:
                return
            up = tx.one(_PARENT_OF, (at,))
            if up is None or up[0] == at:
                return
            at = up[0]

    @staticmethod
    def _add_references(tx: Tx, inos: list[int]) -> None:
        """Raise each slice's refcount by the references the copy of ``inos`` adds."""
        counts: Counter[int] = Counter()
        for start in range(0, len(inos), _BATCH):
            batch = S.in_list(inos[start : start + _BATCH])
            for sid, n in tx.all(_refs_of(len(batch)), batch):
                counts[sid] += n
        # in_list pads a batch with repeats of its last inode, which IN ignores.
        for sid, n in sorted(counts.items()):
            tx.put(_ADD_REFS, (n, sid))
