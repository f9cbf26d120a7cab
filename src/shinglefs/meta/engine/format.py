"""Format and life cycle: the schema, the format record, migrations on open, the
drive list, capacity and statfs.

``format`` creates the tables (idempotent DDL, autocommit), then writes the
format record, the id counters, the statfs counter shards and the root
directory in ONE transaction: a concurrent format of the same database loses
with ``AlreadyFormatted`` and leaves nothing behind. Opening a database of an
older schema migrates it in place (each step one transaction that re-checks
the version, so two processes opening at once migrate once).
"""

from __future__ import annotations

import errno as E
import functools
import json
import stat
from collections.abc import Sequence
from typing import Any

from shinglefs.meta import schema as S
from shinglefs.meta.backend import Tx
from shinglefs.meta.engine.core import SqlCore, now_ns
from shinglefs.meta.errors import (
    AlreadyFormatted,
    ChunkSizeError,
    FsError,
    NotFormatted,
    SchemaVersionError,
)
from shinglefs.meta.records import (
    BLOCK_SIZE,
    CHUNK_SIZE,
    FIRST_COOKIE,
    ROOT_INO,
    DriveRecord,
    FormatInfo,
    StatFs,
)

INODES_TOTAL = 1 << 32
"""The inode count statfs reports as the file system's total."""


def _run_ddl(tx: Tx, ddl: str) -> int:
    return tx.run(ddl)


def _write_format(tx: Tx, info: FormatInfo, capacity_bytes: int, where: str) -> None:
    """The rows of a new file system: format record, id counters, statfs
    shards, and the root directory (ino 1, mode 0o755, root's, its own parent)."""
    if tx.one(S.SEL_FORMAT) is not None:
        raise AlreadyFormatted(f"{where} was formatted concurrently")
    now = info.created_ns
    tx.run(
        S.INS_FORMAT,
        (info.name, info.uuid, info.chunk_size, info.block_size, S.SCHEMA_VERSION,
         info.secret, now, capacity_bytes),
    )  # fmt: skip
    for id_name, first in (("inode", ROOT_INO + 1), ("slice", 1), ("session", 1),
                           ("server", 1)):
        tx.run(S.INS_ID, (id_name, first))
    for shard in range(S.COUNTER_SHARDS):
        tx.run(S.INS_COUNTER, (shard,))
    mode = stat.S_IFDIR | 0o755
    tx.run(
        S.INS_INODE,
        (ROOT_INO, mode, 0, 0, 2, 0, now, now, now, 0, 1, 0,
         ROOT_INO, FIRST_COOKIE, None, None, None),
    )  # fmt: skip
    tx.run(S.ADD_COUNTERS, (0, 1, 0))


def check_chunk_size(chunk_size: int, block_size: int) -> None:
    """``ChunkSizeError`` unless ``chunk_size`` is a positive multiple of
    ``block_size`` no larger than the store's largest slice (a slice never
    crosses a chunk, and one slice must be able to fill one)."""
    # Imported here: the slice store's package is heavy, and only format needs it.
    from shinglefs.store.api import MAX_SLICE_SIZE

    if block_size <= 0 or chunk_size <= 0 or chunk_size % block_size:
        raise ChunkSizeError(
            chunk_size, block_size, MAX_SLICE_SIZE,
            f"is not a positive multiple of the block size {block_size}",
        )  # fmt: skip
    if chunk_size > MAX_SLICE_SIZE:
        raise ChunkSizeError(
            chunk_size, block_size, MAX_SLICE_SIZE,
            f"exceeds the store's maximum slice size {MAX_SLICE_SIZE}",
        )  # fmt: skip


