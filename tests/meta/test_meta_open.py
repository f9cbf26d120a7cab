"""Opening by URL, formatting, typed set-up errors, ids, statfs, threads."""

from __future__ import annotations

import errno as E
import sqlite3
import threading
import uuid

import pytest
from tests.support.pgcluster import free_port

from shinglefs.meta import open_meta
from shinglefs.meta.api import CHUNK_SIZE, ROOT_INO, SliceRef
from shinglefs.meta.errors import (
    AlreadyFormatted,
    ChunkSizeError,
    FsError,
    MetaError,
    MetaUnavailable,
    MetaURLError,
    NotFormatted,
    SchemaVersionError,
)
from shinglefs.store.api import MAX_SLICE_SIZE


def one_line(exc: MetaError) -> None:
    assert "\n" not in str(exc) and exc.hint and "\n" not in exc.hint


@pytest.mark.parametrize(
    "url",
    ["mysql://u@h/db", "meta.db", "sqlite3://relative/meta.db", "postgresql://u@127.0.0.1:5432/",
     # urllib's own ValueErrors (a traceback, exit 1, before): a port out of range
     # or not a number, a bracketed host left open
     "postgresql://u@127.0.0.1:99999/x", "postgresql://u@127.0.0.1:abc/x", "postgresql://u@[::1/x"],
)
def test_bad_urls_raise_metaurlerror_with_a_hint(url):
    with pytest.raises(MetaURLError) as info:
        open_meta(url)
    assert info.value.errno == E.EINVAL and info.value.exit_code == 2
    one_line(info.value)


def test_sqlite_is_an_alias_of_sqlite3_and_the_store_spells_it_sqlite3(tmp_path):
    store = open_meta(f"sqlite3://{tmp_path}/m.db")
    store.format("alias", str(uuid.uuid4()))
    store.close()
    alias = open_meta(f"sqlite://{tmp_path}/m.db")
    try:
        assert alias.format_info().name == "alias"  # the same database
        assert alias.url_where == f"sqlite3://{tmp_path}/m.db"
    finally:
        alias.close()


def test_postgres_is_an_alias_of_postgresql(tmp_path):
    # Parsed as PostgreSQL (no server needed): it is refused for naming no database.
    with pytest.raises(MetaURLError) as info:
        open_meta("postgres://u@127.0.0.1:5432/")
    assert "names no database" in str(info.value)


def test_sqlite_unknown_option_is_refused(tmp_path):
    with pytest.raises(MetaURLError):
        open_meta(f"sqlite3://{tmp_path}/m.db?journal=delete")


def test_sqlite_missing_directory_is_unavailable(tmp_path):
    with pytest.raises(MetaUnavailable) as info:
        open_meta(f"sqlite3://{tmp_path}/no/such/dir/meta.db")
    assert "mkdir" in info.value.hint
    one_line(info.value)


