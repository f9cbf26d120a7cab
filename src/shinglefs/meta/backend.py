"""Connections and transactions of the two SQL backends.

A backend turns "run this function as one transaction" into the database's
calls, and retries the whole function when the database says the transaction
lost a race:

- SQLite: one connection per thread (and per process), WAL journal,
  ``BEGIN IMMEDIATE`` for write transactions (the write lock is taken up
  front, so a transaction never fails half-way on an upgrade), plain
  ``BEGIN`` for multi-statement reads; ``SQLITE_BUSY`` / ``locked`` -> retry.
- PostgreSQL: a psycopg_pool ``ConnectionPool`` of autocommit connections,
  with ``synchronous_commit = off`` unless the URL says ``?synchronous=full``
  (``PostgresBackend`` states what each mode keeps on a crash);
  write transactions run ``BEGIN ISOLATION LEVEL SERIALIZABLE``, reads
  ``REPEATABLE READ READ ONLY``; SQLSTATE 40001 (serialization failure) and
  40P01 (deadlock) -> retry.

Retries use exponential backoff with jitter (0.2 ms doubling to 50 ms) and give
up after ``MAX_ATTEMPTS`` with ``MetaUnavailable``. The function is re-run from
scratch, so it must not keep state across attempts other than what it returns.
Modes: ``"write"``, ``"read"`` (consistent snapshot), ``"single"`` (one
read-only statement in autocommit: atomic by itself, no BEGIN/COMMIT round
trips) and ``"autocommit"`` (one writing statement in autocommit).
``"snapshot"`` and ``"committed"`` are writes PostgreSQL runs at
``REPEATABLE READ`` and ``READ COMMITTED`` instead of SERIALIZABLE, for the
operations docs/metadata.md argues safe there (every row read is also
written, or the writes re-check what was read); SQLite runs them as
"write". An operation raises ``TxConflict`` to be run again.

A PostgreSQL connection lost before COMMIT was sent (a server restart, a
killed backend, a stale pooled connection) is harmless: the transaction died
with it, so the operation is retried on a fresh connection; so is one whose
server answered a statement before COMMIT with an error (the pipeline then
skipped the COMMIT). A connection lost with COMMIT in flight and no such
answer, or during an autocommit write, leaves the outcome unknown and
raises ``MetaUnavailable``.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import SplitResult, parse_qsl, quote, urlencode, urlsplit, urlunsplit

from shinglefs.meta import schema
from shinglefs.meta.errors import FsError, MetaUnavailable, MetaURLError, NotFormatted, TxConflict
from shinglefs.meta.schema import Dialect, Rendered

T = TypeVar("T")
Mode = Literal["write", "snapshot", "committed", "read", "single", "autocommit"]
MAX_ATTEMPTS = 200
LOST_CONNECTION_RETRIES = 3
PAGE_SIZE = 1024
WAL_AUTOCHECKPOINT_PAGES = 20000
CHECKPOINT_INTERVAL_S = 0.1
_BACKOFF_FIRST = 0.0002
_BACKOFF_MAX = 0.05

DAMAGED_HINT = ("check that the URL names the file system's meta.db; if it does, the file "
                "is damaged: move it aside (`mv meta.db meta.db.damaged`, and its -wal and "
                "-shm files), then rebuild it in its place from the drives' newest backup "
                "with `shinglefs load --from-drives DRIVE... URL` and `shinglefs fsck "
                "--repair URL` (docs/metadata.md, \"Losing meta.db\")")

# This process's id, kept current across fork: every transaction asks whether
# its connection was made in this process, and ``os.getpid()`` is a system
# call each time (7 of them per small file written through a mount).
_rng = random.SystemRandom()  # not the module's: an application's seeded sequence is its own; fork-safe
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()
    _IN_SQLITE.release()


# Held by the checkpoint thread while it is inside SQLite, and by ``fork()``:
# a thread inside SQLite holds SQLite's own mutexes, and a child forked then
# would wait for them forever (no thread of its own would ever release them).
# The checkpointer is the one thread this module starts by itself, and it runs
# every CHECKPOINT_INTERVAL_S while there are writes.
_IN_SQLITE = threading.Lock()

os.register_at_fork(before=_IN_SQLITE.acquire, after_in_parent=_IN_SQLITE.release,
                    after_in_child=_forked)


def process_id() -> int:
    """``os.getpid()`` without the system call (kept current across fork)."""
    return _pid


class Tx(Protocol):
    """What an operation sees of its transaction: statements written with ``?``.

    ``one``/``all`` return rows and ``run`` the number of rows a write
    touched: each waits for the database's answer. ``put`` is a write whose
    answer the operation does not look at: on PostgreSQL it is sent without
    waiting (pipelined with the statements around it), so its error (a
    constraint, a serialization failure) is raised by the next statement
    that waits, at the latest by the commit — the transaction fails as a
    whole either way. On SQLite ``put`` is ``run``.

    ``need`` is a ``put`` that must touch a row: when it touches none, the
    exception ``fail()`` returns is raised — at once on SQLite, on
    PostgreSQL at the next statement that waits, and before COMMIT is sent in
    any case (``fail`` may itself ask the database).

    ``insert`` is a ``put`` whose constraint violation (a unique key, NOT
    NULL) means the exception ``violated()`` returns -- or, for a NOT NULL
    violation when ``missing`` is given (a value its sub-select did not
    find), the one ``missing()`` returns: raised at once on SQLite; on
    PostgreSQL at the next statement that waits, or by the commit (which the
    violation turned into a rollback). It costs no round trip of its own even
    before COMMIT, unlike ``need``.

    ``later`` is a write whose answer (a ``RETURNING`` row) the operation
    reads only after the commit, with the function it returns: on PostgreSQL
    it is sent without waiting and answered in the same flight as COMMIT, so
    a transaction of ``put``, ``insert`` and ``later`` statements costs one
    round trip. Such a statement must refuse by itself where its effect
    would have to undo the transaction: written inside
    ``{refuse_empty_open}``/``{refuse_empty_close}`` (``Dialect.refuse_empty``),
    it fails where it returns no row, and then the exception ``fail()``
    returns is raised (on PostgreSQL at the next statement that waits, at
    the latest by the commit, which the failure turned into a rollback);
    ``fail`` must not ask the database (the transaction is over). On SQLite
    ``later`` is ``one``, and no row raises ``fail()`` at once."""

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any: ...
    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
    def run(self, sql: str, params: Sequence[Any] = ()) -> int: ...
    def put(self, sql: str, params: Sequence[Any] = ()) -> None: ...
    def need(self, sql: str, params: Sequence[Any], fail: Callable[[], BaseException]) -> None: ...
    def insert(self, sql: str, params: Sequence[Any], violated: Callable[[], BaseException],
               missing: Callable[[], BaseException] | None = None) -> None: ...
    def later(self, sql: str, params: Sequence[Any],
             fail: Callable[[], BaseException]) -> Callable[[], Any]: ...


class Backend(Protocol):
    dialect: Dialect
    durability: str
    where: str

    def run(self, fn: Callable[[Tx], T], mode: Mode) -> T: ...
    def close(self) -> None: ...
    def sync(self) -> None: ...


def backoff(attempt: int) -> None:
    delay = min(_BACKOFF_MAX, _BACKOFF_FIRST * (2 ** min(attempt, 16)))
    time.sleep(delay * (0.5 + _rng.random()))


def gave_up(where: str, exc: BaseException) -> MetaUnavailable:
    return MetaUnavailable(
        f"metadata database {where} stayed busy for {MAX_ATTEMPTS} attempts: {exc}",
        hint="another process holds it locked for too long; check for stuck clients",
    )


# ---- SQLite --------------------------------------------------------------------------


class _SqliteTx:
    __slots__ = ("conn", "rendered")

    def __init__(self, conn: sqlite3.Connection, rendered: Rendered) -> None:
        self.conn = conn
        self.rendered = rendered

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        # fetchall: a RETURNING statement must be stepped to completion.
        rows = self.conn.execute(self.rendered[sql], params).fetchall()
        return rows[0] if rows else None

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.conn.execute(self.rendered[sql], params).fetchall()

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(self.rendered[sql], params).rowcount

    def put(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.conn.execute(self.rendered[sql], params).fetchall()  # RETURNING: run to the end

    def need(self, sql: str, params: Sequence[Any], fail: Callable[[], BaseException]) -> None:
        if not self.conn.execute(self.rendered[sql], params).rowcount:
            raise fail()

    def insert(self, sql: str, params: Sequence[Any], violated: Callable[[], BaseException],
               missing: Callable[[], BaseException] | None = None) -> None:
        try:
            self.conn.execute(self.rendered[sql], params)
        except sqlite3.IntegrityError as exc:
            if missing is not None and str(exc).startswith("NOT NULL"):
                raise missing() from None
            raise violated() from None

    def later(self, sql: str, params: Sequence[Any],
             fail: Callable[[], BaseException]) -> Callable[[], Any]:
        row = self.one(sql, params)
        if row is None:
            raise fail()
        return lambda: row


def _sqlite_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    text = str(exc)
    return "locked" in text or "busy" in text


class SqliteBackend:
    """SQLite in WAL mode; one connection per thread; BEGIN IMMEDIATE writes.

    With ``synchronous=NORMAL`` a commit is written to the WAL, not flushed
    (``sync()`` flushes it); writes in ``"autocommit"`` mode (id batches,
    session heartbeats, server records: rare) are flushed before ``run``
    returns, so an id range is durable before any of its ids names a slice
    or an inode."""

    dialect = schema.SQLITE

    def __init__(self, path: Path, synchronous: str = "NORMAL", busy_timeout_ms: int = 10000):
        if synchronous not in ("NORMAL", "FULL"):
            raise MetaURLError(
                f"synchronous={synchronous.lower()} is not supported",
                hint="use ?synchronous=normal (default) or ?synchronous=full",
            )
        if not path.parent.is_dir():
            raise MetaUnavailable(
                f"directory {path.parent} of the SQLite database does not exist",
                hint=f"create it (mkdir -p {path.parent}) or fix the sqlite3:/// URL",
            )
        self.path = path
        self.where = f"sqlite3://{path}"
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        self.durability = (
            "sqlite WAL, synchronous=NORMAL: a committed transaction survives a crash of "
            "any process; power loss or an OS crash may roll back the last transactions "
            "(never corrupt, never half an operation)"
            if synchronous == "NORMAL"
            else "sqlite WAL, synchronous=FULL: a committed transaction survives process "
            "crashes and power loss (WAL fsync on every commit)"
        )
        self._local = threading.local()
        self._writer = threading.RLock()  # one write transaction at a time in this process
        # (thread, pid, connection): a connection per thread, closed when a new
        # one is opened after its thread ended (FUSE worker threads come and go).
        self._all: list[tuple[threading.Thread, int, sqlite3.Connection]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._dirty = False
        self._ckpt_pid = 0
        self._ckpt_stop = threading.Event()
        self._conn()  # fail now, with a clear error, if the file is unusable

    def _connect(self) -> sqlite3.Connection:
        if self.path != ":memory:" and not os.path.exists(self.path):
            # A new database is its owner's alone (it holds the cluster secret
            # and every file's metadata); SQLite gives its -wal and -shm files
            # the same mode.
            with contextlib.suppress(FileExistsError, FileNotFoundError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=512,
                timeout=self.busy_timeout_ms / 1000,
            )
            conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            # Small pages: a create dirties ~5 pages, and commit cost follows
            # the bytes appended to the WAL (measured: 1 KiB pages ~1.6x the
            # commit rate of 4 KiB ones). Only takes effect on a new file.
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise MetaUnavailable(
                    f"{self.path}: cannot switch the SQLite journal to WAL (got {mode})",
                    hint="put the database on a local file system that supports shared memory",
                )
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            # Checkpoints (which fsync the database file) run in a background
            # thread; a committing writer checkpoints only as a safety net when
            # the WAL has grown past ~20 MiB (20000 pages of 1 KiB).
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
            conn.execute(f"PRAGMA journal_size_limit = {64 * 1024 * 1024}")
            conn.execute("PRAGMA foreign_keys = OFF")
            conn.execute("PRAGMA cache_size = -65536")
            conn.execute("PRAGMA temp_store = MEMORY")
        except sqlite3.DatabaseError as exc:
            damaged = "malformed" in str(exc) or "not a database" in str(exc)
            raise MetaUnavailable(
                f"cannot open SQLite database {self.path}: {exc}",
                hint=DAMAGED_HINT if damaged else "check the path and permissions; the file "
                "must be a SQLite database (or absent, to be created)",
            ) from None
        return conn

    def _conn(self) -> sqlite3.Connection:
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != _pid:
            if self._closed:
                raise MetaUnavailable(f"{self.where} is closed", hint="open the metadata URL again")
            conn = self._connect()
            local.conn = conn
            local.pid = _pid
            with self._lock:
                ended = [c for t, pid, c in self._all if pid == local.pid and not t.is_alive()]
                self._all = [e for e in self._all if e[2] not in ended]
                self._all.append((threading.current_thread(), local.pid, conn))
            for old in ended:
                try:
                    old.close()
                except sqlite3.Error:
                    pass
        return conn

    def run(self, fn: Callable[[Tx], T], mode: Mode) -> T:
        if mode in ("snapshot", "committed"):
            mode = "write"  # one writer at a time: serializable anyway
        if mode == "write":
            # SQLite admits one writer; its busy handler makes a second one
            # *sleep* (1 ms and more) and retry. Between threads of this
            # process a lock hands over at once instead (measured: a create
            # overlapping a slice commit took 1.2 ms instead of 0.13 ms).
            with self._writer:
                return self._run(fn, mode)
        result = self._run(fn, mode)
        if mode == "autocommit" and self.synchronous == "NORMAL":
            # Rare writes (id batches, heartbeats, server records) are made
            # durable before they are used, as on PostgreSQL: ids handed out
            # before a power cut are never handed out again after it (a slice
            # stored under an id whose batch was lost could share its id).
            self.sync()
        return result

    def _run(self, fn: Callable[[Tx], T], mode: Mode) -> T:
        conn = self._conn()
        local_pid = self._local.pid
        tx = _SqliteTx(conn, self.dialect.rendered)
        begin = "BEGIN IMMEDIATE" if mode == "write" else "BEGIN"
        for attempt in range(MAX_ATTEMPTS):
            try:
                if mode in ("single", "autocommit"):
                    return fn(tx)
                conn.execute(begin)
                try:
                    result = fn(tx)
                    conn.execute("COMMIT")
                    if mode == "write":
                        self._dirty = True
                        if self._ckpt_pid != local_pid:
                            self._start_checkpointer()
                    return result
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except TxConflict:
                backoff(attempt)
                continue
            except sqlite3.OperationalError as exc:
                if _sqlite_busy(exc):
                    backoff(attempt)
                    continue
                if "no such table" in str(exc):
                    raise NotFormatted(
                        f"{self.where} holds no ShingleFS file system",
                        hint="format it first: `shinglefs format URL --drive KIND:PATH:SIZE`",
                    ) from None
                if "readonly" in str(exc):  # chattr +i, a read-only mount, no write permission
                    raise MetaUnavailable(
                        f"{self.where}: {exc}",
                        hint="every command writes the metadata (a client's session, the "
                             "WAL), reading ones too: make the file and its directory "
                             "writable for this user") from exc
                raise MetaUnavailable(f"{self.where}: {exc}") from exc
            except sqlite3.IntegrityError as exc:
                raise FsError(17, f"constraint violated in {self.where}: {exc}") from None
            except sqlite3.DatabaseError as exc:
                raise MetaUnavailable(
                    f"{self.where}: {exc}", hint=DAMAGED_HINT
                ) from exc
        raise gave_up(self.where, sqlite3.OperationalError("database is locked"))

    def _start_checkpointer(self) -> None:
        self._ckpt_pid = os.getpid()
        self._ckpt_stop = threading.Event()
        thread = threading.Thread(
            target=self._checkpoint_loop,
            args=(self._ckpt_stop,),
            name="shinglefs-meta-checkpoint",
            daemon=True,
        )
        thread.start()

    def _checkpoint_loop(self, stop: threading.Event) -> None:
        """Fold the WAL into the database every CHECKPOINT_INTERVAL_S after writes.

        PASSIVE: never waits for readers or writers; a checkpoint that cannot
        finish now simply finishes on a later round.
        """
        conn: sqlite3.Connection | None = None
        try:
            while not stop.wait(CHECKPOINT_INTERVAL_S):
                if not self._dirty:
                    continue
                self._dirty = False
                with _IN_SQLITE:  # not while the process forks (see _IN_SQLITE)
                    if conn is None:
                        conn = self._connect()
                    try:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    except sqlite3.Error:
                        self._dirty = True
        except MetaUnavailable:
            return
        finally:
            if conn is not None:
                with _IN_SQLITE:
                    conn.close()

    def sync(self) -> None:
        """fsync the WAL (synchronous=NORMAL commits are written to it, not
        flushed); a checkpoint has already synced whatever it moved out of it."""
        if self.synchronous == "FULL":
            return
        # The durability calls live in zoned/fileio; imported here, not at the
        # top, because importing zoned loads every drive kind (~0.1 s) into
        # processes that only use metadata (the CLI's status, bench meta).
        from shinglefs.zoned.fileio import sync_dir, sync_file

        wal = Path(f"{self.path}-wal")
        try:
            fd = os.open(wal, os.O_RDONLY)
        except FileNotFoundError:  # no WAL: nothing committed since the last checkpoint
            return
        except OSError as exc:
            raise MetaUnavailable(f"{self.where}: cannot open {wal} to sync it: {exc}") from exc
        try:
            sync_file(fd)
        except OSError as exc:
            raise MetaUnavailable(f"{self.where}: fsync of {wal} failed: {exc}") from exc
        finally:
            os.close(fd)
        try:
            sync_dir(str(self.path.parent))
        except OSError as exc:
            raise MetaUnavailable(f"{self.where}: fsync of {self.path.parent} failed: {exc}") from exc

    def close(self) -> None:
        self._closed = True
        self._ckpt_stop.set()
        with self._lock:
            conns, self._all = [c for _t, _owner, c in self._all], []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()


# ---- URLs ------------------------------------------------------------------------------

SQLITE_SCHEMES = ("sqlite3", "sqlite")
"""``sqlite3://`` is the spelling (docs, errors, ``Backend.where``); ``sqlite://``
is accepted as an alias, as it always was."""
PG_SCHEMES = ("postgresql", "postgres")
"""``postgresql://`` is the spelling; ``postgres://`` is accepted as an alias."""


