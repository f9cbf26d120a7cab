"""Metadata dump and load: JSON lines, streaming, from any backend to any backend.

A dump is one consistent snapshot (one read transaction) of every table,
read in pages of ``PAGE_ROWS`` by primary key (keyset pagination: memory
stays bounded whatever the database size) and written as lines::

    {"shinglefs_dump": 1, "schema_version": 2, "source": ..., "created_ns": ...}
    {"table": "inodes", "columns": ["ino", "mode", ...]}
    [1, 16877, 0, ...]                      one JSON array per row
    {"end": "inodes", "rows": 1234, "sha256": "..."}
    ...                                     every table; ``format`` last
    {"complete": true, "rows": {"inodes": 1234, ...}}

Byte columns (names, xattr values, symlink targets) are ``{"b64": "..."}``.
An ``end`` record's ``sha256`` covers the bytes of its table's lines, from
its ``table`` line through its last row (dumps written before it have none,
and load without that check). A file whose first bytes are gzip's magic is
read (and, named ``*.gz``, written) compressed.

Where a dump goes (``dump_url``): symlinks are followed. The command's own
standard output, a pipe, a FIFO, a character device or a socket is written in
place, as a stream (never seeked, truncated or renamed). A new file is
written as a temporary file beside it (mode 0600: a dump holds the cluster
secret) and linked into place once complete, so a failed dump leaves no
file. A file already there is never overwritten (``PathError``).

``load`` checks that a file is a complete dump before it writes a row: every
table of the format present once, each with as many rows as its ``end``
record and the trailer say, every line a well-formed record, each table's
checksum when present (a file that cannot be read twice, a pipe, is checked
as it is loaded). It then creates the schema in an empty database, inserts
each table in transactions of ``PAGE_ROWS`` rows, and inserts the ``format``
row only after the whole dump was read and its trailer seen, so a load that
stopped half-way (a crash, a row the database refuses) never looks like a
file system and is refused by the next ``load`` as a database holding data:
load into a new database then.

Sessions and their open files are not dumped: they are the state of the
processes using the source database, and a loaded copy must not look in use
by them. An inode that was unlinked while open at dump time (nlink 0) is
then held by nobody: ``shinglefs fsck --repair`` frees it.

The columns come from the schema's DDL (``schema.DDL``), so a column added
there is dumped without touching this module.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import gzip
import hashlib
import json
import os
import re
import stat
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO

from shinglefs.errors import PathError, ShingleError
from shinglefs.meta import schema as S
from shinglefs.meta.api import MetaStore
from shinglefs.meta.backend import Backend, Tx, backend_from_url
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.errors import AlreadyFormatted, FsError

DUMP_FORMAT = 1
PAGE_ROWS = 2000
GZIP_MAGIC = b"\x1f\x8b"
RUNTIME_TABLES = frozenset({"sessions", "open_files"})  # not dumped (see above)
Progress = Callable[[str, int], None]  # (table, rows so far)
Insert = Callable[["TableShape", list[list[Any]], int], None]  # (table, rows, first line)
NEW_TARGET = ("load the dump into a new, empty database: "
              "`shinglefs load FILE NEW_META_URL`")


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


def _line(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def dump_backend(backend: Backend, out: BinaryIO, progress: Progress | None = None) -> dict[str, int]:
    """Write a dump of ``backend`` to ``out``; returns rows per table.

    One read transaction: the dump is a consistent snapshot. If the transaction
    is retried, a seekable ``out`` is rewritten from where it started; a stream
    (a pipe) is never seeked: a retry after part of the dump went into it is a
    ``DumpError`` instead of a second copy behind the first.
    """
    rewind = out.seekable()
    start = out.tell() if rewind else 0
    written = 0

    def write(line: bytes) -> None:
        nonlocal written
        out.write(line)
        written += len(line)

    def txn(tx: Tx) -> dict[str, int]:
        nonlocal written
        if written:
            if not rewind:
                raise DumpError(f"reading {backend.where} was retried after part of the dump "
                                "was streamed out; the stream holds no complete dump",
                                hint="dump into a file: `shinglefs dump META_URL FILE`")
            out.seek(start)
            out.truncate()
            written = 0
        if tx.one(S.SEL_FORMAT) is None:
            raise DumpError(f"{backend.where} holds no file system to dump")
        write(_line({"shinglefs_dump": DUMP_FORMAT, "schema_version": S.SCHEMA_VERSION,
                     "source": backend.where, "created_ns": time.time_ns()}))
        counts: dict[str, int] = {}
        for shape in table_shapes():
            line = _line({"table": shape.name, "columns": list(shape.columns)})
            digest = hashlib.sha256(line)
            write(line)
            n = 0
            for page in _pages(tx, shape):
                for row in page:
                    line = _line([_encode(v) for v in row])
                    digest.update(line)
                    write(line)
                n += len(page)
                if progress is not None:
                    progress(shape.name, n)
            write(_line({"end": shape.name, "rows": n, "sha256": digest.hexdigest()}))
            counts[shape.name] = n
        write(_line({"complete": True, "rows": counts}))
        return counts

    return backend.run(txn, "read")


def dump_url(url: str, path: str, progress: Progress | None = None) -> dict[str, int]:
    """Dump the metadata at ``url`` into ``path`` (gzip when it ends in ``.gz``).

    Symlinks are followed. This command's own standard output, a pipe, a
    FIFO, a character device or a socket is written in place, as a stream. A
    new file is written beside itself (mode 0600) and linked into place once
    complete: a failed dump (nothing to dump, a lost connection, a full disk)
    leaves no file. ``PathError`` (nothing written) for a file already there
    (never overwritten), a directory, a block device, or a directory that is
    missing or not writable.
    """
    stream = _stream(path)
    if stream is None:
        return _dump_new_file(url, path, progress)
    backend = backend_from_url(url)
    try:
        with stream:
            return _dump_into(backend, stream, gz=path.endswith(".gz"), progress=progress)
    except BrokenPipeError:
        raise PathError(f"{path} was closed by its reader before the dump was complete",
                        hint="let the reader take the whole dump, or write a file: "
                             "`shinglefs dump META_URL FILE`") from None
    except OSError as exc:
        raise PathError(f"cannot write the dump to {path}: {exc.strerror or exc}",
                        hint="write a file instead: `shinglefs dump META_URL FILE`") from None
    finally:
        backend.close()


def _stream(path: str) -> BinaryIO | None:
    """``path`` opened for writing in place when it is a stream; None when nothing
    is there (a new file, or the target of a dangling link); ``PathError`` for
    what a dump must not be written to."""
    try:
        st = os.stat(path)  # follows symlinks: /dev/stdout, a link to a file
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PathError(f"cannot write the dump to {path}: {exc.strerror}",
                        hint="name a new file: `shinglefs dump META_URL FILE`") from None
    with contextlib.suppress(OSError):
        own = os.fstat(1)
        if (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino):
            # This command's standard output (/dev/stdout, /proc/self/fd/1), which
            # its caller opened for it (`> out.txt`, a pipe, a socket): write it there.
            return os.fdopen(os.dup(1), "wb")
    if stat.S_ISDIR(st.st_mode):
        raise PathError(f"{path} is a directory",
                        hint="name a file in it: `shinglefs dump META_URL DIR/meta.jsonl`")
    if stat.S_ISREG(st.st_mode):
        raise PathError(f"{path} already exists; a dump never overwrites a file",
                        hint="name a new file: `shinglefs dump META_URL NEW_FILE`")
    if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        raise PathError(f"{path} is a block device; a dump never overwrites one",
                        hint="name a new file: `shinglefs dump META_URL NEW_FILE`")
    try:
        return os.fdopen(os.open(path, os.O_WRONLY | os.O_CLOEXEC), "wb")
    except OSError as exc:
        raise PathError(f"cannot open {path} to write the dump: {exc.strerror}",
                        hint="write to standard output: `shinglefs dump META_URL /dev/stdout`"
                        ) from None


def _dump_new_file(url: str, path: str, progress: Progress | None) -> dict[str, int]:
    real = os.path.realpath(path)  # a dangling link: the file it names
    where = os.path.dirname(real)
    if not os.path.isdir(where):
        raise PathError(f"cannot write {path}: directory {os.path.dirname(path) or '.'} does "
                        "not exist", hint="create it (mkdir -p DIR), then run "
                        "`shinglefs dump META_URL DIR/FILE` again")
    backend = backend_from_url(url)
    temp = None
    try:
        # mkstemp: mode 0600, like the cluster secret the dump holds.
        fd, temp = tempfile.mkstemp(dir=where, prefix=f".{os.path.basename(real)}.",
                                    suffix=".partial")
        with os.fdopen(fd, "wb") as raw:
            counts = _dump_into(backend, raw, gz=path.endswith(".gz"), progress=progress)
            raw.flush()
            os.fsync(raw.fileno())
        _link_new(temp, real, path)
        with contextlib.suppress(OSError):
            from shinglefs.zoned.fileio import sync_dir

            sync_dir(where)
        return counts
    except OSError as exc:
        raise PathError(f"cannot write the dump {path}: {exc.strerror or exc}",
                        hint="free space or pick another directory, then run "
                             "`shinglefs dump META_URL FILE` again") from None
    finally:
        backend.close()
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)


def _link_new(temp: str, real: str, path: str) -> None:
    """Give the complete dump ``temp`` its name ``real``, never replacing a file
    that appeared there meanwhile."""
    try:
        os.link(temp, real)
        return
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        if not os.path.lexists(real):  # no hard links here: rename, racing a newcomer
            os.replace(temp, real)
            return
    raise PathError(f"{path} appeared while the dump was written; it was left as it is",
                    hint="name a new file: `shinglefs dump META_URL NEW_FILE`")


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
    return _open_dump(path)[0]


def _open_dump(path: str) -> tuple[IO[bytes], bool]:
    """``open_dump`` and whether the file can be read a second time (not a pipe)."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller
        magic = raw.peek(2)[:2]  # a pipe cannot seek back
    except OSError as exc:
        raise DumpError(f"cannot read the dump {path}: {exc.strerror}",
                        hint="give the file `shinglefs dump META_URL FILE` wrote") from None
    rewindable = raw.seekable()
    if magic == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb"), rewindable  # type: ignore[return-value]
    return raw, rewindable