def test_sqlite_file_that_is_not_a_database(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(MetaUnavailable) as info:
        open_meta(f"sqlite3://{junk}")
    one_line(info.value)


def test_sqlite_synchronous_full_is_stated_in_durability(tmp_path):
    store = open_meta(f"sqlite3://{tmp_path}/m.db?synchronous=full")
    assert "FULL" in store.durability and "power loss" in store.durability
    store.close()
    store = open_meta(f"sqlite3://{tmp_path}/m.db")
    assert "NORMAL" in store.durability
    store.close()


def test_postgres_unreachable_server_is_one_line_with_hint():
    with pytest.raises(MetaUnavailable) as info:
        open_meta(f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    assert "cannot reach PostgreSQL" in str(info.value)
    one_line(info.value)


@pytest.mark.postgres
def test_postgres_missing_database_says_how_to_create_it(pg_cluster):
    with pytest.raises(MetaUnavailable) as info:
        open_meta(pg_cluster.url("no_such_db"))
    assert "does not exist" in str(info.value) and "CREATE DATABASE" in info.value.hint
    one_line(info.value)


@pytest.mark.postgres
def test_postgres_unknown_user_and_bad_url_parameter_are_named_at_once(pg_cluster):
    """An unknown user was "cannot reach PostgreSQL ... start the server"; a
    malformed parameter (``connect_timeout=abc``) was overridden by the probe,
    then retried by the pool for 30 s with a dozen warnings."""
    url = pg_cluster.url("postgres")
    nobody = url.replace("postgresql://postgres@", "postgresql://no_such_user@")
    assert nobody != url
    with pytest.raises(MetaUnavailable) as info:
        open_meta(nobody)
    assert "no user no_such_user" in str(info.value) and "CREATE ROLE" in info.value.hint
    one_line(info.value)
    with pytest.raises(MetaUnavailable) as info:
        open_meta(url + "?connect_timeout=abc")
    assert "bad parameter" in str(info.value) and "connect_timeout" in str(info.value)
    one_line(info.value)


@pytest.mark.postgres
def test_postgres_connections_notice_a_vanished_server_host(pg_cluster):
    """Every pooled connection has TCP keepalives and a user timeout (a
    partitioned database host failed requests only after the kernel's ~15
    minutes of retransmissions; the mount hung that long); the URL's own
    values win."""
    url = pg_cluster.new_database()
    for suffix, idle in (("", "10"), ("?keepalives_idle=7", "7")):
        store = open_meta(url + suffix)
        with store._b.pool.connection() as conn:
            params = conn.info.get_parameters()
        store.close()
        assert (params.get("keepalives"), params.get("keepalives_idle")) == ("1", idle), params
        assert params.get("tcp_user_timeout") == "30000" and params.get("connect_timeout") == "5"
    pg_cluster.drop_database(url)


def test_format_record_round_trips(meta_url):
    store = open_meta(meta_url)
    with pytest.raises(NotFormatted):
        store.format_info()
    with pytest.raises(NotFormatted):
        store.getattr(ROOT_INO)
    fs_uuid = str(uuid.uuid4())
    info = store.format("corpus", fs_uuid, chunk_size=1 << 20, block_size=4096, secret="k")
    assert store.format_info() == info
    assert (info.name, info.uuid, info.chunk_size, info.secret) == ("corpus", fs_uuid, 1 << 20, "k")
    with pytest.raises(AlreadyFormatted):
        store.format("again", str(uuid.uuid4()))
    store.close()
    reopened = open_meta(meta_url)
    assert reopened.format_info() == info
    reopened.close()


def test_format_refuses_a_chunk_size_no_slice_can_fill_and_writes_nothing(meta_url):
    assert CHUNK_SIZE <= MAX_SLICE_SIZE  # the default formats
    store = open_meta(meta_url)
    try:
        for bad, why in (
            (MAX_SLICE_SIZE + 4096, "maximum slice size"),
            (2 * MAX_SLICE_SIZE, "maximum slice size"),
            (4096 + 1, "multiple of the block size"),
            (0, "multiple of the block size"),
        ):
            with pytest.raises(ChunkSizeError) as info:
                store.format("big", str(uuid.uuid4()), chunk_size=bad, block_size=4096)
            assert isinstance(info.value, FsError) and info.value.errno == E.EINVAL
            assert info.value.chunk_size == bad and info.value.max_slice_size == MAX_SLICE_SIZE
            assert why in str(info.value)
            one_line(info.value)
            with pytest.raises(NotFormatted):
                store.format_info()  # nothing written
        info = store.format("edge", str(uuid.uuid4()), chunk_size=MAX_SLICE_SIZE, block_size=4096)
        assert store.format_info().chunk_size == MAX_SLICE_SIZE == info.chunk_size
    finally:
        store.close()


def test_format_refuses_another_schema_version(meta_url):
    store = open_meta(meta_url)
    with pytest.raises(SchemaVersionError):
        store.format("x", "u", schema_version=99)
    store.close()


def test_schema_of_another_version_is_refused_on_open(meta, meta_url):
    meta.backend.run(lambda tx: tx.run("UPDATE format SET schema_version = 99"), "write")
    with pytest.raises(SchemaVersionError) as info:
        open_meta(meta_url)
    assert "99" in str(info.value)
    one_line(info.value)


def test_slice_ids_are_unique_across_stores(meta, meta_url):
    other = open_meta(meta_url)
    ids = [meta.next_slice_id() for _ in range(1500)] + [other.next_slice_id() for _ in range(1500)]
    other.close()
    assert len(set(ids)) == len(ids) and min(ids) > 0


def test_statfs_counts_inodes_bytes_and_capacity(meta, check):
    base = meta.statfs()
    assert (base.inodes, base.used_bytes, base.capacity_bytes) == (1, 0, 0)
    meta.set_capacity(10_000)
    f = meta.create(ROOT_INO, b"f", 0o644)
    meta.mkdir(ROOT_INO, b"d", 0o755)
    meta.commit_slice(f.ino, 0, SliceRef(meta.next_slice_id(), 0, 3000), 3000)
    st = meta.statfs()
    assert (st.inodes, st.used_bytes, st.capacity_bytes, st.free_bytes) == (3, 3000, 10_000, 7000)
    assert meta.statfs(capacity_bytes=2000).free_bytes == 0
    meta.unlink(ROOT_INO, b"f")
    assert (meta.statfs().inodes, meta.statfs().used_bytes) == (2, 0)
    check()


def test_threads_share_one_store(meta, check):
    d = meta.mkdir(ROOT_INO, b"d", 0o777)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(40):
                meta.create(d.ino, b"t%d-%d" % (t, i), 0o644)
                if i % 3 == 0:
                    meta.rename(d.ino, b"t%d-%d" % (t, i), d.ino, b"shared")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(meta.readdir(d.ino, 0, 1000)) == 4 * 40 - 4 * 14 + 1
    check()


def test_sqlite_database_is_in_wal_mode(tmp_path):
    store = open_meta(f"sqlite3://{tmp_path}/m.db")
    store.format("x", "u")
    store.close()
    conn = sqlite3.connect(tmp_path / "m.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


@pytest.mark.postgres
def test_postgres_operations_survive_killed_server_connections(pg_cluster):
    """A backend killed between operations (server restart, admin kill) costs a
    retry on a fresh connection, not an error."""
    import psycopg

    url = pg_cluster.new_database()
    store = open_meta(url)
    store.format("x", str(uuid.uuid4()))
    for i in range(5):
        store.create(ROOT_INO, b"before%d" % i, 0o644)
    db = url.rsplit("/", 1)[1]
    with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (db,)
        ).fetchall()
    assert killed, "the store held no connection to kill"
    store.create(ROOT_INO, b"after", 0o644)  # write transaction on a dead pooled connection
    assert store.lookup(ROOT_INO, b"before0").is_file  # single-statement read
    assert len(store.readdir(ROOT_INO)) == 6
    store.close()
    pg_cluster.drop_database(url)


@pytest.mark.postgres
def test_postgres_operations_survive_a_restart_with_a_full_pool(pg_cluster):
    """After a server restart every idle pooled connection is dead: a full pool
    (8) handed them out one by one, and the fourth attempt failed the
    application's operation with EIO a few milliseconds after the restart."""
    import contextlib

    import psycopg

    url = pg_cluster.new_database()
    store = open_meta(url)
    store.format("x", str(uuid.uuid4()))
    pool = store._b.pool
    with contextlib.ExitStack() as held:  # grow the pool to its maximum
        for _ in range(pool.max_size):
            held.enter_context(pool.connection())
    assert pool.get_stats()["pool_size"] == pool.max_size
    db = url.rsplit("/", 1)[1]
    with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (db,)
        ).fetchall()
    assert len(killed) == pool.max_size
    assert len(store.readdir(ROOT_INO)) == 0  # retried past the dead connections
    store.create(ROOT_INO, b"after", 0o644)  # and the pool holds live ones again
    assert store.lookup(ROOT_INO, b"after").is_file
    store.close()
    pg_cluster.drop_database(url)


def test_format_filesystem_refuses_a_bad_chunk_size_before_creating_a_drive(tmp_path):
    from shinglefs.client.filesystem import format_filesystem

    with pytest.raises(ChunkSizeError):
        format_filesystem(f"sqlite3://{tmp_path}/meta.db",
                          [f"emulated:{tmp_path}/d0.img:8G"], chunk_size=MAX_SLICE_SIZE * 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no drive file, no database
