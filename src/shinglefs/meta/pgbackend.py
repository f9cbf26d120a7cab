"""The PostgreSQL backend: psycopg 3 and a connection pool (``backend`` states the
contract both backends keep: modes, retries, what a lost connection means)."""

from __future__ import annotations

import functools
import logging
import os
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from shinglefs.meta import schema
from shinglefs.meta.backend import (
    LOST_CONNECTION_RETRIES,
    MAX_ATTEMPTS,
    Mode,
    T,
    Tx,
    backoff,
    gave_up,
    process_id,
)
from shinglefs.meta.errors import FsError, MetaUnavailable, MetaURLError, NotFormatted, TxConflict
from shinglefs.meta.pgerrors import connection_lost, pg_unavailable

log = logging.getLogger(__name__)

TCP_LIVENESS = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                "keepalives_count": 3, "tcp_user_timeout": 30_000}
"""libpq settings for every connection unless the URL sets them: a server
whose host went away (a network partition, a dead host) is found in about
25 s when idle (keepalives) and 30 s with a request unanswered
(``tcp_user_timeout``, ms), and the connection fails (EIO, then a new one),
instead of waiting for the kernel's retransmissions (~15 minutes). A server
that is up but does not answer (stopped) is not detected by either."""

PG_PREPARED_MAX = 512
"""Prepared statements kept per connection (psycopg's default, 100, is about
the number of the engine's statements: a long-running mount would evict and
re-prepare). psycopg prepares a statement on its 5th execution."""


def _configure_pg(conn: Any, synchronous: str) -> None:
    """Each new pooled connection: its prepared-statement cache, and in
    normal mode ``synchronous_commit = off`` for the session (one round trip
    per connection; a SET rather than a startup option, which connection
    poolers such as PgBouncer refuse)."""
    conn.prepared_max = PG_PREPARED_MAX
    if synchronous == "NORMAL":
        conn.execute("SET synchronous_commit = off")


