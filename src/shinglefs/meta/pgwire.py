"""One PostgreSQL transaction pipelined on libpq, under psycopg's connection.

Why not psycopg's cursors: on the test VM a cursor's ``execute`` costs 75-90
us of client CPU per statement (its Python layers: query conversion, the
prepared-statement manager, generators) and a pipelined 9-statement
transaction ~590 us; the same transaction sent through psycopg's own libpq
binding (``psycopg.pq.PGconn``) costs ~70 us of CPU and ~240 us of wall time
(docs/metadata.md, "Round trips to PostgreSQL"). A small file costs ~17
statements, so this is the difference between ~200 and
well over 500 files/s for one client. psycopg still owns everything else:
the pool, connecting, ``sync()``, errors (its exception classes, looked up by
SQLSTATE), and row loading (its ``Transformer``, in C).

How a transaction runs (``PipelinedTx``): the connection enters libpq's
pipeline mode; BEGIN, every ``put``, ``insert`` and ``later`` and COMMIT are
queued without waiting (a ``later`` statement's answer is read at the end);
a statement whose answer is needed (``one``, ``all``, ``run``) is followed
by a flush request and waits for the answers up to its own (each earlier
answer is checked: the first error is raised there). COMMIT is followed by a
sync point; ``finish`` waits for everything. Statements are prepared once
per connection (named ``sfs_N``, by text and parameter types) in the same
pipeline as their first execution. Parameters go as text (numbers, strings)
or binary (bytes); results come back binary.

Waiting releases the GIL (``poll`` on the socket; the connection is in
libpq's non-blocking mode, as psycopg leaves it), so other threads run while
a statement is on the wire.

Contract: a method raises psycopg's exception for the SQLSTATE the server
sent (``psycopg.errors.lookup``), or ``psycopg.OperationalError`` when the
connection broke; after any exception the caller calls ``abandon``, which
brings the connection back to idle or closes it (the pool then replaces it).
"""

from __future__ import annotations

import select
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import Transformer

# What the connection will answer, in order (PipelinedTx._pending):
_IGNORE = 0  # an answer nobody looks at (BEGIN, put, COMMIT): checked for errors
_WANT = 1  # the answer of the statement being waited for
_PREPARE = 2  # a statement being prepared: forgotten again if that fails
_NEED = 3  # a write that must touch a row (``need``)
_SYNC = 4  # a sync point: the end of an (implicit) transaction's messages
_INSERT = 5  # a write whose constraint violation is the operation's error (``insert``)
_LATER = 6  # a write answered by the end (``later``): its rows go to a box

_INT8, _BYTEA, _BOOL, _FLOAT8, _UNKNOWN = 20, 17, 16, 701, 0
_WAIT_MS = 1000  # poll() timeout: a wait stays interruptible
PREPARED_MAX = 1024
"""Statements prepared per connection at most; past it (statements built with
values in their text) they go unnamed, parsed on each execution."""

_OK = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK, pq.ExecStatus.EMPTY_QUERY)


def dollar_placeholders(sql: str) -> bytes:
    """psycopg's ``%s`` placeholders as libpq's ``$1``, ``$2``...; ``%%`` as ``%``."""
    out: list[str] = []
    n = 0
    i = 0
    while True:
        j = sql.find("%", i)
        if j < 0:
            out.append(sql[i:])
            break
        out.append(sql[i:j])
        nxt = sql[j + 1:j + 2]
        if nxt == "s":
            n += 1
            out.append(f"${n}")
        elif nxt == "%":
            out.append("%")
        else:
            raise ValueError(f"unexpected % in statement {sql!r}")
        i = j + 2
    return "".join(out).encode()


def _violation(res: pq.abc.PGresult) -> bool:
    """Whether ``res`` is an integrity constraint violation (SQLSTATE class 23)."""
    if res.status != pq.ExecStatus.FATAL_ERROR:
        return False
    sqlstate = res.error_field(pq.DiagnosticField.SQLSTATE)
    return sqlstate is not None and sqlstate.startswith(b"23")


