"""PostgreSQL's ``?synchronous=``: what a commit promises in each mode and what
``sync()`` adds (PostgresBackend's docstring, docs/metadata.md "Durability")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from tests.support.pgcluster import PgCluster

from shinglefs.meta import open_meta
from shinglefs.meta import schema as S
from shinglefs.meta.api import ROOT_INO
from shinglefs.meta.backend import backend_from_url
from shinglefs.meta.errors import MetaURLError
from shinglefs.meta.pgbackend import PostgresBackend

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> Iterator[str]:
    """A fresh database whose own default is ``synchronous_commit = on`` (the
    session's cluster runs with it off), so that the modes can be told apart."""
    url = pg_cluster.new_database()
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
    yield url


def _setting(backend: PostgresBackend, name: str) -> str:
    with backend.pool.connection() as conn:
        return str(conn.execute(f"SHOW {name}").fetchone()[0])


@pytest.mark.parametrize(
    ("query", "options", "mode", "commit"),
    [
        ("", {}, "NORMAL", "off"),
        ("?synchronous=normal", {}, "NORMAL", "off"),
        ("?synchronous=FULL", {}, "FULL", "on"),
        ("", {"synchronous": "full"}, "FULL", "on"),
    ],
)
def test_synchronous_option_sets_the_commit_mode_of_every_pooled_connection(
    pg_url: str, query: str, options: dict[str, str], mode: str, commit: str
) -> None:
    backend = backend_from_url(pg_url + query, **options)
    try:
        assert isinstance(backend, PostgresBackend)
        assert backend.synchronous == mode
        assert _setting(backend, "synchronous_commit") == commit
        assert ("synchronous_commit=off" in backend.durability) == (mode == "NORMAL")
    finally:
        backend.close()


def test_libpq_options_in_the_url_are_kept_next_to_synchronous_commit(pg_url: str) -> None:
    url = pg_url + "?options=-c%20statement_timeout%3D12345&synchronous=normal"
    backend = backend_from_url(url)
    try:
        assert isinstance(backend, PostgresBackend)
        assert _setting(backend, "statement_timeout") == "12345ms"
        assert _setting(backend, "synchronous_commit") == "off"
    finally:
        backend.close()


@pytest.mark.parametrize("value", ["fast", "off", "extra"])
def test_an_unknown_synchronous_value_is_a_url_error_before_any_connection(value: str) -> None:
    # Port 1 has no server: the URL error must come first, not MetaUnavailable.
    with pytest.raises(MetaURLError) as info:
        backend_from_url(f"postgresql://nobody@127.0.0.1:1/db?synchronous={value}")
    assert f"synchronous={value}" in str(info.value)
    assert "synchronous=normal" in (info.value.hint or "")


def test_after_sync_returns_every_earlier_commit_is_flushed(pg_url: str) -> None:
    store = open_meta(pg_url)
    try:
        store.format("t", str(uuid.uuid4()))
        for i in range(20):
            store.create(ROOT_INO, b"f%d" % i, 0o644)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            # After the commits above: an LSN at or past their commit records.
            committed = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
            store.sync()
            flushed = conn.execute(
                "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (str(committed),)
            ).fetchone()[0]
        assert flushed is True
    finally:
        store.close()


def test_sync_with_synchronous_full_returns_at_once(pg_url: str) -> None:
    store = open_meta(pg_url + "?synchronous=full")
    try:
        store.format("t", str(uuid.uuid4()))
        store.create(ROOT_INO, b"f", 0o644)
        store.sync()
        assert store.lookup(ROOT_INO, b"f").ino > 0
    finally:
        store.close()


def test_a_commit_in_normal_mode_is_visible_to_another_client_at_once(pg_url: str) -> None:
    writer = open_meta(pg_url)
    reader = open_meta(pg_url)
    try:
        writer.format("t", str(uuid.uuid4()))
        made = writer.create(ROOT_INO, b"seen", 0o644)
        assert reader.lookup(ROOT_INO, b"seen").ino == made.ino
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute("SELECT ino FROM dentries WHERE name = %s", (b"seen",)).fetchone()
        assert row == (made.ino,)
    finally:
        writer.close()
        reader.close()


def test_a_deletion_pass_makes_the_unreferencing_durable_before_bytes_go(
    pg_url: str, tmp_path: Path
) -> None:
    from shinglefs.client.api import connect
    from shinglefs.client.filesystem import format_filesystem

    format_filesystem(pg_url, [f"emulated:{tmp_path}/smr.img:4G"], name="t")
    with connect(pg_url) as fs:
        fs.write_bytes("/big", b"x" * (2 * 1024 * 1024))  # a slice on the drive, not inline
        fs.unlink("/big")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            unlinked = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
            assert fs.vfs.run_deletions() >= 1
            flushed = conn.execute(
                "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (str(unlinked),)
            ).fetchone()[0]
        assert flushed is True


def test_an_id_batch_is_durable_before_run_returns(pg_url: str) -> None:
    store = open_meta(pg_url)
    try:
        store.format("t", str(uuid.uuid4()))
        backend = store.backend
        assert isinstance(backend, PostgresBackend)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            backend.run(lambda tx: tx.one(S.ALLOC_IDS, (1024, "inode")), "autocommit")
            allocated = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
            flushed = conn.execute(
                "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (str(allocated),)
            ).fetchone()[0]
        assert flushed is True
    finally:
        store.close()
