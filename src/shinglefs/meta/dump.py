"""Metadata dump and load: JSON lines, streaming, from any backend to any backend.

A dump is one consistent snapshot (one read transaction) of every table,
read in pages of ``PAGE_ROWS`` by primary key (keyset pagination: memory
stays bounded whatever the database size) and written as lines::

    {"shinglefs_dump": 1, "schema_version": 2, "source": ..., "created_ns": ...}
    {"table": "inodes", "columns": ["ino", "mode", ...]}
    [1, 16877, 0, ...]                      one JSON array per row
    {"end": "inodes", "rows": 1234}
    ...                                     every table; ``format`` last
    {"complete": true, "rows": {"inodes": 1234, ...}}

Byte columns (names, xattr values, symlink targets) are ``{"b64": "..."}``.
A file whose first bytes are gzip's magic is read (and, named ``*.gz``,
written) compressed.

``load`` fills an empty database: it creates the schema, inserts each table
in transactions of ``PAGE_ROWS`` rows and inserts the ``format`` row only
after the whole dump was read and its trailer seen, so an interrupted load
never looks like a file system (it is refused by the next ``load`` as a
database holding data; drop it and load again).

Sessions and their open files are not dumped: they are the state of the
processes using the source database, and a loaded copy must not look in use
by them. An inode that was unlinked while open at dump time (nlink 0) is
then held by nobody: ``shinglefs fsck --repair`` frees it.

The columns come from the schema's DDL (``schema.DDL``), so a column added
there is dumped without touching this module.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO

from shinglefs.errors import ShingleError
from shinglefs.meta import schema as S
from shinglefs.meta.api import MetaStore
from shinglefs.meta.backend import Backend, Tx, backend_from_url
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.errors import AlreadyFormatted

DUMP_FORMAT = 1
PAGE_ROWS = 2000
GZIP_MAGIC = b"\x1f\x8b"
RUNTIME_TABLES = frozenset({"sessions", "open_files"})  # not dumped (see above)
Progress = Callable[[str, int], None]  # (table, rows so far)


class DumpError(ShingleError):
    """A dump that cannot be loaded: not a dump, another schema, cut short, or damaged."""

    exit_code = 3


class LoadTargetNotEmpty(ShingleError):
    """``load`` into a database that already holds (partial) metadata."""

    exit_code = 3


@dataclass(frozen=True, slots=True)
class TableShape:
    """A table as the dump sees it: its columns in order and its primary key."""

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    blobs: frozenset[str] = field(default_factory=frozenset)


_CREATE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)", re.S)


def table_shapes() -> list[TableShape]:
    """Every table of ``schema.DDL``, ``format`` last (see the module docstring)."""
    shapes: dict[str, TableShape] = {}
    for ddl in S.DDL:
        m = _CREATE.search(ddl)
        if m is None:
            continue
        name, body = m.group(1), m.group(2)
        cols: list[str] = []
        key: tuple[str, ...] = ()
        blobs = set()
        for line in (part.strip() for part in body.split(",\n")):
            if line.startswith("PRIMARY KEY"):
                key = tuple(c.strip() for c in line[line.index("(") + 1 : line.index(")")].split(","))
                continue
            col = line.split()[0]
            cols.append(col)
            if "{blob}" in line:
                blobs.add(col)
            if "PRIMARY KEY" in line:
                key = (col,)
        shapes[name] = TableShape(name, tuple(cols), key, frozenset(blobs))
    order = [t for t in S.TABLES
             if t != "format" and t in shapes and t not in RUNTIME_TABLES] + ["format"]
    return [shapes[t] for t in order]


def backend_of(store: MetaStore) -> Backend:
    """The backend under an opened store (``SqlMetaStore.backend``); TypeError
    for a store that is not the SQL engine."""
    if not isinstance(store, SqlMetaStore):
        raise TypeError(f"{type(store).__name__} is not an SQL metadata store")
    return store.backend


# ---- dump ---------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"b64": base64.b64encode(bytes(value)).decode()}
    return value


def _pages(tx: Tx, shape: TableShape) -> Iterator[list[Any]]:
    cols = ", ".join(shape.columns)
    keys = ", ".join(shape.key)
    key_at = [shape.columns.index(k) for k in shape.key]
    first = f"SELECT {cols} FROM {shape.name} ORDER BY {keys} LIMIT {PAGE_ROWS}"
    marks = ", ".join("?" * len(shape.key))
    after = (f"SELECT {cols} FROM {shape.name} WHERE ({keys}) > ({marks}) "
             f"ORDER BY {keys} LIMIT {PAGE_ROWS}")
    rows = tx.all(first)
    while rows:
        yield rows
        if len(rows) < PAGE_ROWS:
            return
        rows = tx.all(after, [rows[-1][i] for i in key_at])


def _write_line(out: IO[bytes], obj: Any) -> None:
    out.write(json.dumps(obj, separators=(",", ":")).encode())
    out.write(b"\n")


def dump_backend(backend: Backend, out: BinaryIO, progress: Progress | None = None) -> dict[str, int]:
    """Write a dump of ``backend`` to ``out`` (a seekable binary file); returns rows per table.

    One read transaction: the dump is a consistent snapshot. ``out`` is
    rewritten from its start if the transaction is retried.
    """
    start = out.tell()

    def txn(tx: Tx) -> dict[str, int]:
        out.seek(start)
        out.truncate()
        if tx.one(S.SEL_FORMAT) is None:
            raise DumpError(f"{backend.where} holds no file system to dump")
        _write_line(out, {"shinglefs_dump": DUMP_FORMAT, "schema_version": S.SCHEMA_VERSION,
                          "source": backend.where, "created_ns": time.time_ns()})
        counts: dict[str, int] = {}
        for shape in table_shapes():
            _write_line(out, {"table": shape.name, "columns": list(shape.columns)})
            n = 0
            for page in _pages(tx, shape):
                for row in page:
                    _write_line(out, [_encode(v) for v in row])
                n += len(page)
                if progress is not None:
                    progress(shape.name, n)
            _write_line(out, {"end": shape.name, "rows": n})
            counts[shape.name] = n
        _write_line(out, {"complete": True, "rows": counts})
        return counts

    return backend.run(txn, "read")


def dump_url(url: str, path: str, progress: Progress | None = None) -> dict[str, int]:
    """Dump the metadata at ``url`` into the file ``path`` (gzip when it ends in ``.gz``).

    A regular file is written beside ``path`` and renamed over it once complete:
    a failed dump (nothing to dump, a lost connection, a full disk) leaves no
    file, or the previous one untouched. Anything else (``/dev/stdout``, a
    pipe) is written in place."""
    in_place = os.path.exists(path) and not os.path.isfile(path)
    target = path if in_place else f"{path}.partial-{os.getpid()}"
    backend = backend_from_url(url)
    try:
        with open(target, "wb") as raw:
            counts = _dump_into(backend, raw, gz=path.endswith(".gz"), progress=progress)
        if not in_place:
            os.replace(target, path)
        return counts
    except BaseException:
        if not in_place:
            with contextlib.suppress(OSError):
                os.unlink(target)
        raise
    finally:
        backend.close()


def _dump_into(backend: Backend, raw: BinaryIO, *, gz: bool,
               progress: Progress | None) -> dict[str, int]:
    if not gz:
        return dump_backend(backend, raw, progress)
    # A gzip stream cannot be rewound for a retried transaction: dump to a
    # temporary file first, then compress it.
    with tempfile.TemporaryFile() as tmp, gzip.GzipFile(fileobj=raw, mode="wb") as out:
        counts = dump_backend(backend, tmp, progress)
        tmp.seek(0)
        while chunk := tmp.read(1 << 20):
            out.write(chunk)
        return counts


# ---- load ---------------------------------------------------------------------------


def open_dump(path: str) -> IO[bytes]:
    """A dump file for reading, decompressed if it is gzip; ``DumpError`` when it
    cannot be opened."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller
    except OSError as exc:
        raise DumpError(f"cannot read the dump {path}: {exc.strerror}",
                        hint="give the file `shinglefs dump META_URL FILE` wrote") from None
    if raw.read(2) == GZIP_MAGIC:
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    raw.seek(0)
    return raw


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        return base64.b64decode(value["b64"])
    return value


