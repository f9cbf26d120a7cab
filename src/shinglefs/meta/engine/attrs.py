"""Attributes and permissions of one inode: getattr, setattr (chmod, chown,
utimens, truncate), access, and a directory's policy (tier, retention, replication
goal; ``replica_goals``: the goal of files and directories, inherited from the
nearest directory above that sets one, in one recursive query).

Who may change what is decided by ``permissions.check_setattr_rights`` (Linux's
setattr_prepare); a size change drops the content past the new end in the
same transaction (``ChunkOps._drop_content_past``).
"""

from __future__ import annotations

import errno as E
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

from shinglefs.meta import schema as S
from shinglefs.meta.backend import Tx
from shinglefs.meta.engine.chunks import ChunkOps
from shinglefs.meta.engine.core import attr_of, enoent, now_ns
from shinglefs.meta.engine.permissions import (
    check_mutable,
    check_setattr_rights,
    permits,
    privileges_dropped,
)
from shinglefs.meta.errors import FsError
from shinglefs.meta.records import (
    MAX_FILE_SIZE,
    ROOT_CTX,
    TIERS,
    TIME_NS_MAX,
    TIME_NS_MIN,
    UTIME_NOW,
    UTIME_OMIT,
    W_OK,
    Ctx,
    DirPolicy,
    InodeAttr,
)

MAX_REPLICAS = 16
"""The largest replication goal a directory may set."""
GOALS_PAGE = 500
"""Inodes per ``replica_goals`` query (bounded statement size)."""


def _settable_time(ns: int | None) -> int | None:
    """A time setattr was given: None for UTIME_OMIT, UTIME_NOW as it is, any
    other clamped to what is kept (``TIME_NS_MIN``..``TIME_NS_MAX``)."""
    if ns is None or ns == UTIME_OMIT:
        return None
    if ns == UTIME_NOW:
        return ns
    return min(max(ns, TIME_NS_MIN), TIME_NS_MAX)


def check_replicas(replicas: int | None) -> None:
    """EINVAL unless ``replicas`` is None (inherit) or 1..``MAX_REPLICAS``."""
    if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int)
                                 or not 1 <= replicas <= MAX_REPLICAS):
        raise FsError(E.EINVAL, f"a replication goal is 1..{MAX_REPLICAS} copies, "
                                f"got {replicas!r}")


def _goals_of(tx: Tx, inos: list[int]) -> list[Any]:
    padded = S.in_list(inos)
    return tx.all(S.replica_goals(len(padded)), padded)


def _tiers_of(tx: Tx, inos: list[int]) -> list[Any]:
    padded = S.in_list(inos)
    return tx.all(S.placement_tiers(len(padded)), padded)


def check_tier(tier: str | None) -> None:
    """EINVAL for a tier that is not one of ``TIERS`` (None: no tier)."""
    if tier is not None and tier not in TIERS:
        raise FsError(E.EINVAL, f"tier {tier!r} is not one of {', '.join(TIERS)}")


def check_resizable(a: InodeAttr) -> None:
    """EISDIR for a directory, EINVAL for anything else that is not a regular file."""
    if a.is_dir:
        raise FsError(E.EISDIR, f"inode {a.ino} is a directory", ino=a.ino)
    if not a.is_file:
        raise FsError(E.EINVAL, f"inode {a.ino} is not a regular file", ino=a.ino)


