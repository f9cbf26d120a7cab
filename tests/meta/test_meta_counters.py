"""The statfs counters: appended deltas, folded into the base row, exact throughout.

Every operation that changes the inode count or the used bytes appends a row
to ``counter_deltas`` (no shared row between concurrent writers); a store
folds all deltas into the base every ``FOLD_EVERY`` deltas. The counts must
be exact before, across and after folds, across processes and forks, and a
version-6 database (base rows only) migrates without losing a count.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable

import pytest

from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_INO, SliceRef
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.engine import core as engine_core
from shinglefs.meta.schema import SCHEMA_VERSION

SPAWN = mp.get_context("spawn")


def deltas(meta: SqlMetaStore) -> int:
    return int(meta.backend.run(lambda tx: tx.one("SELECT COUNT(*) FROM counter_deltas"),
                                "read")[0])


def write_file(meta: SqlMetaStore, parent: int, name: bytes, size: int) -> int:
    f = meta.create(parent, name, 0o644)
    sid = meta.next_slice_id()
    meta.commit_slice(f.ino, 0, SliceRef(sid, 0, size), size)
    return f.ino


def test_counts_are_exact_across_folds_and_the_table_stays_short(
        meta: SqlMetaStore, check: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_core, "FOLD_EVERY", 8)
    before = meta.statfs()
    for i in range(30):
        write_file(meta, ROOT_INO, b"f%d" % i, 1000 + i)
    for i in range(0, 30, 3):
        meta.unlink(ROOT_INO, b"f%d" % i)
    after = meta.statfs()
    kept = [1000 + i for i in range(30) if i % 3]
    assert after.inodes - before.inodes == len(kept)
    assert after.used_bytes - before.used_bytes == sum(kept)
    assert deltas(meta) <= 8 + 2  # folded: at most one fold's worth (+ one operation's)
    check()


def test_appending_to_a_file_adds_only_its_growth(meta: SqlMetaStore,
                                                  check: Callable[[], None]) -> None:
    ino = write_file(meta, ROOT_INO, b"log", 4096)
    used = meta.statfs().used_bytes
    sid = meta.next_slice_id()
    meta.commit_slice(ino, 0, SliceRef(sid, 0, 100), 4096)  # an overwrite: no growth
    assert meta.statfs().used_bytes == used
    sid = meta.next_slice_id()
    meta.commit_slice(ino, 0, SliceRef(sid, 0, 100, 4096), 4196)
    assert meta.statfs().used_bytes == used + 100
    check()


def _creator(url: str, index: int, n: int) -> None:
    store = open_meta(url)
    try:
        d = store.mkdir(ROOT_INO, b"c%d" % index, 0o755).ino
        for i in range(n):
            f = store.create(d, b"f%d" % i, 0o644)
            store.commit_slice(f.ino, 0, SliceRef(store.next_slice_id(), 0, 10), 10)
    finally:
        store.close()


def test_concurrent_processes_keep_the_counts_exact(meta_url: str, meta: SqlMetaStore,
                                                    check: Callable[[], None]) -> None:
    before = meta.statfs()
    procs = [SPAWN.Process(target=_creator, args=(meta_url, i, 40)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    after = meta.statfs()
    assert after.inodes - before.inodes == 4 * 41
    assert after.used_bytes - before.used_bytes == 4 * 40 * 10
    check()


def test_a_forked_child_draws_its_own_writer_id(meta: SqlMetaStore) -> None:
    writer, _ = meta._delta_key()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write_end, str(meta._delta_key()[0]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    child = int(os.read(read_end, 64))
    os.close(read_end)
    os.waitpid(pid, 0)
    assert child != writer
    assert meta._delta_key()[0] == writer


def test_a_version_6_database_gains_counter_deltas_when_opened(
        meta_url: str, meta: SqlMetaStore) -> None:
    for i in range(5):
        write_file(meta, ROOT_INO, b"f%d" % i, 100)
    counted = meta.statfs()
    meta._fold()

    def downgrade(tx) -> None:  # type: ignore[no-untyped-def]
        tx.run("DROP TABLE counter_deltas")
        tx.run("UPDATE format SET schema_version = 6")

    meta.backend.run(downgrade, "write")
    meta.close()
    again = open_meta(meta_url)
    try:
        assert isinstance(again, SqlMetaStore)
        assert again.format_info().schema_version == SCHEMA_VERSION == 7
        assert again.statfs() == counted
        write_file(again, ROOT_INO, b"new", 50)
        now = again.statfs()
        assert now.used_bytes == counted.used_bytes + 50
        assert now.inodes == counted.inodes + 1
    finally:
        again.close()