def _shown(line: bytes) -> str:
    text = line.strip().decode(errors="replace")
    return text if len(text) <= 40 else text[:37] + "..."


def _decode(number: int, value: Any) -> Any:
    if isinstance(value, dict):
        text = value.get("b64") if len(value) == 1 else None
        if isinstance(text, str):
            try:
                return base64.b64decode(text, validate=True)
            except binascii.Error:
                pass
        raise DumpError(f"line {number}: a value {json.dumps(value)[:40]} is not bytes as "
                        'a dump writes them ({"b64": "..."}) (damaged file)')
    if isinstance(value, list):
        raise DumpError(f"line {number}: a value of a row is a list (damaged file)")
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
                               hint=NEW_TARGET)
    if tables:
        raise LoadTargetNotEmpty(
            f"{backend.where} already holds rows in {', '.join(tables)} (an interrupted load?)",
            hint=NEW_TARGET)


def _insert(backend: Backend, shape: TableShape, rows: list[list[Any]], first: int) -> None:
    sql = (f"INSERT INTO {shape.name} ({', '.join(shape.columns)}) "
           f"VALUES ({', '.join('?' * len(shape.columns))})")

    def txn(tx: Tx) -> None:
        for row in rows:
            tx.run(sql, row)

    try:
        backend.run(txn, "write")
    except FsError as exc:
        if exc.errno != errno.EEXIST:
            raise
        raise DumpError(f"table {shape.name}, lines {first}-{first + len(rows) - 1}: the "
                        "database refuses a row (a key repeated, or a value of the wrong "
                        f"kind): the dump is damaged; {backend.where} holds part of it",
                        hint=NEW_TARGET) from None


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
                        hint="use `shinglefs load` of the release that wrote it")
    return head


