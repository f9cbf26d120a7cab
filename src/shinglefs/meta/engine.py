"""``SqlMetaStore``: the one metadata engine, over any ``backend.Backend``.

Every public method builds a closure over its arguments and hands it to the
backend as one transaction (retried whole on serialization failures). Ids
(inodes, slices, sessions) are allocated *before* the transaction starts, from
a per-process batch refilled by one autocommit UPDATE, so an operation's
transaction never includes an allocation and a retry never reuses a failed id.
"""

from __future__ import annotations

import errno as E
import functools
import itertools
import json
import os
import random
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from shinglefs.meta import schema as S
from shinglefs.meta.api import (
    BLOCK_SIZE,
    CHUNK_SIZE,
    FIRST_COOKIE,
    LINK_MAX,
    NAME_MAX,
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    ROOT_CTX,
    ROOT_INO,
    SYMLINK_MAX,
    UTIME_NOW,
    UTIME_OMIT,
    W_OK,
    X_OK,
    XATTR_CREATE,
    XATTR_NAME_MAX,
    XATTR_REPLACE,
    XATTR_SIZE_MAX,
    ChunkInfo,
    ChunkMap,
    Ctx,
    DirEntry,
    DirPolicy,
    DriveRecord,
    FormatInfo,
    InodeAttr,
    MetaStore,
    ReadPiece,
    RenameResult,
    Replica,
    Session,
    SessionInfo,
    SliceCommit,
    SliceInfo,
    SliceRef,
    SliceState,
    StatFs,
    UnlinkResult,
)
from shinglefs.meta.backend import Backend, Mode, Tx, backend_from_url
from shinglefs.meta.errors import (
    AlreadyFormatted,
    ChunkChanged,
    FsError,
    MetaUnavailable,
    NotFormatted,
    SchemaVersionError,
    SliceStateError,
)
from shinglefs.meta.overlay import resolve

T = TypeVar("T")
R_OK = os.R_OK
XATTR_NAMESPACES = (b"user.", b"trusted.", b"security.", b"system.")
ID_BATCH = {"inode": 1024, "slice": 1024, "session": 1}
INODES_TOTAL = 1 << 32


def _now() -> int:
    return time.time_ns()


def permits(mode: int, uid: int, gid: int, ctx: Ctx, mask: int) -> bool:
    """Linux's generic_permission on mode bits (no ACLs)."""
    mask &= 7
    if ctx.uid == 0:
        # root: anything but executing a file nobody may execute
        return not (mask & X_OK and not stat.S_ISDIR(mode) and not mode & 0o111)
    if ctx.uid == uid:
        bits = (mode >> 6) & 7
    elif ctx.in_group(gid):
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & mask == mask


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


def _check_resizable(a: InodeAttr) -> None:
    """EISDIR for a directory, EINVAL for anything else that is not a regular file."""
    if a.is_dir:
        raise FsError(E.EISDIR, f"inode {a.ino} is a directory", ino=a.ino)
    if not a.is_file:
        raise FsError(E.EINVAL, f"inode {a.ino} is not a regular file", ino=a.ino)


def _check_name(name: bytes) -> None:
    """EINVAL for names no path component can be; ENAMETOOLONG above NAME_MAX."""
    if not isinstance(name, bytes | bytearray):
        raise FsError(E.EINVAL, f"a name must be bytes, not {type(name).__name__}")
    if not name or b"/" in name or b"\0" in name:
        raise FsError(E.EINVAL, f"invalid name {bytes(name)!r}", name=bytes(name))
    if len(name) > NAME_MAX:
        raise FsError(E.ENAMETOOLONG, f"name of {len(name)} bytes (max {NAME_MAX})")


def _check_new_name(name: bytes) -> None:
    _check_name(name)
    if name in (b".", b".."):
        raise FsError(E.EEXIST, f"{name!r} always exists", name=name)


def _check_xattr_name(name: bytes) -> None:
    if not isinstance(name, bytes | bytearray):
        raise FsError(E.EINVAL, "an xattr name must be bytes")
    if not name or len(name) > XATTR_NAME_MAX:
        raise FsError(E.ERANGE, f"xattr name of {len(name)} bytes (1..{XATTR_NAME_MAX})")
    if not name.startswith(XATTR_NAMESPACES) or name in XATTR_NAMESPACES:
        raise FsError(
            E.EOPNOTSUPP, f"xattr {bytes(name)!r} is outside user./trusted./security./system."
        )


def _attr(row: Sequence[Any], offset: int = 0) -> InodeAttr:
    return InodeAttr(*row[offset : offset + 12])


def _run_ddl(tx: Tx, ddl: str) -> int:
    return tx.run(ddl)


def _enoent(ino: int) -> FsError:
    return FsError(E.ENOENT, f"no inode {ino}", ino=ino)


