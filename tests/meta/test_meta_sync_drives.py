"""MetaStore.sync (durable on demand) and the drives table (with the v1 migration)."""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

import pytest

from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_CTX, ROOT_INO
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.errors import FsError


def test_sync_returns_and_keeps_every_committed_transaction(meta: SqlMetaStore) -> None:
    attr = meta.mkdir(ROOT_INO, b"made", 0o755, ROOT_CTX)
    meta.sync()
    meta.sync()  # idempotent
    assert meta.lookup(ROOT_INO, b"made", ROOT_CTX).ino == attr.ino


def test_sqlite_normal_sync_fsyncs_the_wal_and_full_needs_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    normal = open_meta(f"sqlite3://{tmp_path / 'n.db'}")
    normal.format("t", str(uuid.uuid4()))
    normal.mkdir(ROOT_INO, b"d", 0o755, ROOT_CTX)
    monkeypatch.setattr(os, "fsync", spy)
    normal.sync()
    assert str(tmp_path / "n.db-wal") in synced
    normal.close()

    synced.clear()
    full = open_meta(f"sqlite3://{tmp_path / 'f.db'}?synchronous=full")
    full.format("t", str(uuid.uuid4()))
    full.sync()  # every commit is already fsynced: nothing to do
    assert synced == []
    full.close()


def test_sqlite_normal_makes_an_id_batch_durable_before_handing_out_its_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cut must not roll back an id batch whose ids already name slices
    on a drive: the batch's autocommit write is followed by a WAL fsync."""
    normal = open_meta(f"sqlite3://{tmp_path / 'n.db'}")
    normal.format("t", str(uuid.uuid4()))
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    first = normal.next_slice_id()  # the first id of a fresh batch
    assert str(tmp_path / "n.db-wal") in synced
    synced.clear()
    assert normal.next_slice_id() == first + 1  # from the same batch: no write, no fsync
    assert synced == []
    normal.close()


def test_drives_are_recorded_in_their_own_table(meta: SqlMetaStore) -> None:
    assert meta.drives() == []
    meta.set_drives(["emulated:/d/0.img:1G", "emulated:/d/1.img:1G"])
    assert meta.drives() == ["emulated:/d/0.img:1G", "emulated:/d/1.img:1G"]
    assert meta.listxattr(ROOT_INO) == []  # nothing shows in listxattr /
    meta.set_drives(["block:/dev/sdb"])
    assert meta.drives() == ["block:/dev/sdb"]
    with pytest.raises(FsError) as err:
        meta.set_drives([""])
    assert err.value.errno == errno.EINVAL
    assert meta.drives() == ["block:/dev/sdb"]


def test_a_version_1_database_is_migrated_when_opened(meta_url: str, meta: SqlMetaStore) -> None:
    # Make it look like version 1: no drives table, the list as the root xattr.
    meta.backend.run(lambda tx: tx.run("DROP TABLE drives"), "write")
    meta.setxattr(ROOT_INO, b"trusted.shinglefs.drives", b'["emulated:/x.img:1G"]')
    meta.backend.run(lambda tx: tx.run("UPDATE format SET schema_version = 1"), "write")
    meta.close()

    again = open_meta(meta_url)
    try:
        assert again.format_info().schema_version == 7
        assert again.drives() == ["emulated:/x.img:1G"]
        assert again.listxattr(ROOT_INO) == []
    finally:
        again.close()


def test_close_files_closes_a_batch_in_one_transaction_and_reports_the_freed(
    meta: SqlMetaStore,
) -> None:
    from shinglefs.meta.api import SessionInfo

    s = meta.register_session(SessionInfo(host="batch"))
    kept = meta.create(ROOT_INO, b"kept", 0o644, ROOT_CTX, session=s)
    doomed = meta.create(ROOT_INO, b"doomed", 0o644, ROOT_CTX, session=s)
    meta.open_file(s, doomed.ino)  # two descriptors on doomed
    meta.unlink(ROOT_INO, b"doomed")
    # One close each for kept and doomed: doomed keeps one descriptor.
    assert meta.close_files(s, [kept.ino, doomed.ino]) == []
    assert meta.getattr(doomed.ino).nlink == 0
    assert meta.close_files(s, [doomed.ino]) == [doomed.ino]
    with pytest.raises(FsError) as err:
        meta.getattr(doomed.ino)
    assert err.value.errno == errno.ENOENT
    assert meta.getattr(kept.ino).nlink == 1
    assert meta.close_files(s, []) == []