def _numbered(source: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """The lines of ``source`` with their numbers (from 1); a read that fails (a
    damaged or cut gzip stream, an I/O error) is a ``DumpError``."""
    number = 0
    while True:
        try:
            line = source.readline()
        except (OSError, EOFError, zlib.error) as exc:
            why = "it ends early" if isinstance(exc, EOFError) else str(exc) or type(exc).__name__
            raise DumpError(f"the dump cannot be read after line {number}: {why} (damaged or "
                            "cut short)", hint="use a complete dump of `shinglefs dump`") from None
        if not line:
            return
        number += 1
        yield number, line


def _read_dump(source: IO[bytes], insert: Insert | None,
               progress: Progress | None) -> dict[str, int]:
    """Read a whole dump, checking each line and each table; ``insert`` (None: only
    check) takes the rows in batches, the ``format`` row once the trailer was
    checked. Returns rows per table; ``DumpError`` for anything but a complete dump."""
    shapes = {s.name: s for s in table_shapes()}
    lines = _numbered(source)
    first = next(lines, None)
    _header(first[1] if first else b"")
    counts: dict[str, int] = {}
    shape: TableShape | None = None
    digest = hashlib.sha256()
    batch: list[list[Any]] = []
    batch_at = n = 0
    deferred: tuple[TableShape, list[list[Any]], int] | None = None
    for number, line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            raise DumpError(f"line {number} of the dump is not JSON (damaged file)") from None
        if isinstance(item, list):
            if shape is None:
                raise DumpError(f"line {number}: a row outside a table (damaged file)")
            if len(item) != len(shape.columns):
                raise DumpError(f"line {number}: a row of {len(item)} values in table "
                                f"{shape.name}, which has {len(shape.columns)} columns")
            if not batch:
                batch_at = number
            batch.append([_decode(number, v) for v in item])
            digest.update(line)
            n += 1
            if len(batch) >= PAGE_ROWS and shape.name != "format":
                if insert is not None:
                    insert(shape, batch, batch_at)
                batch = []
                if progress is not None:
                    progress(shape.name, n)
        elif isinstance(item, dict) and "table" in item:
            name, columns = item.get("table"), item.get("columns")
            if shape is not None:
                raise DumpError(f"line {number}: a table starts before table {shape.name} "
                                "ended (no end record: damaged file)")
            if not isinstance(name, str) or not isinstance(columns, list):
                raise DumpError(f"line {number}: a table record without its name and columns "
                                "(damaged file)")
            if name in counts:
                raise DumpError(f"line {number}: table {name} appears a second time "
                                "(damaged file)")
            shape = shapes.get(name)
            if shape is None or tuple(columns) != shape.columns:
                raise DumpError(f"line {number}: table {name!r} does not match this schema",
                                hint="use `shinglefs load` of the release that wrote it")
            digest, batch, n = hashlib.sha256(line), [], 0
        elif isinstance(item, dict) and "end" in item:
            if shape is None or item["end"] != shape.name:
                raise DumpError(f"line {number}: the end of table {item['end']!r} outside it "
                                "(damaged file)")
            if type(item.get("rows")) is not int:
                raise DumpError(f"line {number}: the end record of table {shape.name} has no "
                                "row count (damaged file)")
            if n != item["rows"]:
                raise DumpError(f"line {number}: table {shape.name} holds {n} rows, its end "
                                f"record says {item['rows']} (damaged file)")
            if "sha256" in item and item["sha256"] != digest.hexdigest():
                raise DumpError(f"line {number}: the lines of table {shape.name} do not match "
                                "its checksum (damaged file)")
            if shape.name == "format":
                deferred = (shape, batch, batch_at)
            elif batch and insert is not None:
                insert(shape, batch, batch_at)
            if progress is not None:
                progress(shape.name, n)
            counts[shape.name] = n
            batch, shape = [], None
        elif isinstance(item, dict) and "complete" in item:
            _check_trailer(number, item, shape, counts, list(shapes))
            for extra, rest in lines:
                if rest.strip():
                    raise DumpError(f"line {extra}: more after the trailer (two dumps in one "
                                    "file, or a damaged one)")
            if insert is not None and deferred is not None:
                insert(*deferred)
            return counts
        else:
            raise DumpError(f"line {number}: {_shown(line)!r} is neither a row, a table "
                            "record nor the trailer (damaged file)")
    raise DumpError("the dump ends before its trailer (cut short)",
                    hint="use a complete dump of `shinglefs dump`")


def _check_trailer(number: int, item: dict[str, Any], shape: TableShape | None,
                   counts: dict[str, int], tables: list[str]) -> None:
    if item["complete"] is not True or shape is not None:
        raise DumpError(f"line {number}: a trailer that does not end a complete dump "
                        "(damaged file)")
    missing = [t for t in tables if t not in counts]
    if missing:
        raise DumpError(f"the dump has no table {', '.join(missing)} (incomplete dump)",
                        hint="use a complete dump of `shinglefs dump`")
    said = item.get("rows")
    if not isinstance(said, dict) or said != counts:
        wrong = ([f"{t}: {said.get(t)} rows, the dump holds {counts.get(t)}"
                  for t in sorted(set(said) | set(counts)) if said.get(t) != counts.get(t)]
                 if isinstance(said, dict) else ["no counts"])
        raise DumpError(f"line {number}: the trailer does not match the tables "
                        f"({'; '.join(wrong[:3])}): the dump is damaged")


def load_backend(source: IO[bytes], backend: Backend, progress: Progress | None = None,
                 *, check_first: bool = True) -> dict[str, int]:
    """Load a dump into the empty database behind ``backend``; returns rows per table.

    ``check_first``: read the whole dump once before writing anything (``source``
    must then be seekable), so a damaged or incomplete dump leaves the database
    as it was; without it, each line is checked as it is loaded.
    """
    if check_first:
        _read_dump(source, None, None)
        source.seek(0)
    _check_empty(backend)
    return _read_dump(source, lambda shape, rows, first: _insert(backend, shape, rows, first),
                      progress)


def load_url(path: str, url: str, progress: Progress | None = None) -> dict[str, int]:
    """Load the dump file ``path`` into the empty database at ``url``. The database
    is opened only once the dump could be, and (unless the dump is a pipe, read
    once) was checked complete: a missing or damaged dump creates no database."""
    source, rewindable = _open_dump(path)
    with source:
        if rewindable:
            _read_dump(source, None, None if progress is None else
                       lambda table, n: progress(f"checking {table}", n))
            source.seek(0)
        backend = backend_from_url(url)
        try:
            return load_backend(source, backend, progress, check_first=False)
        finally:
            backend.close()