def _not_null(res: pq.abc.PGresult) -> bool:
    """Whether ``res`` is a NOT NULL violation (SQLSTATE 23502)."""
    return res.error_field(pq.DiagnosticField.SQLSTATE) == b"23502"


def _refused(res: pq.abc.PGresult) -> bool:
    """Whether ``res`` is a ``later`` statement's refusal (``division_by_zero``,
    how ``Dialect.refuse_empty`` says that it found no row)."""
    return res.status == pq.ExecStatus.FATAL_ERROR and (
        res.error_field(pq.DiagnosticField.SQLSTATE) == b"22012")


class _Box:
    """Where a ``later`` statement's answer lands when it is read."""

    __slots__ = ("fail", "rows")

    def __init__(self, fail: Callable[[], BaseException]) -> None:
        self.fail = fail
        self.rows: list[Any] | None = None

    def row(self) -> Any:
        """The statement's first row (None for none); only once answered."""
        if self.rows is None:
            raise RuntimeError("a later statement's row is read before its transaction ended")
        return self.rows[0] if self.rows else None


def _param(value: Any) -> tuple[bytes | None, int, int]:
    """(wire bytes, type oid, format) of one parameter."""
    if value is None:
        return None, _UNKNOWN, 0
    if isinstance(value, bool):
        return (b"t" if value else b"f"), _BOOL, 0
    if isinstance(value, int):
        return str(value).encode(), _INT8, 0
    if isinstance(value, str):
        return value.encode(), _UNKNOWN, 0
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), _BYTEA, 1
    if isinstance(value, float):
        return repr(value).encode(), _FLOAT8, 0
    raise TypeError(f"cannot send a {type(value).__name__} to PostgreSQL")


class Prepared:
    """The statements prepared on one connection: (text, types) -> name.
    ``rendered``: the dialect's rendering of the engine's ``?`` statements."""

    __slots__ = ("count", "names", "rendered", "texts")

    def __init__(self, rendered: Mapping[str, str]) -> None:
        self.rendered = rendered
        self.names: dict[tuple[str, tuple[int, ...]], bytes] = {}
        self.texts: dict[str, bytes] = {}
        self.count = 0  # names handed out (a failed PREPARE's name is not reused)

    def text(self, sql: str) -> bytes:
        """The statement as libpq takes it."""
        text = self.texts.get(sql)
        if text is None:
            text = self.texts[sql] = dollar_placeholders(self.rendered[sql])
        return text