def url_hint(text: object) -> str:
    """The hint for something given where a metadata URL belongs: its exact
    URL when it is the path of a file (``data/meta.db``), else the forms."""
    if isinstance(text, str) and os.path.isfile(text):
        return f"a SQLite file's URL is sqlite3://{os.path.abspath(text)}"
    return "use sqlite3:///abs/path/meta.db or postgresql://user@host:port/db"


def split_meta_url(url: str) -> SplitResult:
    """``urlsplit(url)`` with its port parsed; ``MetaURLError`` (exit 2) for a port
    out of range or not a number, or a bracketed host left open (urllib's bare
    ``ValueError`` reached users as a traceback)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- parsed here, where a bad one can be named
    except ValueError as exc:
        raise MetaURLError(f"bad metadata URL {url!r}: {exc}",
                           hint="e.g. postgresql://user@host:5432/dbname or "
                                "sqlite3:///abs/path/meta.db") from None
    return parts


def backend_from_url(url: str, **options: Any) -> Backend:
    """Parse a metadata URL and connect. Raises MetaURLError / MetaUnavailable."""
    if not isinstance(url, str) or "://" not in url:
        raise MetaURLError(f"not a metadata URL: {url!r}", hint=url_hint(url))
    parts = split_meta_url(url)
    scheme = parts.scheme.lower()
    query = dict(parse_qsl(parts.query))
    if scheme in SQLITE_SCHEMES:
        if parts.netloc or not parts.path.startswith("/"):
            raise MetaURLError(
                f"SQLite URL {url!r} must name an absolute path",
                hint="write three slashes: sqlite3:///abs/path/meta.db",
            )
        sync = str(options.pop("synchronous", query.pop("synchronous", "normal"))).upper()
        unknown = set(query) | set(options)
        if unknown:
            raise MetaURLError(
                f"unknown SQLite option(s) {sorted(unknown)} in {url!r}",
                hint="the only option is ?synchronous=normal|full",
            )
        return SqliteBackend(Path(parts.path), synchronous=sync)
    if scheme in PG_SCHEMES:
        try:
            pool_max = int(options.pop("pool_max", query.pop("pool_max", 8)))
        except ValueError:
            raise MetaURLError(
                f"pool_max in {url!r} is not an integer", hint="e.g. ?pool_max=8"
            ) from None
        sync = str(options.pop("synchronous", query.pop("synchronous", "normal"))).upper()
        if options:
            raise MetaURLError(
                f"unknown PostgreSQL option(s) {sorted(options)}",
                hint="options: synchronous=normal|full, pool_max=N",
            )
        if not parts.path.strip("/"):
            raise MetaURLError(
                f"PostgreSQL URL {url!r} names no database",
                hint="postgresql://user@host:port/dbname",
            )
        # Other query parameters (sslmode, options, ...) are libpq's: passed on.
        clean = urlunsplit(
            ("postgresql", parts.netloc, parts.path, urlencode(query, quote_via=quote), "")
        )
        from shinglefs.meta.pgbackend import PostgresBackend  # (it imports this module)

        return PostgresBackend(clean, pool_max=pool_max, synchronous=sync)
    raise MetaURLError(
        f"unknown metadata backend {parts.scheme!r} in {url!r}",
        hint="expected sqlite3:///abs/path/meta.db or postgresql://user@host:port/db",
    )