class PostgresBackend:
    """PostgreSQL through psycopg 3 and a ConnectionPool; SERIALIZABLE writes.

    Durability (``synchronous``, the URL's ``?synchronous=``):

    - ``"NORMAL"`` (default): the pool's connections run with
      ``synchronous_commit = off`` (set once per connection). A commit
      returns once its record is in the server's WAL buffers, without
      waiting for the WAL flush: it is visible to every client at once and
      survives the crash of any client process, and the server's WAL writer
      makes it durable within ``wal_writer_delay`` (200 ms by default;
      PostgreSQL bounds the window at 3 x that). A crash of the PostgreSQL
      server or of its host (power cut) loses the commits of that window
      that were not ``sync()``ed — a tail of the commit order, never part of
      a transaction, never a corrupt database: recovery replays a prefix of
      the WAL. The ordered-commit rule (slice bytes are flushed on their
      drive before any transaction references them) holds whatever is lost;
      the deletion consumer ``sync()``s before it deletes any bytes.
    - ``"FULL"``: nothing is set; every commit waits for the server's own
      ``synchronous_commit`` (``on`` by default: the WAL is flushed before
      COMMIT returns). ``sync()`` does nothing.

    ``sync()`` (normal) makes every transaction this client — indeed any
    client — committed before the call durable on the server's disk.
    Writes in ``"autocommit"`` mode (id batches, session heartbeats, server
    records, DDL: rare) are flushed before ``run`` returns in both modes, so
    an id range is durable before any of its ids names a slice or an inode.
    """

    dialect = schema.POSTGRES

    def __init__(self, url: str, pool_max: int = 8, connect_timeout: float = 5.0,
                 synchronous: str = "NORMAL") -> None:
        import psycopg
        from psycopg_pool import ConnectionPool

        if synchronous not in ("NORMAL", "FULL"):
            raise MetaURLError(
                f"synchronous={synchronous.lower()} is not supported",
                hint="use ?synchronous=normal (default) or ?synchronous=full",
            )
        self.url = url
        self.synchronous = synchronous
        parts = urlsplit(url)
        self.where = f"postgresql://{parts.hostname or ''}:{parts.port or 5432}{parts.path}"
        self.durability = (
            "postgresql, synchronous_commit=off (synchronous=normal): a committed "
            "transaction is visible to all clients and survives a crash of any client; "
            "a server crash or power cut may lose commits of the last ~3 x wal_writer_delay "
            "not yet sync()ed (never half an operation); sync() (fsync) flushes the WAL"
            if synchronous == "NORMAL"
            else "postgresql, synchronous=full: every commit waits for the server's "
            "synchronous_commit (durable on power loss with the server's defaults)"
        )
        self._psycopg = psycopg
        try:
            # The URL's own parameters win (and a malformed one fails here, at
            # once: given as an argument it was overridden, and the pool then
            # retried the bad URL for 30 s, warning each time).
            given = psycopg.conninfo.conninfo_to_dict(url)
            defaults = {"connect_timeout": int(connect_timeout), **TCP_LIVENESS}
            extra: dict[str, Any] = {k: v for k, v in defaults.items() if k not in given}
            probe = psycopg.connect(url, autocommit=True, **extra)
            probe.close()
        except psycopg.Error as exc:
            raise pg_unavailable(url, exc) from None
        self._pid = os.getpid()
        self.pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_max,
            kwargs={"autocommit": True, **extra},
            configure=functools.partial(_configure_pg, synchronous=synchronous),
            open=True,
            timeout=30.0,
            name="shinglefs-meta",
        )
        self._prepared: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._retryable = (
            psycopg.errors.SerializationFailure,
            psycopg.errors.DeadlockDetected,
            TxConflict,
        )

    def run(self, fn: Callable[[Tx], T], mode: Mode) -> T:
        result = self._run(fn, mode)
        if mode == "autocommit" and self.synchronous == "NORMAL":
            # Rare writes (id batches, heartbeats, server records, DDL) are
            # flushed before they are used: ids handed out before a server
            # crash are never handed out again after it.
            self.sync()
        return result

    def _run(self, fn: Callable[[Tx], T], mode: Mode) -> T:
        from shinglefs.meta.pgwire import PipelinedTx, Prepared

        psycopg = self._psycopg
        if process_id() != self._pid:
            raise MetaUnavailable(
                "this PostgreSQL metadata store was opened in another process",
                hint="open the metadata URL again in each process after fork",
            )
        if mode == "snapshot":
            begin, mode = "BEGIN ISOLATION LEVEL REPEATABLE READ", "write"
        elif mode == "committed":
            begin, mode = "BEGIN ISOLATION LEVEL READ COMMITTED", "write"
        elif mode == "write":
            begin = "BEGIN ISOLATION LEVEL SERIALIZABLE"
        else:
            begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        lost = 0
        for attempt in range(MAX_ATTEMPTS):
            committing = mode == "autocommit"
            try:
                with self.pool.connection() as conn:
                    prepared = self._prepared.get(conn)
                    if prepared is None:
                        prepared = self._prepared[conn] = Prepared(self.dialect.rendered)
                    tx = PipelinedTx(conn, prepared, None if mode in ("single", "autocommit")
                                     else begin)
                    try:
                        result = fn(tx)
                        tx.finish(commit=mode in ("write", "read"))
                        return result
                    except BaseException:
                        committing = committing or (mode == "write" and tx.commit_in_doubt)
                        tx.abandon(conn)
                        raise
            except self._retryable:
                backoff(attempt)
                continue
            except psycopg.errors.UndefinedTable:
                raise NotFormatted(
                    f"{self.where} holds no ShingleFS file system",
                    hint="format it first: `shinglefs format URL --drive KIND:PATH:SIZE`",
                ) from None
            except psycopg.errors.IntegrityError as exc:
                raise FsError(17, f"constraint violated in {self.where}: {exc}") from None
            except psycopg.OperationalError as exc:
                if not connection_lost(exc):
                    raise pg_unavailable(self.url, exc) from exc
                self._drop_dead_connections()
                if committing or lost >= LOST_CONNECTION_RETRIES:
                    raise pg_unavailable(self.url, exc) from exc
                lost += 1
                backoff(attempt)
                continue
            except psycopg.Error as exc:
                raise MetaUnavailable(f"{self.where}: {exc}") from exc
        raise gave_up(self.where, RuntimeError("serialization failures"))

    def _drop_dead_connections(self) -> None:
        """One pooled connection was found dead: so are, after a server restart,
        all the idle ones. Test them now (a round trip each) and replace the
        dead, so the retry -- or the next transaction, when this one is not
        retried (its commit in doubt) -- gets a live one. Before, each retry
        drew the next dead connection, and the fourth attempt raised EIO to
        the application within milliseconds of a fast restart (4 trials in 5,
        pool full)."""
        try:
            self.pool.check()
        except Exception as exc:  # the retry reports what matters
            log.debug("checking the pool's connections failed: %s", exc)

    def sync(self) -> None:
        """Make every transaction committed before this call durable on the
        server's disk (normal); nothing to do with ``synchronous=full``.

        One round trip: a pipelined ``BEGIN; SET LOCAL synchronous_commit =
        on; SELECT pg_logical_emit_message(true, ...); COMMIT``. The message
        is a WAL record of this transaction (any role may write one; no table
        is touched), so its COMMIT waits until the WAL is flushed up to its
        commit record, which is after every commit that returned before (the
        WAL is one sequence, flushed as a prefix). A transaction that only
        takes an xid (``pg_current_xact_id()``) would not do: PostgreSQL
        commits it asynchronously when it wrote no other WAL. Measured: one
        WAL flush, 1.4-2.3 ms median on the test VM, where waiting for
        ``pg_current_wal_flush_lsn()`` to pass ``pg_current_wal_insert_lsn()``
        takes ~200 ms (the WAL writer's next round, ``wal_writer_delay``).
        Not retried: a connection lost here may mean a server restart that
        lost the commits to be synced. Raises ``MetaUnavailable`` when the
        server cannot be reached or the flush fails."""
        if self.synchronous == "FULL":
            return
        if process_id() != self._pid:
            raise MetaUnavailable(
                "this PostgreSQL metadata store was opened in another process",
                hint="open the metadata URL again in each process after fork",
            )
        psycopg = self._psycopg
        try:
            with self.pool.connection() as conn, conn.pipeline():
                conn.execute("BEGIN")
                conn.execute("SET LOCAL synchronous_commit = on")
                conn.execute("SELECT pg_logical_emit_message(true, 'shinglefs', 'sync')")
                conn.execute("COMMIT")
        except psycopg.OperationalError as exc:
            raise pg_unavailable(self.url, exc) from exc
        except psycopg.Error as exc:
            raise MetaUnavailable(f"{self.where}: WAL flush for sync() failed: {exc}") from exc

    def close(self) -> None:
        if process_id() == self._pid:
            self.pool.close()