class PipelinedTx:
    """One transaction on ``conn`` (idle, non-blocking), begun with ``begin``;
    or, when ``begin`` is None, statements each in its own implicit
    transaction (autocommit: each waiting statement ends with a sync point)."""

    __slots__ = ("_answered_error", "_autocommit", "_commit_sent", "_fd", "_pending", "_pg",
                 "_poll", "_prepared", "_rows", "_unsynced")

    def __init__(self, conn: psycopg.Connection[Any], prepared: Prepared,
                 begin: str | None) -> None:
        self._pg = conn.pgconn
        self._fd = self._pg.socket
        # poll, not select: a process with over 1024 descriptors open is common
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        self._prepared = prepared
        self._rows = Transformer(conn)
        self._pending: deque[tuple[int, Any]] = deque()  # (kind, prepared key or need's error)
        self._autocommit = begin is None
        self._unsynced = False  # sent something since the last sync point
        self._commit_sent = False
        self._answered_error = False  # the server answered a statement with an error
        self._pg.enter_pipeline_mode()
        if begin is not None:
            self._pg.send_query_params(begin.encode(), None)
            self._pending.append((_IGNORE, None))
            self._unsynced = True

    # ---- the Tx protocol -------------------------------------------------------------------

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self._rows_of(self._ask(sql, params))
        return rows[0] if rows else None

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._rows_of(self._ask(sql, params))

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self._ask(sql, params).command_tuples or 0)

    def put(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._send(sql, params)
        self._pending.append((_IGNORE, None))

    def need(self, sql: str, params: Sequence[Any], fail: Callable[[], BaseException]) -> None:
        self._send(sql, params)
        self._pending.append((_NEED, fail))

    def insert(self, sql: str, params: Sequence[Any], violated: Callable[[], BaseException],
               missing: Callable[[], BaseException] | None = None) -> None:
        self._send(sql, params)
        self._pending.append((_INSERT, (violated, missing)))

    def later(self, sql: str, params: Sequence[Any],
             fail: Callable[[], BaseException]) -> Callable[[], Any]:
        box = _Box(fail)
        self._send(sql, params)
        self._pending.append((_LATER, box))
        return box.row

    # ---- ending ----------------------------------------------------------------------------

    def finish(self, commit: bool) -> None:
        """Send COMMIT (``commit``) and wait for every answer: raises the first
        error among them (a ``need`` is settled before COMMIT is sent).
        Leaves pipeline mode."""
        pg = self._pg
        if any(kind == _NEED for kind, _ in self._pending):
            pg.send_flush_request()
            self._flush()
            self._drain()
        if commit:
            pg.send_query_params(b"COMMIT", None)
            self._pending.append((_IGNORE, None))
            self._unsynced = True
            self._commit_sent = True
        if self._unsynced:
            self._sync()
            self._flush()
            self._drain()
        pg.exit_pipeline_mode()

    @property
    def commit_in_doubt(self) -> bool:
        """COMMIT was sent and no answer says the transaction failed: after a
        lost connection it may or may not have committed. (An error answer
        to any statement means it did not: the pipeline skips what follows
        an error up to the sync point, COMMIT included.)"""
        return self._commit_sent and not self._answered_error

    def abandon(self, conn: psycopg.Connection[Any]) -> None:
        """After an exception: roll back, read what is left, leave pipeline
        mode. Closes ``conn`` when that fails (the pool replaces it)."""
        pg = self._pg
        try:
            if pg.pipeline_status != pq.PipelineStatus.OFF:
                if not self._autocommit and self._unsynced:
                    pg.send_query_params(b"ROLLBACK", None)
                    self._pending.append((_IGNORE, None))
                if self._unsynced:
                    self._sync()
                self._flush()
                self._drain_quietly()
                pg.exit_pipeline_mode()
            if pg.transaction_status != pq.TransactionStatus.IDLE:
                # the ROLLBACK above was skipped: the pipeline had failed before it
                pg.send_query_params(b"ROLLBACK", None)
                self._flush()
                self._check(self._result())
            if pg.transaction_status != pq.TransactionStatus.IDLE:
                raise psycopg.OperationalError("connection not idle after ROLLBACK")
        except Exception:
            conn.close()

    # ---- sending and reading ---------------------------------------------------------------

    def _send(self, sql: str, params: Sequence[Any]) -> None:
        values: list[bytes | None] = []
        types: list[int] = []
        formats: list[int] = []
        for value in params:
            v, t, f = _param(value)
            values.append(v)
            types.append(t)
            formats.append(f)
        key = (sql, tuple(types))
        prepared = self._prepared
        name = prepared.names.get(key)
        self._unsynced = True
        if name is None:
            if len(prepared.names) >= PREPARED_MAX:
                self._pg.send_query_params(prepared.text(sql), values, types, formats, 1)
                return
            name = prepared.names[key] = b"sfs_%d" % prepared.count
            prepared.count += 1
            self._pg.send_prepare(name, prepared.text(sql), types)
            self._pending.append((_PREPARE, key))
        self._pg.send_query_prepared(name, values, formats, 1)

    def _sync(self) -> None:
        self._pg.pipeline_sync()
        self._pending.append((_SYNC, None))
        self._unsynced = False

    def _ask(self, sql: str, params: Sequence[Any]) -> pq.abc.PGresult:
        """Send one statement and wait for its answer (and every one before it)."""
        self._send(sql, params)
        self._pending.append((_WANT, None))
        if self._autocommit:
            self._sync()
        else:
            self._pg.send_flush_request()
        self._flush()
        res = self._drain()
        assert res is not None
        return res

    def _drain(self) -> pq.abc.PGresult | None:
        """Read every answer due (all were flushed); the last wanted one."""
        wanted = None
        while self._pending:
            kind, extra = self._pending.popleft()
            res = self._read(kind, extra)
            if kind == _SYNC:
                continue
            if kind == _LATER and res is not None and _refused(res):
                self._answered_error = True
                self._drain_quietly()
                raise extra.fail()
            if kind == _INSERT and res is not None and _violation(res):
                self._answered_error = True
                self._drain_quietly()
                violated, missing = extra
                if missing is not None and _not_null(res):
                    raise missing()
                raise violated()
            self._check(res)
            assert res is not None
            if kind == _WANT:
                wanted = res
            elif kind == _LATER:
                extra.rows = self._rows_of(res)
            elif kind == _NEED and not int(res.command_tuples or 0):
                self._drain()  # the rest first: ``fail`` may ask the database
                raise extra()
        return wanted

    def _drain_quietly(self) -> None:
        """Read the answers due after a failed statement (aborted, all of them)."""
        while self._pending:
            self._read(*self._pending.popleft())

    def _read(self, kind: int, extra: Any) -> pq.abc.PGresult | None:
        """Read the next answer, of a ``kind`` statement; forget a statement
        whose PREPARE failed or was skipped (its name was never created)."""
        if kind == _SYNC:
            self._sync_point()
            return None
        res = self._result()
        if kind == _PREPARE and (res is None or res.status not in _OK):
            self._prepared.names.pop(extra, None)
        return res

    def _rows_of(self, res: pq.abc.PGresult) -> list[Any]:
        self._rows.set_pgresult(res)
        return self._rows.load_rows(0, res.ntuples, tuple)

    def _result(self) -> pq.abc.PGresult | None:
        """The next statement's result (its terminating NULL read too)."""
        res = self._next()
        if res is not None and res.status != pq.ExecStatus.PIPELINE_SYNC:
            while self._next() is not None:  # one statement, one result here
                pass
        return res

    def _sync_point(self) -> None:
        res = self._next()
        if res is None or res.status != pq.ExecStatus.PIPELINE_SYNC:
            raise psycopg.OperationalError("pipeline out of step: no sync point where one was due")

    def _next(self) -> pq.abc.PGresult | None:
        pg = self._pg
        while pg.is_busy():
            self._poll.poll(_WAIT_MS)
            pg.consume_input()
        return pg.get_result()

    def _flush(self) -> None:
        pg = self._pg
        if pg.flush():  # the socket's buffer is full: wait for room (reading meanwhile)
            both = select.poll()
            both.register(self._fd, select.POLLIN | select.POLLOUT)
            while pg.flush():
                both.poll(_WAIT_MS)
                pg.consume_input()

    def _check(self, res: pq.abc.PGresult | None) -> None:
        if res is None:
            if self._pg.status == pq.ConnStatus.BAD:
                raise psycopg.OperationalError("consuming input failed: the connection is lost")
            raise psycopg.OperationalError("pipeline out of step: no answer where one was due")
        status = res.status
        if status in _OK:
            return
        if status == pq.ExecStatus.PIPELINE_ABORTED:
            return  # an earlier statement's error was raised already
        self._answered_error = True
        sqlstate = res.error_field(pq.DiagnosticField.SQLSTATE)
        message = (res.error_message or b"").decode(errors="replace").strip()
        if sqlstate is None:
            raise psycopg.OperationalError(message or "the connection is lost")
        raise psycopg.errors.lookup(sqlstate.decode())(message)
