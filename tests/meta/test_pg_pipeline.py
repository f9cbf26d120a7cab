"""PostgreSQL transactions pipelined on libpq (meta/pgwire.py): what each kind
of statement promises (``put``, ``need``, ``insert``, ``one``), that errors
surface before anything commits, and that a connection is left usable (or
replaced) after every failure — a failed PREPARE, a constraint violation, a
backend killed mid-transaction, more statements than the prepared cache."""

from __future__ import annotations

import errno
from collections.abc import Iterator

import psycopg
import pytest
from tests.support.pgcluster import PgCluster

from shinglefs.meta import pgwire
from shinglefs.meta.backend import Tx, backend_from_url
from shinglefs.meta.errors import FsError, NotFormatted
from shinglefs.meta.pgbackend import PostgresBackend

pytestmark = pytest.mark.postgres


@pytest.fixture
def backend(pg_cluster: PgCluster) -> Iterator[PostgresBackend]:
    b = backend_from_url(pg_cluster.new_database(), pool_max=1)
    assert isinstance(b, PostgresBackend)
    b.run(lambda tx: tx.run("CREATE TABLE t (k BIGINT PRIMARY KEY, v BYTEA, n BIGINT NOT NULL)"),
          "autocommit")
    yield b
    b.close()


def rows(b: PostgresBackend) -> list[tuple[int, bytes | None, int]]:
    return b.run(lambda tx: tx.all("SELECT k, v, n FROM t ORDER BY k"), "read")


def test_puts_commit_with_the_transaction_and_read_back_exactly(backend: PostgresBackend) -> None:
    blob = bytes(range(256)) * 16

    def txn(tx: Tx) -> int:
        tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (1, blob, -5))
        tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (2, None, 2**62))
        tx.put("UPDATE t SET n = n + ? WHERE k = ?", (10, 1))
        return int(tx.one("SELECT n FROM t WHERE k = ?", (1,))[0])

    assert backend.run(txn, "write") == 5
    assert rows(backend) == [(1, blob, 5), (2, None, 2**62)]


def test_an_error_raised_after_puts_commits_none_of_them(backend: PostgresBackend) -> None:
    def txn(tx: Tx) -> None:
        tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (1, b"x", 1))
        tx.one("SELECT 1")
        raise FsError(errno.EIO, "the operation changed its mind")

    with pytest.raises(FsError):
        backend.run(txn, "write")
    assert rows(backend) == []
    backend.run(lambda tx: tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (3, b"", 3)),
                "write")  # the connection is idle and usable again
    assert rows(backend) == [(3, b"", 3)]


def test_insert_maps_its_violation_and_the_commit_is_rolled_back(backend: PostgresBackend) -> None:
    backend.run(lambda tx: tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (1, b"a", 1)),
                "write")

    def txn(tx: Tx) -> None:
        tx.put("UPDATE t SET n = ? WHERE k = ?", (99, 1))
        tx.insert("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (1, b"b", 2),
                  lambda: FsError(errno.EEXIST, "k 1 exists"))
        tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (7, b"c", 7))

    with pytest.raises(FsError) as caught:
        backend.run(txn, "write")
    assert caught.value.errno == errno.EEXIST
    assert rows(backend) == [(1, b"a", 1)]  # the UPDATE before it was rolled back too


def test_a_not_null_violation_is_an_insert_violation_too(backend: PostgresBackend) -> None:
    def txn(tx: Tx) -> None:
        tx.insert("INSERT INTO t (k, v, n) VALUES (?, ?, (SELECT n FROM t WHERE k = ?))",
                  (5, b"", 12345), lambda: FsError(errno.ESTALE, "no row 12345"))

    with pytest.raises(FsError) as caught:
        backend.run(txn, "write")
    assert caught.value.errno == errno.ESTALE


def test_need_is_settled_before_commit_and_fail_may_ask_the_database(
        backend: PostgresBackend) -> None:
    backend.run(lambda tx: tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (1, b"a", 1)),
                "write")

    def txn(tx: Tx) -> None:
        tx.put("UPDATE t SET n = ? WHERE k = ?", (50, 1))

        def fail() -> FsError:
            seen = tx.one("SELECT n FROM t WHERE k = ?", (1,))[0]  # inside this transaction
            return FsError(errno.ENOENT, f"no k 2 (k 1 has n {seen})")

        tx.need("UPDATE t SET n = n + 1 WHERE k = ?", (2,), fail)

    with pytest.raises(FsError, match="k 1 has n 50"):
        backend.run(txn, "write")
    assert rows(backend) == [(1, b"a", 1)]