def _check_empty(backend: Backend) -> None:
    for ddl in S.DDL:
        def create(tx: Tx, ddl: str = ddl) -> None:
            tx.run(ddl)

        backend.run(create, "autocommit")

    def occupied(tx: Tx) -> list[str]:
        return [t.name for t in table_shapes() if tx.one(f"SELECT 1 FROM {t.name} LIMIT 1")]

    tables = backend.run(occupied, "read")
    if "format" in tables:
        raise AlreadyFormatted(f"{backend.where} already holds a file system",
                               hint="load into a fresh, empty database")
    if tables:
        raise LoadTargetNotEmpty(
            f"{backend.where} already holds rows in {', '.join(tables)} (an interrupted load?)",
            hint="load into a fresh, empty database")


def _insert(backend: Backend, shape: TableShape, rows: list[list[Any]]) -> None:
    sql = (f"INSERT INTO {shape.name} ({', '.join(shape.columns)}) "
           f"VALUES ({', '.join('?' * len(shape.columns))})")

    def txn(tx: Tx) -> None:
        for row in rows:
            tx.run(sql, row)

    backend.run(txn, "write")


def _header(line: bytes) -> dict[str, Any]:
    try:
        head = json.loads(line)
    except ValueError:
        head = None
    if not isinstance(head, dict) or head.get("shinglefs_dump") != DUMP_FORMAT:
        raise DumpError("not a ShingleFS metadata dump (bad first line)",
                        hint="pass a file written by `shinglefs dump`")
    if head.get("schema_version") != S.SCHEMA_VERSION:
        raise DumpError(f"the dump holds schema version {head.get('schema_version')}; this "
                        f"shinglefs speaks version {S.SCHEMA_VERSION}",
                        hint="load it with the shinglefs release that wrote it")
    return head