class SqlMetaStore(MetaStore):
    """The metadata engine on SQLite or PostgreSQL (see ``backend``)."""

    def __init__(self, backend: Backend) -> None:
        self._b = backend
        self.durability = backend.durability
        self.url_where = backend.where
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._ids: dict[str, tuple[int, int]] = {}
        self._shard = random.randrange(S.COUNTER_SHARDS)
        self._chunk_size = CHUNK_SIZE
        self._formatted = False
        try:
            info = self.format_info()
        except NotFormatted:
            return
        if info.schema_version in (1, 2):
            try:
                self._migrate_v1() if info.schema_version == 1 else self._migrate_v2()
            except BaseException:
                backend.close()
                raise
            info = self.format_info()
        if info.schema_version != S.SCHEMA_VERSION:
            backend.close()
            raise SchemaVersionError(
                f"{backend.where} holds schema version {info.schema_version}; this shinglefs "
                f"speaks version {S.SCHEMA_VERSION}",
                hint="run a shinglefs release of the matching schema, or format a fresh database",
            )
        self._chunk_size = info.chunk_size
        self._formatted = True

    # ---- plumbing ------------------------------------------------------------------

    def _run(self, fn: Callable[[Tx], T], mode: Mode = "write") -> T:
        return self._b.run(fn, mode)

    def _alloc(self, name: str) -> int:
        with self._lock:
            if self._pid != os.getpid():
                self._ids.clear()
                self._pid = os.getpid()
                self._shard = random.randrange(S.COUNTER_SHARDS)
            nxt, end = self._ids.get(name, (0, 0))
            if nxt >= end:
                batch = ID_BATCH[name]
                row = self._run(lambda tx: tx.one(S.ALLOC_IDS, (batch, name)), "autocommit")
                if row is None:
                    raise NotFormatted(f"{self.url_where} has no id counters; format it first")
                end = row[0]
                nxt = end - batch
            self._ids[name] = (nxt + 1, end)
            return nxt

    def _lock_rows(self, tx: Tx, *inos: int | None) -> None:
        """Row-lock the inodes an operation will modify, in ascending order (see
        ``schema.lock_inodes``); a no-op on SQLite."""
        if not self._b.dialect.row_locks:
            return
        wanted = sorted({i for i in inos if i is not None})
        tx.all(S.lock_inodes(len(wanted)), wanted)

    def _counters(self, tx: Tx, used_delta: int, inode_delta: int) -> None:
        tx.run(S.ADD_COUNTERS, (used_delta, inode_delta, self._shard))

    def _deref(self, tx: Tx, counts: Counter[int], now: int) -> None:
        """Drop references; a slice reaching zero is queued for deletion."""
        for sid, n in sorted(counts.items()):
            row = tx.one(S.DEREF_SLICE, (n, sid))
            if row is not None and row[0] <= 0:
                tx.run(S.DOOM_SLICE, (sid,))
                tx.run(S.QUEUE_DELETION, (sid, now))

    def _free_inode(self, tx: Tx, ino: int, size: int, now: int) -> None:
        """Delete an inode that has no links and is open nowhere, with its content."""
        refs = tx.all(S.SEL_REF_SLICES_OF, (ino,))
        if refs:
            tx.run(S.DEL_REFS_OF, (ino,))
            tx.run(S.DEL_CHUNKS_OF, (ino,))
            self._deref(tx, Counter(r[0] for r in refs), now)
        tx.run(S.DEL_XATTRS_OF, (ino,))
        tx.run(S.DEL_INODE, (ino,))
        self._counters(tx, -size, -1)

    def _free_if_orphan(self, tx: Tx, ino: int, now: int) -> bool:
        row = tx.one(S.SEL_INODE, (ino,))
        if row is None or row[4] > 0:
            return False
        if tx.one(S.IS_OPEN, (ino,)) is not None:
            return False
        self._free_inode(tx, ino, row[5], now)
        return True

    def _dir_for_entry(self, tx: Tx, row: Any, parent: int, ctx: Ctx) -> None:
        """Checks on the parent part of a LOOKUP/LOOKUP_ATTR row: exists, is a
        directory, searchable."""
        if row is None:
            raise FsError(E.ENOENT, f"no directory {parent}", ino=parent)
        pmode, puid, pgid = row[0], row[1], row[2]
        if not stat.S_ISDIR(pmode):
            raise FsError(E.ENOTDIR, f"inode {parent} is not a directory", ino=parent)
        if not permits(pmode, puid, pgid, ctx, X_OK):
            raise FsError(E.EACCES, f"no search permission on directory {parent}", ino=parent)

    @staticmethod
    def _sticky_ok(pmode: int, puid: int, victim_uid: int, ctx: Ctx) -> bool:
        return not (pmode & stat.S_ISVTX) or ctx.uid in (0, puid, victim_uid)

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
    ) -> InodeAttr:
        """Insert entry + inode under ``parent`` (checks, cookie, parent touch, counters)."""
        is_dir = stat.S_ISDIR(mode)
        row = tx.one(S.TOUCH_PARENT_FOR_INSERT, (now, now, 1 if is_dir else 0, parent))
        self._dir_for_entry(tx, row, parent, ctx)
        pmode, puid, pgid, pnlink, cookie, tier, retention = row
        if not tx.run(S.INS_DENTRY, (parent, name, ino, cookie)):
            raise FsError(E.EEXIST, f"{name!r} exists in directory {parent}", ino=parent, name=name)
        if not permits(pmode, puid, pgid, ctx, W_OK | X_OK):
            raise FsError(E.EACCES, f"no write permission on directory {parent}", ino=parent)
        if is_dir and pnlink > LINK_MAX:
            raise FsError(E.EMLINK, f"directory {parent} has {LINK_MAX} subdirectories")
        gid = ctx.gid
        if pmode & stat.S_ISGID:
            gid = pgid
            if is_dir:
                mode |= stat.S_ISGID
        if not is_dir:
            tier = retention = None
        attr = InodeAttr(
            ino, mode, ctx.uid, gid, 2 if is_dir else 1, size, now, now, now, rdev, 1, 0
        )
        tx.run(
            S.INS_INODE,
            (
                ino, mode, ctx.uid, gid, attr.nlink, size, now, now, now, rdev, 1, 0,
                parent, FIRST_COOKIE, tier, retention, target,
            ),
        )  # fmt: skip
        self._counters(tx, size, 1)
        return attr

    def _require_formatted(self) -> None:
        if not self._formatted:
            # Another process may have formatted meanwhile.
            info = self.format_info()
            self._chunk_size = info.chunk_size
            self._formatted = True

    # ---- format and life cycle -----------------------------------------------------------

    def format(
        self,
        name: str,
        uuid: str,
        chunk_size: int = CHUNK_SIZE,
        block_size: int = BLOCK_SIZE,
        schema_version: int | None = None,
        secret: str = "",
        *,
        capacity_bytes: int = 0,
    ) -> FormatInfo:
        if schema_version is not None and schema_version != S.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"cannot format schema version {schema_version}; this shinglefs writes "
                f"version {S.SCHEMA_VERSION}",
                hint="omit schema_version or use the matching release",
            )
        if chunk_size <= 0 or chunk_size % block_size or block_size <= 0:
            raise FsError(
                E.EINVAL, f"chunk size {chunk_size} must be a multiple of block size {block_size}"
            )
        try:
            existing = self.format_info()
        except NotFormatted:
            existing = None
        if existing is not None:
            raise AlreadyFormatted(
                f"{self.url_where} already holds file system {existing.name!r} ({existing.uuid})",
                hint="format a new metadata URL; the file system already there is kept",
            )
        for ddl in S.DDL:
            self._run(functools.partial(_run_ddl, ddl=ddl), "autocommit")
        now = _now()
        info = FormatInfo(name, uuid, chunk_size, block_size, S.SCHEMA_VERSION, secret, now)

        def txn(tx: Tx) -> None:
            if tx.one(S.SEL_FORMAT) is not None:
                raise AlreadyFormatted(f"{self.url_where} was formatted concurrently")
            tx.run(
                S.INS_FORMAT,
                (name, uuid, chunk_size, block_size, S.SCHEMA_VERSION, secret, now, capacity_bytes),
            )
            for id_name, first in (("inode", ROOT_INO + 1), ("slice", 1), ("session", 1)):
                tx.run(S.INS_ID, (id_name, first))
            for shard in range(S.COUNTER_SHARDS):
                tx.run(S.INS_COUNTER, (shard,))
            mode = stat.S_IFDIR | 0o755
            tx.run(
                S.INS_INODE,
                (
                    ROOT_INO,
                    mode,
                    0,
                    0,
                    2,
                    0,
                    now,
                    now,
                    now,
                    0,
                    1,
                    0,
                    ROOT_INO,
                    FIRST_COOKIE,
                    None,
                    None,
                    None,
                ),
            )
            tx.run(S.ADD_COUNTERS, (0, 1, 0))

        try:
            self._run(txn)
        except FsError as exc:
            if exc.errno == E.EEXIST:
                raise AlreadyFormatted(f"{self.url_where} was formatted concurrently") from None
            raise
        self._chunk_size = chunk_size
        self._formatted = True
        return info

    def sync(self) -> None:
        self._b.sync()

    def _migrate_v1(self) -> None:
        """Version 1 -> 2: the drive list moves from the root xattr into ``drives``."""
        self._run(functools.partial(_run_ddl, ddl=S.DRIVES_DDL), "autocommit")

        def txn(tx: Tx) -> None:
            row = tx.one(S.SEL_FORMAT)
            if row is None or row[4] != 1:
                return  # migrated concurrently
            raw = tx.one(S.SEL_XATTR, (ROOT_INO, S.V1_DRIVES_XATTR))
            if raw is not None:
                specs = json.loads(bytes(raw[0]))
                if not isinstance(specs, list) or not all(isinstance(d, str) for d in specs):
                    raise SchemaVersionError(
                        f"{self.url_where}: the version-1 drive list is damaged: {bytes(raw[0])[:200]!r}",
                        hint="repair the root xattr trusted.shinglefs.drives, then open again",
                    )
                tx.run(S.DEL_DRIVES)
                for i, spec in enumerate(specs):
                    tx.run(S.INS_DRIVE, (i, spec, None))
                tx.run(S.DEL_XATTR, (ROOT_INO, S.V1_DRIVES_XATTR))
            tx.run(S.SET_SCHEMA_VERSION, (S.SCHEMA_VERSION,))

        self._run(txn)

    def _migrate_v2(self) -> None:
        """Version 2 -> 3: ``drives`` gains the ``uuid`` column (NULL: identity not yet known)."""

        def txn(tx: Tx) -> None:
            row = tx.one(S.SEL_FORMAT)
            if row is None or row[4] != 2:
                return  # migrated concurrently
            tx.run(S.ADD_DRIVES_UUID)
            tx.run(S.SET_SCHEMA_VERSION, (S.SCHEMA_VERSION,))

        self._run(txn)

    def set_drives(self, specs: Sequence[str], uuids: Sequence[str | None] | None = None) -> None:
        self._require_formatted()
        if not all(isinstance(d, str) and d for d in specs):
            raise FsError(E.EINVAL, f"drive specs must be non-empty strings: {list(specs)!r}")
        ids = list(uuids) if uuids is not None else [None] * len(specs)
        if len(ids) != len(specs):
            raise FsError(E.EINVAL, f"{len(specs)} drive specs but {len(ids)} uuids")

        def txn(tx: Tx) -> None:
            tx.run(S.DEL_DRIVES)
            for i, (spec, uuid) in enumerate(zip(specs, ids, strict=True)):
                tx.run(S.INS_DRIVE, (i, spec, uuid))

        self._run(txn)

    def drives(self) -> list[str]:
        return [r.spec for r in self.drive_records()]

    def drive_records(self) -> list[DriveRecord]:
        return [DriveRecord(r[0], r[1]) for r in self._run(lambda tx: tx.all(S.SEL_DRIVES), "read")]

    def format_info(self) -> FormatInfo:
        row = self._run(lambda tx: tx.one(S.SEL_FORMAT), "single")
        if row is None:
            raise NotFormatted(
                f"{self.url_where} holds no ShingleFS file system",
                hint="format it first: `shinglefs format URL --drive KIND:PATH:SIZE`",
            )
        return FormatInfo(*row[:7])

    def close(self) -> None:
        self._b.close()

    # ---- namespace -------------------------------------------------------------------------

    def lookup(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        _check_name(name)
        if name in (b".", b".."):

            def dots(tx: Tx) -> InodeAttr:
                row = tx.one(S.SEL_INODE_EXTRA, (parent,))
                self._dir_for_entry(tx, row and row[1:4], parent, ctx)
                if name == b".":
                    return _attr(row)
                up = tx.one(S.SEL_INODE, (row[12],))
                if up is None:
                    raise _enoent(row[12])
                return _attr(up)

            return self._run(dots, "read")

        def txn(tx: Tx) -> InodeAttr:
            row = tx.one(S.LOOKUP_ATTR, (name, parent))
            self._dir_for_entry(tx, row, parent, ctx)
            if row[4] is None:
                raise FsError(
                    E.ENOENT, f"no entry {name!r} in directory {parent}", ino=parent, name=name
                )
            return _attr(row, 4)

        return self._run(txn, "single")

    def getattr(self, ino: int) -> InodeAttr:
        row = self._run(lambda tx: tx.one(S.SEL_INODE, (ino,)), "single")
        if row is None:
            raise _enoent(ino)
        return _attr(row)

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
        if atime_ns == UTIME_OMIT:
            atime_ns = None
        if mtime_ns == UTIME_OMIT:
            mtime_ns = None
        if size is not None and size < 0:
            raise FsError(E.EINVAL, f"negative size {size}", ino=ino)
        chown = uid is not None or gid is not None

        def txn(tx: Tx) -> InodeAttr:
            now = _now()
            row = tx.one(S.SEL_INODE, (ino,))
            if row is None:
                raise _enoent(ino)
            a = _attr(row)
            new_mode, new_uid, new_gid = a.mode, a.uid, a.gid
            new_size, new_atime, new_mtime = a.size, a.atime_ns, a.mtime_ns
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
                if ctx.uid != 0 and not a.is_dir and not ctx.in_group(new_gid):
                    perm &= ~stat.S_ISGID
                new_mode = stat.S_IFMT(a.mode) | perm
            if atime_ns is not None:
                new_atime = now if atime_ns == UTIME_NOW else atime_ns
            if mtime_ns is not None:
                new_mtime = now if mtime_ns == UTIME_NOW else mtime_ns
            if size is not None:
                _check_resizable(a)
                if size != a.size:
                    self._truncate_in(tx, a, size, now)
                    if mtime_ns is None:
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

    def mknod(
        self, parent: int, name: bytes, mode: int, rdev: int = 0, ctx: Ctx = ROOT_CTX
    ) -> InodeAttr:
        _check_new_name(name)
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
            lambda tx: self._new_inode(tx, parent, name, ino, full, ctx, _now(), rdev=rdev)
        )

    def mkdir(self, parent: int, name: bytes, mode: int, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        _check_new_name(name)
        full = stat.S_IFDIR | (mode & ~ctx.umask & 0o7777)
        ino = self._alloc("inode")
        return self._run(lambda tx: self._new_inode(tx, parent, name, ino, full, ctx, _now()))

    def create(
        self,
        parent: int,
        name: bytes,
        mode: int,
        ctx: Ctx = ROOT_CTX,
        *,
        exclusive: bool = True,
        session: int | None = None,
    ) -> InodeAttr:
        _check_new_name(name)
        full = stat.S_IFREG | (mode & ~ctx.umask & 0o7777)
        ino = self._alloc("inode")

        def txn(tx: Tx) -> InodeAttr:
            if not exclusive:
                row = tx.one(S.LOOKUP_ATTR, (name, parent))
                self._dir_for_entry(tx, row, parent, ctx)
                if row[4] is not None:
                    attr = _attr(row, 4)
                    if attr.is_dir:
                        raise FsError(E.EISDIR, f"{name!r} is a directory", ino=attr.ino, name=name)
                    self._open_in(tx, session, attr.ino)
                    return attr
            attr = self._new_inode(tx, parent, name, ino, full, ctx, _now())
            self._open_in(tx, session, ino)
            return attr

        return self._run(txn)

    @staticmethod
    def _open_in(tx: Tx, session: int | None, ino: int) -> None:
        if session is None:
            return
        if tx.one(S.SEL_SESSION, (session,)) is None:
            raise FsError(E.ESTALE, f"unknown session {session}")
        tx.run(S.OPEN_FILE, (session, ino))

    def unlink(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> UnlinkResult:
        _check_name(name)
        if name in (b".", b".."):
            raise FsError(E.EISDIR, f"cannot unlink {name!r}", name=name)
        return self._run(lambda tx: self._remove(tx, parent, name, ctx, want_dir=False))

    def rmdir(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> UnlinkResult:
        _check_name(name)
        if name == b".":
            raise FsError(E.EINVAL, "cannot rmdir '.'", name=name)
        if name == b"..":
            raise FsError(E.ENOTEMPTY, "cannot rmdir '..'", name=name)
        return self._run(lambda tx: self._remove(tx, parent, name, ctx, want_dir=True))

    def _remove(
        self, tx: Tx, parent: int, name: bytes, ctx: Ctx, *, want_dir: bool
    ) -> UnlinkResult:
        now = _now()
        row = tx.one(S.LOOKUP_ATTR, (name, parent))
        self._dir_for_entry(tx, row, parent, ctx)
        if row[4] is None:
            raise FsError(
                E.ENOENT, f"no entry {name!r} in directory {parent}", ino=parent, name=name
            )
        pmode, puid, pgid = row[0], row[1], row[2]
        victim = _attr(row, 4)
        self._lock_rows(tx, parent, victim.ino)
        if not permits(pmode, puid, pgid, ctx, W_OK | X_OK):
            raise FsError(E.EACCES, f"no write permission on directory {parent}", ino=parent)
        if not self._sticky_ok(pmode, puid, victim.uid, ctx):
            raise FsError(
                E.EPERM, f"sticky directory {parent}: {name!r} is not yours", ino=parent, name=name
            )
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

    def rename(
        self,
        old_parent: int,
        old_name: bytes,
        new_parent: int,
        new_name: bytes,
        flags: int = 0,
        ctx: Ctx = ROOT_CTX,
    ) -> RenameResult:
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == (
            RENAME_NOREPLACE | RENAME_EXCHANGE
        ):
            raise FsError(E.EINVAL, f"bad rename flags {flags:#x}")
        _check_name(old_name)
        _check_name(new_name)
        if old_name in (b".", b".."):
            raise FsError(E.EBUSY, f"cannot rename {old_name!r}", name=old_name)
        if new_name in (b".", b".."):
            raise FsError(
                E.EEXIST if flags & RENAME_NOREPLACE else E.EBUSY,
                f"cannot rename onto {new_name!r}",
                name=new_name,
            )
        exchange = bool(flags & RENAME_EXCHANGE)
        noreplace = bool(flags & RENAME_NOREPLACE)

        def txn(tx: Tx) -> RenameResult:
            now = _now()
            srow = tx.one(S.LOOKUP_ATTR, (old_name, old_parent))
            self._dir_for_entry(tx, srow, old_parent, ctx)
            drow = tx.one(S.LOOKUP_ATTR, (new_name, new_parent))
            self._dir_for_entry(tx, drow, new_parent, ctx)
            if srow[4] is None:
                raise FsError(
                    E.ENOENT,
                    f"no entry {old_name!r} in directory {old_parent}",
                    ino=old_parent,
                    name=old_name,
                )
            src = _attr(srow, 4)
            dst = _attr(drow, 4) if drow[4] is not None else None
            if exchange and dst is None:
                raise FsError(
                    E.ENOENT,
                    f"no entry {new_name!r} to exchange with",
                    ino=new_parent,
                    name=new_name,
                )
            if dst is not None and noreplace:
                raise FsError(
                    E.EEXIST,
                    f"{new_name!r} exists in directory {new_parent}",
                    ino=new_parent,
                    name=new_name,
                )
            cross = old_parent != new_parent
            # Linux's order: ancestry traps first (do_renameat2), then same
            # inode, then may_delete/may_create of each side, then emptiness.
            if cross and src.is_dir and self._is_ancestor(tx, src.ino, new_parent):
                raise FsError(
                    E.EINVAL, f"cannot move directory {src.ino} into its own subtree", ino=src.ino
                )
            if (
                cross
                and dst is not None
                and dst.is_dir
                and self._is_ancestor(tx, dst.ino, old_parent)
            ):
                raise FsError(
                    E.EINVAL if exchange else E.ENOTEMPTY,
                    f"directory {dst.ino} is an ancestor of the source",
                    ino=dst.ino,
                )
            if dst is not None and dst.ino == src.ino:
                return RenameResult(src.ino, None, False)
            self._lock_rows(tx, old_parent, new_parent, src.ino, dst.ino if dst else None)
            if not permits(srow[0], srow[1], srow[2], ctx, W_OK | X_OK):
                raise FsError(
                    E.EACCES, f"no write permission on directory {old_parent}", ino=old_parent
                )
            if not self._sticky_ok(srow[0], srow[1], src.uid, ctx):
                raise FsError(E.EPERM, f"sticky directory {old_parent}: {old_name!r} is not yours")
            if not permits(drow[0], drow[1], drow[2], ctx, W_OK | X_OK):
                raise FsError(
                    E.EACCES, f"no write permission on directory {new_parent}", ino=new_parent
                )
            if dst is not None:
                if not self._sticky_ok(drow[0], drow[1], dst.uid, ctx):
                    raise FsError(
                        E.EPERM, f"sticky directory {new_parent}: {new_name!r} is not yours"
                    )
                if not exchange and src.is_dir and not dst.is_dir:
                    raise FsError(E.ENOTDIR, f"{new_name!r} is not a directory", ino=dst.ino)
                if not exchange and not src.is_dir and dst.is_dir:
                    raise FsError(E.EISDIR, f"{new_name!r} is a directory", ino=dst.ino)
            if cross and src.is_dir and not permits(src.mode, src.uid, src.gid, ctx, W_OK):
                raise FsError(E.EACCES, f"moving directory {src.ino} needs write permission on it")
            if (
                exchange
                and cross
                and dst is not None
                and dst.is_dir
                and not permits(dst.mode, dst.uid, dst.gid, ctx, W_OK)
            ):
                raise FsError(E.EACCES, f"moving directory {dst.ino} needs write permission on it")
            if (
                not exchange
                and dst is not None
                and dst.is_dir
                and tx.one(S.ANY_CHILD, (dst.ino,)) is not None
            ):
                raise FsError(E.ENOTEMPTY, f"directory {new_name!r} is not empty", ino=dst.ino)

            if exchange:
                assert dst is not None
                tx.run(S.SET_DENTRY_INO, (dst.ino, old_parent, old_name))
                tx.run(S.SET_DENTRY_INO, (src.ino, new_parent, new_name))
                old_delta = new_delta = 0
                if cross:
                    shift = int(src.is_dir) - int(dst.is_dir)
                    old_delta, new_delta = -shift, shift
                    if src.is_dir:
                        tx.run(S.SET_PARENT, (new_parent, now, src.ino))
                    if dst.is_dir:
                        tx.run(S.SET_PARENT, (old_parent, now, dst.ino))
                tx.run(S.SET_CTIME, (now, src.ino))
                tx.run(S.SET_CTIME, (now, dst.ino))
                tx.run(S.TOUCH_DIR, (now, now, old_delta, old_parent))
                if cross:
                    tx.run(S.TOUCH_DIR, (now, now, new_delta, new_parent))
                return RenameResult(src.ino, replace(dst, ctime_ns=now), False)

            released = False
            replaced: InodeAttr | None = None
            old_delta = new_delta = 0
            if dst is not None:
                tx.run(S.DEL_DENTRY, (new_parent, new_name))
                if dst.is_dir:
                    self._free_inode(tx, dst.ino, dst.size, now)
                    new_delta -= 1
                    released = True
                    replaced = replace(dst, nlink=0, ctime_ns=now)
                else:
                    nlink = tx.one(S.SET_NLINK_CTIME, (-1, now, dst.ino))[0]
                    released = nlink <= 0 and self._free_if_orphan(tx, dst.ino, now)
                    replaced = replace(dst, nlink=nlink, ctime_ns=now)
            cookie = tx.one(S.TAKE_COOKIE, (new_parent,))[0]
            tx.run(S.MOVE_DENTRY, (new_parent, new_name, cookie, old_parent, old_name))
            if src.is_dir and cross:
                old_delta -= 1
                new_delta += 1
                tx.run(S.SET_PARENT, (new_parent, now, src.ino))
            else:
                tx.run(S.SET_CTIME, (now, src.ino))
            if cross:
                tx.run(S.TOUCH_DIR, (now, now, old_delta, old_parent))
                tx.run(S.TOUCH_DIR, (now, now, new_delta, new_parent))
            else:
                tx.run(S.TOUCH_DIR, (now, now, old_delta + new_delta, old_parent))
            return RenameResult(src.ino, replaced, released)

        return self._run(txn)

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
                raise _enoent(cur)
            cur = row[12]
        raise FsError(E.ELOOP, "directory parent chain does not reach the root")

    def link(self, ino: int, new_parent: int, new_name: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        _check_new_name(new_name)

        def txn(tx: Tx) -> InodeAttr:
            now = _now()
            row = tx.one(S.SEL_INODE, (ino,))
            if row is None or row[4] == 0:
                raise FsError(E.ENOENT, f"inode {ino} has no links left", ino=ino)
            a = _attr(row)
            self._lock_rows(tx, ino, new_parent)
            prow = tx.one(S.TOUCH_PARENT_FOR_INSERT, (now, now, 0, new_parent))
            self._dir_for_entry(tx, prow, new_parent, ctx)
            if not tx.run(S.INS_DENTRY, (new_parent, new_name, ino, prow[4])):
                raise FsError(
                    E.EEXIST,
                    f"{new_name!r} exists in directory {new_parent}",
                    ino=new_parent,
                    name=new_name,
                )
            if not permits(prow[0], prow[1], prow[2], ctx, W_OK | X_OK):
                raise FsError(
                    E.EACCES, f"no write permission on directory {new_parent}", ino=new_parent
                )
            if a.is_dir:
                raise FsError(E.EPERM, f"cannot hard-link directory {ino}", ino=ino)
            if a.nlink >= LINK_MAX:
                raise FsError(E.EMLINK, f"inode {ino} already has {a.nlink} links", ino=ino)
            nlink = tx.one(S.SET_NLINK_CTIME, (1, now, ino))[0]
            return replace(a, nlink=nlink, ctime_ns=now)

        return self._run(txn)

    def symlink(self, parent: int, name: bytes, target: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        _check_new_name(name)
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
                tx, parent, name, ino, mode, ctx, _now(), size=len(target), target=bytes(target)
            )
        )

    def readlink(self, ino: int) -> bytes:
        row = self._run(lambda tx: tx.one(S.SEL_INODE_EXTRA, (ino,)), "single")
        if row is None:
            raise _enoent(ino)
        if not stat.S_ISLNK(row[1]):
            raise FsError(E.EINVAL, f"inode {ino} is not a symlink", ino=ino)
        return bytes(row[13])

    def readdir(
        self, ino: int, cookie: int = 0, limit: int = 1024, ctx: Ctx = ROOT_CTX
    ) -> list[DirEntry]:
        def txn(tx: Tx) -> list[DirEntry]:
            row = tx.one(S.SEL_INODE, (ino,))
            if row is None:
                raise _enoent(ino)
            if not stat.S_ISDIR(row[1]):
                raise FsError(E.ENOTDIR, f"inode {ino} is not a directory", ino=ino)
            if not permits(row[1], row[2], row[3], ctx, R_OK):
                raise FsError(E.EACCES, f"no read permission on directory {ino}", ino=ino)
            rows = tx.all(S.READDIR, (ino, cookie, limit))
            return [DirEntry(bytes(r[0]), r[2], _attr(r, 2), r[1]) for r in rows]

        return self._run(txn, "read")

    def access(self, ctx: Ctx, ino: int, mask: int) -> None:
        row = self._run(lambda tx: tx.one(S.SEL_INODE, (ino,)), "single")
        if row is None:
            raise _enoent(ino)
        if mask and not permits(row[1], row[2], row[3], ctx, mask):
            raise FsError(E.EACCES, f"access {mask:o} denied on inode {ino}", ino=ino)

    # ---- extended attributes -------------------------------------------------------------

    def _xattr_target(self, tx: Tx, ino: int, ctx: Ctx, mask: int) -> InodeAttr:
        row = tx.one(S.SEL_INODE, (ino,))
        if row is None:
            raise _enoent(ino)
        a = _attr(row)
        if mask and not permits(a.mode, a.uid, a.gid, ctx, mask):
            raise FsError(E.EACCES, f"xattr access denied on inode {ino}", ino=ino)
        return a

    def getxattr(self, ino: int, name: bytes, ctx: Ctx = ROOT_CTX) -> bytes:
        _check_xattr_name(name)

        def txn(tx: Tx) -> bytes:
            self._xattr_target(tx, ino, ctx, R_OK)
            row = tx.one(S.SEL_XATTR, (ino, name))
            if row is None:
                raise FsError(E.ENODATA, f"no xattr {name!r} on inode {ino}", ino=ino, name=name)
            return bytes(row[0])

        return self._run(txn, "read")

    def setxattr(
        self, ino: int, name: bytes, value: bytes, flags: int = 0, ctx: Ctx = ROOT_CTX
    ) -> None:
        _check_xattr_name(name)
        if flags & ~(XATTR_CREATE | XATTR_REPLACE):
            raise FsError(E.EINVAL, f"bad setxattr flags {flags:#x}")
        if len(value) > XATTR_SIZE_MAX:
            raise FsError(E.E2BIG, f"xattr value of {len(value)} bytes (max {XATTR_SIZE_MAX})")
        value = bytes(value)

        def txn(tx: Tx) -> None:
            self._xattr_target(tx, ino, ctx, W_OK)
            if flags & XATTR_REPLACE:
                if not tx.run(S.UPD_XATTR, (value, ino, name)):
                    raise FsError(E.ENODATA, f"no xattr {name!r} to replace", ino=ino, name=name)
            elif not tx.run(S.INS_XATTR, (ino, name, value)):
                if flags & XATTR_CREATE:
                    raise FsError(E.EEXIST, f"xattr {name!r} exists", ino=ino, name=name)
                tx.run(S.UPD_XATTR, (value, ino, name))
            tx.run(S.SET_CTIME, (_now(), ino))

        self._run(txn)

    def listxattr(self, ino: int, ctx: Ctx = ROOT_CTX) -> list[bytes]:
        def txn(tx: Tx) -> list[bytes]:
            self._xattr_target(tx, ino, ctx, 0)
            return [bytes(r[0]) for r in tx.all(S.LIST_XATTR, (ino,))]

        return self._run(txn, "read")

    def removexattr(self, ino: int, name: bytes, ctx: Ctx = ROOT_CTX) -> None:
        _check_xattr_name(name)

        def txn(tx: Tx) -> None:
            self._xattr_target(tx, ino, ctx, W_OK)
            if not tx.run(S.DEL_XATTR, (ino, name)):
                raise FsError(E.ENODATA, f"no xattr {name!r} on inode {ino}", ino=ino, name=name)
            tx.run(S.SET_CTIME, (_now(), ino))

        self._run(txn)

    # ---- directory policy ----------------------------------------------------------------

    def set_policy(self, ino: int, policy: DirPolicy, ctx: Ctx = ROOT_CTX) -> None:
        def txn(tx: Tx) -> None:
            row = tx.one(S.SEL_INODE, (ino,))
            if row is None:
                raise _enoent(ino)
            if not stat.S_ISDIR(row[1]):
                raise FsError(E.ENOTDIR, f"inode {ino} is not a directory", ino=ino)
            if ctx.uid not in (0, row[2]):
                raise FsError(E.EPERM, f"only the owner may set the policy of {ino}", ino=ino)
            tx.run(S.SET_POLICY, (policy.tier, policy.retention, _now(), ino))

        self._run(txn)

    def get_policy(self, ino: int) -> DirPolicy:
        row = self._run(lambda tx: tx.one(S.SEL_INODE_EXTRA, (ino,)), "single")
        if row is None:
            raise _enoent(ino)
        if not stat.S_ISDIR(row[1]):
            raise FsError(E.ENOTDIR, f"inode {ino} is not a directory", ino=ino)
        return DirPolicy(row[14], row[15])

    # ---- statfs ----------------------------------------------------------------------------

    def statfs(self, capacity_bytes: int | None = None) -> StatFs:
        def txn(tx: Tx) -> tuple[Any, Any]:
            return tx.one(S.SUM_COUNTERS), tx.one(S.SEL_FORMAT)

        counters, fmt = self._run(txn, "read")
        if fmt is None:
            raise NotFormatted(f"{self.url_where} holds no ShingleFS file system")
        used, inodes = int(counters[0]), int(counters[1])
        capacity = fmt[7] if capacity_bytes is None else capacity_bytes
        return StatFs(
            block_size=fmt[3],
            capacity_bytes=capacity,
            used_bytes=used,
            free_bytes=max(0, capacity - used),
            inodes=inodes,
            inodes_free=max(0, INODES_TOTAL - inodes),
        )

    def set_capacity(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise FsError(E.EINVAL, f"negative capacity {capacity_bytes}")
        self._run(lambda tx: tx.run(S.SET_CAPACITY, (capacity_bytes,)), "autocommit")

    # ---- sessions ----------------------------------------------------------------------------

    def register_session(self, info: SessionInfo) -> int:
        sid = self._alloc("session")
        now = _now()
        self._run(
            lambda tx: tx.run(
                S.INS_SESSION, (sid, info.host, info.pid, info.mountpoint, info.version, now, now)
            ),
            "autocommit",
        )
        return sid

    def heartbeat(self, session: int) -> None:
        if not self._run(lambda tx: tx.run(S.HEARTBEAT, (_now(), session)), "autocommit"):
            raise FsError(E.ESTALE, f"session {session} has expired", hint="register again")

    def _end_session(self, tx: Tx, session: int, now: int) -> list[int]:
        inos = [r[0] for r in tx.all(S.SEL_OPEN_OF_SESSION, (session,))]
        tx.run(S.DEL_OPEN_OF_SESSION, (session,))
        tx.run(S.DEL_SESSION, (session,))
        return [ino for ino in inos if self._free_if_orphan(tx, ino, now)]

    def unregister_session(self, session: int) -> list[int]:
        return self._run(lambda tx: self._end_session(tx, session, _now()))

    def list_sessions(self) -> list[Session]:
        def txn(tx: Tx) -> list[Session]:
            out = []
            for r in tx.all(S.SEL_SESSIONS):
                inos = tuple(x[0] for x in tx.all(S.SEL_OPEN_OF_SESSION, (r[0],)))
                out.append(Session(r[0], SessionInfo(r[1], r[2], r[3], r[4]), r[5], r[6], inos))
            return out

        return self._run(txn, "read")

    def open_file(self, session: int, ino: int) -> None:
        def txn(tx: Tx) -> None:
            if tx.one(S.SEL_SESSION, (session,)) is None:
                raise FsError(E.ESTALE, f"unknown session {session}")
            if tx.one(S.SEL_INODE, (ino,)) is None:
                raise _enoent(ino)
            tx.run(S.OPEN_FILE, (session, ino))

        self._run(txn)

    def close_file(self, session: int, ino: int) -> bool:
        def txn(tx: Tx) -> bool:
            row = tx.one(S.CLOSE_FILE, (session, ino))
            if row is None:
                return False
            if row[0] > 0:
                return False
            tx.run(S.DEL_OPEN, (session, ino))
            return self._free_if_orphan(tx, ino, _now())

        return self._run(txn)

    def close_files(self, session: int, inos: Sequence[int]) -> list[int]:
        def txn(tx: Tx) -> list[int]:
            now = _now()
            freed = []
            for ino in inos:
                row = tx.one(S.CLOSE_FILE, (session, ino))
                if row is None or row[0] > 0:
                    continue
                tx.run(S.DEL_OPEN, (session, ino))
                if self._free_if_orphan(tx, ino, now):
                    freed.append(ino)
            return freed

        return self._run(txn) if inos else []

    def expire_sessions(self, timeout_s: float) -> list[int]:
        def txn(tx: Tx) -> list[int]:
            now = _now()
            expired = [r[0] for r in tx.all(S.SEL_EXPIRED, (now - int(timeout_s * 1e9),))]
            for sid in expired:
                self._end_session(tx, sid, now)
            return expired

        return self._run(txn)

    # ---- ids and slices --------------------------------------------------------------------------

    def next_slice_id(self) -> int:
        return self._alloc("slice")

    def add_slice(self, info: SliceInfo) -> None:
        def txn(tx: Tx) -> None:
            state = SliceState(info.state).value
            row = (info.id, info.length, info.group, state, info.refcount, _now())
            if not tx.run(S.INS_SLICE, row):
                raise FsError(E.EEXIST, f"slice {info.id} is already registered")
            for rep in info.replicas:
                tx.run(S.INS_REPLICA, (info.id, rep.server, rep.drive))

        self._run(txn)

    def set_slice_replicas(self, slice_id: int, replicas: Sequence[Replica]) -> None:
        def txn(tx: Tx) -> None:
            if tx.one(S.SEL_SLICE_STATE, (slice_id,)) is None:
                raise FsError(E.ENOENT, f"no slice {slice_id}")
            tx.run(S.DEL_REPLICAS, (slice_id,))
            for rep in replicas:
                tx.run(S.INS_REPLICA, (slice_id, rep.server, rep.drive))

        self._run(txn)

    @staticmethod
    def _slice_info(tx: Tx, slice_id: int) -> SliceInfo | None:
        row = tx.one(S.SEL_SLICE, (slice_id,))
        if row is None:
            return None
        reps = tuple(Replica(r[0], r[1]) for r in tx.all(S.SEL_REPLICAS, (slice_id,)))
        return SliceInfo(row[0], row[1], row[2], SliceState(row[3]), row[4], reps)

    def get_slice(self, slice_id: int) -> SliceInfo:
        info = self._run(lambda tx: self._slice_info(tx, slice_id), "read")
        if info is None:
            raise FsError(E.ENOENT, f"no slice {slice_id}")
        return info

    def abandoned_slices(self, older_than_s: float, limit: int = 1000) -> list[SliceInfo]:
        def txn(tx: Tx) -> list[SliceInfo]:
            cutoff = _now() - int(older_than_s * 1e9)
            ids = [r[0] for r in tx.all(S.SEL_ABANDONED, (cutoff, limit))]
            return [i for i in (self._slice_info(tx, sid) for sid in ids) if i is not None]

        return self._run(txn, "read")

    def discard_slices(self, slice_ids: Sequence[int]) -> list[int]:
        def txn(tx: Tx) -> list[int]:
            now = _now()
            queued = []
            for sid in sorted(set(slice_ids)):
                if tx.run(S.DISCARD_SLICE, (sid,)):
                    tx.run(S.QUEUE_DELETION, (sid, now))
                    queued.append(sid)
            return queued

        return self._run(txn)

    def pop_deletions(self, limit: int = 1000, lease_s: float = 60.0) -> list[SliceInfo]:
        def txn(tx: Tx) -> list[SliceInfo]:
            now = _now()
            ids = [r[0] for r in tx.all(S.SEL_DUE_DELETIONS, (now, limit))]
            out = []
            for sid in ids:
                tx.run(S.LEASE_DELETION, (now + int(lease_s * 1e9), sid))
                info = self._slice_info(tx, sid)
                if info is not None:
                    out.append(info)
            return out

        return self._run(txn)

    def ack_deletions(self, slice_ids: Sequence[int]) -> None:
        def txn(tx: Tx) -> None:
            for sid in slice_ids:
                row = tx.one(S.SEL_SLICE_STATE, (sid,))
                if row is not None and row[0] != SliceState.TO_DELETE.value:
                    raise SliceStateError(sid, row[0], "acknowledge its deletion")
                tx.run(S.DEL_DELETION, (sid,))
                tx.run(S.DEL_REPLICAS, (sid,))
                tx.run(S.DEL_SLICE, (sid,))

        self._run(txn)

    # ---- content map ---------------------------------------------------------------------------

    def _check_piece(self, piece: SliceRef) -> None:
        if piece.length <= 0 or piece.chunk_offset < 0 or piece.slice_offset < 0:
            raise FsError(E.EINVAL, f"empty or negative piece {piece}")
        if piece.chunk_offset + piece.length > self._chunk_size:
            raise FsError(E.EINVAL, f"piece {piece} crosses the chunk end ({self._chunk_size})")

    @staticmethod
    def _file_attr(tx: Tx, ino: int) -> InodeAttr:
        row = tx.one(S.SEL_INODE, (ino,))
        if row is None:
            raise _enoent(ino)
        a = _attr(row)
        if a.is_dir:
            raise FsError(E.EISDIR, f"inode {ino} is a directory", ino=ino)
        if not a.is_file:
            raise FsError(E.EINVAL, f"inode {ino} is not a regular file", ino=ino)
        return a

    def _ref_slice(self, tx: Tx, piece: SliceRef, group: int, slice_length: int | None) -> None:
        length = slice_length if slice_length is not None else piece.slice_offset + piece.length
        row = tx.one(S.REF_SLICE, (piece.slice_id, length, group, 1, _now(), 1, length))
        if row is None:
            state = tx.one(S.SEL_SLICE_STATE, (piece.slice_id,))
            raise SliceStateError(piece.slice_id, state[0] if state else "gone", "reference it")

    def commit_slice(
        self,
        ino: int,
        chunk_index: int,
        piece: SliceRef,
        new_size: int,
        mtime_ns: int | None = None,
        *,
        group: int = 0,
        slice_length: int | None = None,
        replicas: Sequence[Replica] = (),
    ) -> InodeAttr:
        return self.commit_slices([SliceCommit(ino, chunk_index, piece, new_size, group,
                                               slice_length, tuple(replicas), mtime_ns)])[0]

    def commit_slices(self, commits: Sequence[SliceCommit]) -> list[InodeAttr]:
        self._require_formatted()
        for c in commits:
            self._check_commit(c)
        # Inode rows are locked in ascending order (no deadlock between batches);
        # a stable sort keeps one file's slices in their order.
        order = sorted(range(len(commits)), key=lambda i: commits[i].ino)

        def txn(tx: Tx) -> list[InodeAttr]:
            out: list[InodeAttr | None] = [None] * len(commits)
            for i in order:
                out[i] = self._commit_in(tx, commits[i])
            return [a for a in out if a is not None]

        return self._run(txn)

    def _check_commit(self, c: SliceCommit) -> None:
        self._check_piece(c.piece)
        if c.chunk_index < 0 or c.new_size < 0:
            raise FsError(E.EINVAL, f"negative chunk index {c.chunk_index} or size {c.new_size}")
        piece_end = c.chunk_index * self._chunk_size + c.piece.chunk_offset + c.piece.length
        if c.new_size < piece_end:
            raise FsError(E.EINVAL, f"new size {c.new_size} ends before the piece ({piece_end})")

    def _commit_in(self, tx: Tx, c: SliceCommit) -> InodeAttr:
        """One slice reference into the chunk map, inside ``tx``."""
        now = _now()
        mtime = now if c.mtime_ns is None else c.mtime_ns
        a = self._file_attr(tx, c.ino)
        tx.run(S.GROW_FILE, (c.new_size, mtime, now, c.ino))
        version = tx.one(S.BUMP_CHUNK, (c.ino, c.chunk_index))[0]
        p = c.piece
        tx.run(S.INS_REF, (c.ino, c.chunk_index, version, p.slice_id, p.chunk_offset, p.length,
                           p.slice_offset))
        self._ref_slice(tx, p, c.group, c.slice_length)
        for rep in c.replicas:
            tx.run(S.INS_REPLICA, (p.slice_id, rep.server, rep.drive))
        size = max(a.size, c.new_size)
        if size != a.size:
            self._counters(tx, size - a.size, 0)
        return replace(a, size=size, mtime_ns=mtime, ctime_ns=now)

    def truncate(self, ino: int, size: int, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        return self.setattr(ino, size=size, ctx=ctx)

    def _truncate_in(self, tx: Tx, a: InodeAttr, size: int, now: int) -> None:
        """Content side of a size change (the inode row is updated by the caller)."""
        cs = self._chunk_size
        if size < a.size:
            keep_chunks = -(-size // cs)  # chunks [0, keep_chunks) keep some bytes
            ino = a.ino
            refs = tx.all(S.SEL_REFS_FROM, (ino, size // cs))
            dropped: Counter[int] = Counter()
            partial: dict[int, int] = {}
            for ci, seq, sid, coff, ln, _soff in refs:
                start = ci * cs + coff
                if start >= size:
                    dropped[sid] += 1
                    if ci < keep_chunks:
                        tx.run(S.DEL_REF, (ino, ci, seq))
                        partial[ci] = partial.get(ci, 0) - 1
                elif start + ln > size:
                    tx.run(S.TRIM_REF, (size - start, ino, ci, seq))
                    partial.setdefault(ci, 0)
            if refs:
                tx.run(S.DEL_REFS_FROM, (ino, keep_chunks))
                # Emptied chunks keep their row (version bumped) so that a
                # compaction that read them before cannot succeed later (ABA).
                for ci in {r[0] for r in refs if r[0] >= keep_chunks}:
                    row = tx.one(S.SEL_CHUNK, (ino, ci))
                    if row is not None:
                        tx.run(S.SET_CHUNK, (row[0] + 1, 0, ino, ci))
                for ci, delta in partial.items():
                    row = tx.one(S.SEL_CHUNK, (ino, ci))
                    if row is not None:
                        tx.run(S.SET_CHUNK, (row[0] + 1, row[1] + delta, ino, ci))
                if dropped:
                    self._deref(tx, dropped, now)
        self._counters(tx, size - a.size, 0)

    def read_map(self, ino: int, offset: int, length: int) -> list[ReadPiece]:
        if offset < 0 or length < 0:
            raise FsError(E.EINVAL, f"negative offset {offset} or length {length}")
        self._require_formatted()
        cs = self._chunk_size

        def txn(tx: Tx) -> list[ReadPiece]:
            a = self._file_attr(tx, ino)
            end = min(offset + length, a.size)
            if end <= offset:
                return []
            rows = tx.all(S.SEL_REFS, (ino, offset // cs, (end - 1) // cs))
            by_chunk: dict[int, list[SliceRef]] = {}
            for ci, _seq, sid, coff, ln, soff in rows:
                by_chunk.setdefault(ci, []).append(SliceRef(sid, coff, ln, soff))
            return resolve(by_chunk, cs, offset, end)

        return self._run(txn, "read")

    def get_chunk(self, ino: int, chunk_index: int) -> ChunkMap:
        def txn(tx: Tx) -> ChunkMap:
            self._file_attr(tx, ino)
            row = tx.one(S.SEL_CHUNK, (ino, chunk_index))
            rows = tx.all(S.SEL_REFS, (ino, chunk_index, chunk_index))
            refs = tuple(SliceRef(r[2], r[3], r[4], r[5]) for r in rows)
            return ChunkMap(ino, chunk_index, row[0] if row else 0, refs)

        return self._run(txn, "read")

    def compaction_candidates(self, min_refs: int = 8, limit: int = 100) -> list[ChunkInfo]:
        rows = self._run(lambda tx: tx.all(S.CANDIDATES, (max(1, min_refs), limit)), "single")
        return [ChunkInfo(*r) for r in rows]

    def replace_chunk(
        self,
        ino: int,
        chunk_index: int,
        old_refs_version: int,
        new_piece: SliceRef | Sequence[SliceRef],
        *,
        group: int = 0,
        slice_length: int | None = None,
    ) -> ChunkMap:
        self._require_formatted()
        pieces = [new_piece] if isinstance(new_piece, SliceRef) else list(new_piece)
        for p in pieces:
            self._check_piece(p)
        spans = sorted((p.chunk_offset, p.chunk_offset + p.length) for p in pieces)
        for (_, e1), (s2, _) in itertools.pairwise(spans):
            if s2 < e1:
                raise FsError(E.EINVAL, "replacement pieces overlap")

        def txn(tx: Tx) -> ChunkMap:
            now = _now()
            self._file_attr(tx, ino)
            row = tx.one(S.SEL_CHUNK, (ino, chunk_index))
            version = row[0] if row else 0
            if version != old_refs_version:
                raise ChunkChanged(ino, chunk_index, old_refs_version, version)
            old = tx.all(S.SEL_REFS, (ino, chunk_index, chunk_index))
            tx.run(S.DEL_REFS_CHUNK, (ino, chunk_index))
            for i, p in enumerate(pieces, start=1):
                tx.run(
                    S.INS_REF,
                    (
                        ino,
                        chunk_index,
                        version + i,
                        p.slice_id,
                        p.chunk_offset,
                        p.length,
                        p.slice_offset,
                    ),
                )
                self._ref_slice(tx, p, group, slice_length)
            new_version = version + max(1, len(pieces))
            if row is None:
                tx.one(S.BUMP_CHUNK, (ino, chunk_index))
            tx.run(S.SET_CHUNK, (new_version, len(pieces), ino, chunk_index))
            self._deref(tx, Counter(r[2] for r in old), now)
            return ChunkMap(ino, chunk_index, new_version, tuple(pieces))

        return self._run(txn)


def open_sql_store(url: str, **options: Any) -> SqlMetaStore:
    """Connect to ``url`` and wrap it in the engine (see ``api.open_meta``)."""
    backend = backend_from_url(url, **options)
    try:
        return SqlMetaStore(backend)
    except MetaUnavailable:
        backend.close()
        raise