def test_a_statement_that_fails_to_prepare_is_prepared_again_next_time(
        backend: PostgresBackend) -> None:
    bad = "SELECT n FROM missing_table WHERE k = ?"
    for _ in range(2):
        with pytest.raises(NotFormatted):  # what an unknown table means to the engine
            backend.run(lambda tx: tx.one(bad, (1,)), "read")
    backend.run(lambda tx: tx.run("CREATE TABLE missing_table (k BIGINT, n BIGINT)"),
                "autocommit")
    assert backend.run(lambda tx: tx.one(bad, (1,)), "read") is None


def test_a_prepare_skipped_after_an_earlier_error_is_not_taken_for_done(
        backend: PostgresBackend) -> None:
    backend.run(lambda tx: tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (1, b"a", 1)),
                "write")
    fresh = "SELECT v FROM t WHERE k = ? AND n >= 0"  # first use: prepared in the pipeline

    def txn(tx: Tx) -> None:
        tx.insert("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (1, b"b", 2),
                  lambda: FsError(errno.EEXIST, "exists"))
        tx.put(fresh, (1,))  # its PREPARE is skipped: the pipeline aborted before it
        tx.one("SELECT 1")

    with pytest.raises(FsError):
        backend.run(txn, "write")
    assert backend.run(lambda tx: tx.one(fresh, (1,)), "read") == (b"a",)


def test_a_backend_killed_mid_transaction_is_retried_on_a_new_connection(
        backend: PostgresBackend) -> None:
    killed = []

    def txn(tx: Tx) -> int:
        tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (1, b"a", 1))
        pid = tx.one("SELECT pg_backend_pid()")[0]
        if not killed:
            killed.append(pid)
            with psycopg.connect(backend.url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return int(pid)

    pid = backend.run(txn, "write")
    assert pid != killed[0]
    assert rows(backend) == [(1, b"a", 1)]


def test_past_the_prepared_cache_statements_run_unnamed(
        backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pgwire, "PREPARED_MAX", 2)
    for k in range(6):
        backend.run(lambda tx, k=k: tx.put(
            f"INSERT INTO t (k, v, n) VALUES (?, ?, {k})", (k, b"")), "write")
    assert [r[2] for r in rows(backend)] == list(range(6))


def test_dollar_placeholders() -> None:
    assert pgwire.dollar_placeholders("SELECT %s, '%%', %s") == b"SELECT $1, '%', $2"
    with pytest.raises(ValueError):
        pgwire.dollar_placeholders("SELECT %d")


def test_a_connection_past_descriptor_1024_works(pg_cluster: PgCluster) -> None:
    """``select()`` cannot wait on a descriptor >= 1024; a training process with
    many files open reaches that (the full test run did)."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard} is too low for this test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        b = backend_from_url(pg_cluster.new_database(), pool_max=1)
        try:
            assert b.run(lambda tx: tx.one("SELECT 41 + 1"), "single") == (42,)
        finally:
            b.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


REFUSING_UPDATE = (
    "{refuse_empty_open}UPDATE t SET n = n + 1 WHERE k = ? RETURNING k, n{refuse_empty_close}"
)


def test_last_answers_after_the_commit_in_the_same_flight(backend: PostgresBackend) -> None:
    def txn(tx: Tx):
        tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (1, None, 1))
        row = tx.later(REFUSING_UPDATE, (1,), lambda: FsError(errno.ENOENT, "no row 1"))
        with pytest.raises(RuntimeError):
            row()  # not answered yet: it is read when the transaction ends
        return row

    row = backend.run(txn, "write")
    assert row() == (1, 2)
    assert rows(backend) == [(1, None, 2)]


def test_a_refusing_last_raises_fail_and_commits_nothing(backend: PostgresBackend) -> None:
    def txn(tx: Tx):
        tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (1, None, 1))
        return tx.later(REFUSING_UPDATE, (7,), lambda: FsError(errno.ENOENT, "no row 7"))

    for _ in range(3):  # the connection is back to idle each time
        with pytest.raises(FsError) as info:
            backend.run(txn, "write")
        assert info.value.errno == errno.ENOENT
    assert rows(backend) == []
    backend.run(lambda tx: tx.put("INSERT INTO t (k, v, n) VALUES (?, ?, ?)", (3, b"", 3)),
                "write")
    assert rows(backend) == [(3, b"", 3)]