class FormatOps(SqlCore):
    """format, format_info (in ``SqlCore``), sync, close, the drive list,
    capacity and statfs, and the schema check and migrations on open."""

    def _open_existing(self) -> None:
        """On open: nothing for an empty database; migrate an older schema;
        refuse (closing the backend) a schema this code does not speak."""
        try:
            info = self.format_info()
        except NotFormatted:
            return
        migrations = {1: self._migrate_v1, 2: self._migrate_v2, 3: self._migrate_v3,
                      4: self._migrate_v4, 5: self._migrate_v5,
                      6: self._migrate_v6}
        try:
            while info.schema_version in migrations:
                migrations[info.schema_version]()
                info = self.format_info()
        except BaseException:
            self._b.close()
            raise
        if info.schema_version != S.SCHEMA_VERSION:
            self._b.close()
            raise SchemaVersionError(
                f"{self._b.where} holds schema version {info.schema_version}; this shinglefs "
                f"speaks version {S.SCHEMA_VERSION}",
                hint="run a shinglefs release of the matching schema, or format a fresh database",
            )
        self._chunk_size = info.chunk_size
        self._formatted = True

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
        check_chunk_size(chunk_size, block_size)
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
        info = FormatInfo(name, uuid, chunk_size, block_size, S.SCHEMA_VERSION, secret, now_ns())
        try:
            self._run(lambda tx: _write_format(tx, info, capacity_bytes, self.url_where))
        except FsError as exc:
            if exc.errno == E.EEXIST:
                raise AlreadyFormatted(f"{self.url_where} was formatted concurrently") from None
            raise
        self._chunk_size = chunk_size
        self._formatted = True
        return info

    def sync(self) -> None:
        self._b.sync()

    def close(self) -> None:
        self._b.close()

    # ---- migrations ------------------------------------------------------------------------

    def _migrate_v1(self) -> None:
        """Version 1 -> 3: the drive list moves from the root xattr into ``drives``
        (created with version 3's ``uuid`` column)."""
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
            tx.run(S.SET_SCHEMA_VERSION, (3,))

        self._run(txn)

    def _migrate_v2(self) -> None:
        """Version 2 -> 3: ``drives`` gains the ``uuid`` column (NULL: identity not yet known)."""

        def txn(tx: Tx) -> None:
            row = tx.one(S.SEL_FORMAT)
            if row is None or row[4] != 2:
                return  # migrated concurrently
            tx.run(S.ADD_DRIVES_UUID)
            tx.run(S.SET_SCHEMA_VERSION, (3,))

        self._run(txn)

    def _migrate_v3(self) -> None:
        """Version 3 -> 4: the ``inline_slices`` table (small files stored in meta), empty."""
        self._run(functools.partial(_run_ddl, ddl=S.INLINE_DDL), "autocommit")

        def txn(tx: Tx) -> None:
            row = tx.one(S.SEL_FORMAT)
            if row is None or row[4] != 3:
                return  # migrated concurrently
            tx.run(S.SET_SCHEMA_VERSION, (4,))

        self._run(txn)

    def _migrate_v4(self) -> None:
        """Version 4 -> 5: the ``servers`` table (storage-server membership), empty,
        and the ``server`` id counter."""
        self._run(functools.partial(_run_ddl, ddl=S.SERVERS_DDL), "autocommit")

        def txn(tx: Tx) -> None:
            row = tx.one(S.SEL_FORMAT)
            if row is None or row[4] != 4:
                return  # migrated concurrently
            tx.run(S.INS_ID_IF_MISSING, ("server", 1))
            tx.run(S.SET_SCHEMA_VERSION, (5,))

        self._run(txn)

    def _migrate_v5(self) -> None:
        """Version 5 -> 6: ``inodes.replicas`` (a directory's replication goal, NULL:
        inherit) and the ``drive_states`` table, empty."""
        self._run(functools.partial(_run_ddl, ddl=S.DRIVE_STATES_DDL), "autocommit")
        has_column = S.HAS_INODE_REPLICAS[self._b.dialect.name]

        def txn(tx: Tx) -> None:
            row = tx.one(S.SEL_FORMAT)
            if row is None or row[4] != 5:
                return  # migrated concurrently
            present = tx.one(has_column)
            if present is None or not present[0]:
                tx.run(S.ADD_INODE_REPLICAS)
            tx.run(S.SET_SCHEMA_VERSION, (6,))

        self._run(txn)

    def _migrate_v6(self) -> None:
        """Version 6 -> 7: the ``counter_deltas`` table, empty (the base rows keep
        every count so far)."""
        self._run(functools.partial(_run_ddl, ddl=S.COUNTER_DELTAS_DDL), "autocommit")

        def txn(tx: Tx) -> None:
            row = tx.one(S.SEL_FORMAT)
            if row is not None and row[4] == 6:  # else migrated concurrently
                tx.run(S.SET_SCHEMA_VERSION, (7,))

        self._run(txn)

    # ---- drives ----------------------------------------------------------------------------

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

    # ---- capacity and statfs ---------------------------------------------------------------

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
