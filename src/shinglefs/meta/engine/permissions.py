"""Linux's permission rules on mode bits, as pure functions (no database).

``permits`` (generic_permission without ACLs) lives in ``meta.records``, where
clients use it too; ``check_setattr_rights`` is who
may make a ``setattr`` change; ``check_parent`` is the check every operation
on a directory entry makes of its parent; ``sticky_ok`` the sticky-bit rule
for removing or replacing an entry; ``check_mutable`` refuses any change of
a read-only snapshot's inode, root's included. Each raises ``FsError`` or answers a bool;
none changes anything.
"""

from __future__ import annotations

import errno as E
import stat
from typing import Any

from shinglefs.meta.errors import FsError
from shinglefs.meta.records import IMMUTABLE, UTIME_NOW, W_OK, X_OK, Ctx, InodeAttr, permits


def check_mutable(flags: int, ino: int, what: str) -> None:
    """EPERM, whoever asks (root too), when ``flags`` mark an ``IMMUTABLE`` inode
    (a read-only snapshot's): ``what`` is the change refused, for the message."""
    if flags & IMMUTABLE:
        raise FsError(E.EPERM, f"inode {ino} is part of a read-only snapshot: {what} refused "
                               "(`shinglefs snapshot --delete` removes one)", ino=ino)


def sticky_ok(pmode: int, puid: int, victim_uid: int, ctx: Ctx) -> bool:
    """May ``ctx`` remove or replace an entry owned by ``victim_uid`` in a
    directory of mode ``pmode`` owned by ``puid`` (the sticky-bit rule)?"""
    return not (pmode & stat.S_ISVTX) or ctx.uid in (0, puid, victim_uid)


def check_parent(row: Any, parent: int, ctx: Ctx) -> None:
    """Checks on the parent part of a LOOKUP/LOOKUP_ATTR row (mode, uid, gid
    first; None when ``parent`` does not exist): it exists (ENOENT), is a
    directory (ENOTDIR) and ``ctx`` may search it (EACCES)."""
    if row is None:
        raise FsError(E.ENOENT, f"no directory {parent}", ino=parent)
    pmode, puid, pgid = row[0], row[1], row[2]
    if not stat.S_ISDIR(pmode):
        raise FsError(E.ENOTDIR, f"inode {parent} is not a directory", ino=parent)
    if not permits(pmode, puid, pgid, ctx, X_OK):
        raise FsError(E.EACCES, f"no search permission on directory {parent}", ino=parent)


def check_may_write_dir(pmode: int, puid: int, pgid: int, ctx: Ctx, parent: int) -> None:
    """EACCES unless ``ctx`` may add or remove entries of directory ``parent``
    (write and search permission)."""
    if not permits(pmode, puid, pgid, ctx, W_OK | X_OK):
        raise FsError(E.EACCES, f"no write permission on directory {parent}", ino=parent)


def privileges_dropped(mode: int, gid: int, ctx: Ctx) -> int:
    """The S_ISUID/S_ISGID bits of a regular file of ``mode`` and group ``gid``
    that Linux clears when ``ctx`` writes or truncates it
    (setattr_should_drop_suidgid): none for root; S_ISUID; S_ISGID when the
    file is group-executable or ``ctx`` is not in its group."""
    if ctx.uid == 0 or not stat.S_ISREG(mode):
        return 0
    drop = mode & stat.S_ISUID
    if mode & stat.S_ISGID and (mode & stat.S_IXGRP or not ctx.in_group(gid)):
        drop |= stat.S_ISGID
    return drop


def check_setattr_rights(
    a: InodeAttr,
    ctx: Ctx,
    *,
    owner: tuple[int, int] | None,
    mode: int | None,
    times: tuple[int | None, int | None],
    size: int | None,
    open_for_write: bool,
) -> None:
    """Linux's rules for who may make a ``setattr`` change (setattr_prepare,
    utimensat, truncate/ftruncate); raises EPERM or EACCES, changes nothing.

    ``owner``: the (uid, gid) a chown asks for; ``times``: atime/mtime in ns,
    ``UTIME_NOW`` or None (leave); ``open_for_write``: the size changes through
    a descriptor opened for writing, which grants it (ftruncate).
    """
    is_owner = ctx.uid == 0 or ctx.uid == a.uid
    if owner is not None and ctx.uid != 0:
        if ctx.uid != a.uid or owner[0] != a.uid:
            raise FsError(E.EPERM, f"only root may change the owner of inode {a.ino}", ino=a.ino)
        if owner[1] != a.gid and not ctx.in_group(owner[1]):
            raise FsError(E.EPERM, f"caller is not in group {owner[1]}", ino=a.ino)
    if mode is not None and not is_owner:
        raise FsError(E.EPERM, f"only the owner may chmod inode {a.ino}", ino=a.ino)
    if times != (None, None) and not is_owner:
        # Only "both now" (utimensat with NULL or two UTIME_NOW) is open to writers.
        if times != (UTIME_NOW, UTIME_NOW):
            raise FsError(E.EPERM, f"only the owner may set times of inode {a.ino}", ino=a.ino)
        if not permits(a.mode, a.uid, a.gid, ctx, W_OK):
            raise FsError(E.EACCES, f"no write permission on inode {a.ino}", ino=a.ino)
    if size is not None and not open_for_write and not permits(a.mode, a.uid, a.gid, ctx, W_OK):
        raise FsError(E.EACCES, f"no write permission on inode {a.ino}", ino=a.ino)