def load_backend(source: IO[bytes], backend: Backend,
                 progress: Progress | None = None) -> dict[str, int]:
    """Load a dump into the empty database behind ``backend``; returns rows per table."""
    _header(source.readline())
    _check_empty(backend)
    shapes = {s.name: s for s in table_shapes()}
    counts: dict[str, int] = {}
    deferred: tuple[TableShape, list[list[Any]]] | None = None
    shape: TableShape | None = None
    batch: list[list[Any]] = []
    for number, line in enumerate(source, start=2):
        try:
            item = json.loads(line)
        except ValueError:
            raise DumpError(f"line {number} of the dump is not JSON (damaged file)") from None
        if isinstance(item, list):
            if shape is None or len(item) != len(shape.columns):
                raise DumpError(f"line {number}: a row outside a table or of the wrong width")
            batch.append([_decode(v) for v in item])
            if len(batch) >= PAGE_ROWS and shape.name != "format":
                _insert(backend, shape, batch)
                counts[shape.name] = counts.get(shape.name, 0) + len(batch)
                batch = []
                if progress is not None:
                    progress(shape.name, counts[shape.name])
        elif "table" in item:
            shape = shapes.get(item["table"])
            if shape is None or tuple(item["columns"]) != shape.columns:
                raise DumpError(f"line {number}: table {item['table']!r} does not match this "
                                "schema", hint="load it with the release that wrote it")
        elif "end" in item and shape is not None:
            if shape.name == "format":
                deferred = (shape, batch)
            elif batch:
                _insert(backend, shape, batch)
            counts[shape.name] = counts.get(shape.name, 0) + len(batch)
            if counts[shape.name] != item["rows"]:
                raise DumpError(f"table {shape.name}: {counts[shape.name]} rows, the dump says "
                                f"{item['rows']}")
            batch, shape = [], None
        elif item.get("complete"):
            if deferred is None:
                raise DumpError("the dump has no format record")
            _insert(backend, *deferred)
            return counts
    raise DumpError("the dump ends before its trailer (cut short)",
                    hint="use a complete dump; the target now holds partial rows: drop it")


def load_url(path: str, url: str, progress: Progress | None = None) -> dict[str, int]:
    """Load the dump file ``path`` into the empty database at ``url`` (opened only
    once the dump could be: a missing dump creates no database)."""
    with open_dump(path) as source:
        backend = backend_from_url(url)
        try:
            return load_backend(source, backend, progress)
        finally:
            backend.close()