class AttributeOps(ChunkOps):
    """getattr, setattr, truncate, access, set_policy, get_policy.

    On ``ChunkOps``: a size change is also a change of the chunk map.
    """

    def getattr(self, ino: int) -> InodeAttr:
        row = self._run(lambda tx: tx.one(S.SEL_INODE, (ino,)), "single")
        if row is None:
            raise enoent(ino)
        return attr_of(row)

    def setattr(
        self,
        ino: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
        ctx: Ctx = ROOT_CTX,
        open_for_write: bool = False,
        checked: bool = False,
    ) -> InodeAttr:
        atime_ns, mtime_ns = _settable_time(atime_ns), _settable_time(mtime_ns)
        if size is not None and size < 0:
            raise FsError(E.EINVAL, f"negative size {size}", ino=ino)
        if size is not None and size > MAX_FILE_SIZE:
            raise FsError(E.EFBIG, f"size {size} is past the largest file size, "
                          f"{MAX_FILE_SIZE}", ino=ino)
        chown = uid is not None or gid is not None

        def txn(tx: Tx) -> InodeAttr:
            now = now_ns()
            row = tx.one(S.SEL_INODE, (ino,))
            if row is None:
                raise enoent(ino)
            a = attr_of(row)
            new_mode, new_uid, new_gid = a.mode, a.uid, a.gid
            new_size, new_atime, new_mtime = a.size, a.atime_ns, a.mtime_ns
            if size is not None:
                check_resizable(a)  # EISDIR/EINVAL before EPERM, as Linux's truncate
            check_mutable(a.flags, ino, "changing its attributes")
            if chown:
                new_uid = a.uid if uid is None or uid == -1 else uid
                new_gid = a.gid if gid is None or gid == -1 else gid
            if not checked:
                check_setattr_rights(
                    a, ctx, owner=(new_uid, new_gid) if chown else None, mode=mode,
                    times=(atime_ns, mtime_ns), size=size, open_for_write=open_for_write)
            if chown and not a.is_dir:
                # Linux clears these on any chown of a file, root's included.
                new_mode &= ~stat.S_ISUID
                if new_mode & stat.S_IXGRP:
                    new_mode &= ~stat.S_ISGID
            if mode is not None:
                perm = mode & 0o7777
                if ctx.uid != 0 and not ctx.in_group(new_gid):  # directories too
                    perm &= ~stat.S_ISGID
                new_mode = stat.S_IFMT(a.mode) | perm
            if atime_ns is not None:
                new_atime = now if atime_ns == UTIME_NOW else atime_ns
            if mtime_ns is not None:
                new_mtime = now if mtime_ns == UTIME_NOW else mtime_ns
            if size is not None:
                check_resizable(a)
                new_mode &= ~privileges_dropped(new_mode, new_gid, ctx)
                if size != a.size:
                    self._drop_content_past(tx, a, size, now)
                if mtime_ns is None:  # as Linux's truncate(2): even to the same size
                    new_mtime = now
                new_size = size
            tx.run(
                S.UPDATE_ATTRS,
                (new_mode, new_uid, new_gid, new_size, new_atime, new_mtime, now, ino),
            )
            return replace(
                a, mode=new_mode, uid=new_uid, gid=new_gid, size=new_size,
                atime_ns=new_atime, mtime_ns=new_mtime, ctime_ns=now,
            )  # fmt: skip

        return self._run(txn)

    def truncate(self, ino: int, size: int, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        # One rule for every size change: setattr's (rights, times, content).
        return self.setattr(ino, size=size, ctx=ctx)

    def access(self, ctx: Ctx, ino: int, mask: int) -> None:
        row = self._run(lambda tx: tx.one(S.SEL_INODE, (ino,)), "single")
        if row is None:
            raise enoent(ino)
        if mask & W_OK:  # access(2): EPERM for writing an immutable inode, root's too
            check_mutable(row[11], ino, "writing it")
        if mask and not permits(row[1], row[2], row[3], ctx, mask):
            raise FsError(E.EACCES, f"access {mask:o} denied on inode {ino}", ino=ino)

    # ---- directory policy ----------------------------------------------------------------

    def set_policy(self, ino: int, policy: DirPolicy, ctx: Ctx = ROOT_CTX) -> None:
        check_replicas(policy.replicas)

        def txn(tx: Tx) -> None:
            row = tx.one(S.SEL_INODE, (ino,))
            if row is None:
                raise enoent(ino)
            # A tier stored before tiers were checked (any string was) stays
            # settable as it is: changing the rest of the policy keeps it.
            old = tx.one(S.SEL_POLICY, (ino,))
            if policy.tier != old[1]:
                check_tier(policy.tier)
            if not stat.S_ISDIR(row[1]):
                raise FsError(E.ENOTDIR, f"inode {ino} is not a directory", ino=ino)
            if ctx.uid not in (0, row[2]):
                raise FsError(E.EPERM, f"only the owner may set the policy of {ino}", ino=ino)
            if policy.retention != old[2]:  # placement may change, the content may not
                check_mutable(row[11], ino, "a retention rule")
            tx.run(S.SET_POLICY,
                   (policy.tier, policy.retention, policy.replicas, now_ns(), ino))

        self._run(txn)

    def get_policy(self, ino: int) -> DirPolicy:
        row = self._run(lambda tx: tx.one(S.SEL_POLICY, (ino,)), "single")
        if row is None:
            raise enoent(ino)
        if not stat.S_ISDIR(row[0]):
            raise FsError(E.ENOTDIR, f"inode {ino} is not a directory", ino=ino)
        return DirPolicy(row[1], row[2], None if row[3] is None else int(row[3]))

    def placement_tiers(self, inos: Iterable[int]) -> dict[int, str]:
        return {int(ino): str(tier) for ino, tier in self._by_pages(_tiers_of, inos)
                if tier is not None}

    def replica_goals(self, inos: Iterable[int]) -> dict[int, int]:
        return {int(start): int(goal) for start, goal in self._by_pages(_goals_of, inos)}

    def _by_pages(self, query: Callable[[Tx, list[int]], list[Any]],
                  inos: Iterable[int]) -> Iterator[Any]:
        """The rows of ``query`` over the distinct ``inos``, ``GOALS_PAGE`` of them
        a read transaction (bounded statements)."""
        wanted = sorted(set(inos))
        for at in range(0, len(wanted), GOALS_PAGE):
            page = wanted[at:at + GOALS_PAGE]

            def read(tx: Tx, page: list[int] = page) -> list[Any]:
                return query(tx, page)

            yield from self._run(read, "read")
