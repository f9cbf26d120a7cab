"""MetaStore.sync: committed transactions made durable on demand."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_CTX, ROOT_INO
from shinglefs.meta.engine import SqlMetaStore


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
