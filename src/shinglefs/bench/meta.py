"""``shinglefs bench meta``: metadata operations per second through the engine's API.

Measured per backend (SQLite always; PostgreSQL when ``meta_url`` names a
server), each figure the median of ``REPEATS`` runs on a fresh database:

- ``create_per_s``: ``create`` of N files in one directory (one transaction each);
- ``stat_per_s``: ``getattr`` of each; ``lookup_per_s``: ``lookup`` of each name;
- ``rename_per_s``: ``rename`` of each file into another directory;
- ``unlink_per_s``: ``unlink`` of each;
- ``snapshot_files_per_s``: a ``snapshot`` of a tree of N files (10
  directories, one committed slice a file) in one call, files copied per
  second; ``snapshot_vs_create`` its ratio to ``create_per_s`` of the same
  run (making the files one by one);
- ``readdir_100k_s``: listing a directory of 100,000 entries (10,000 with
  ``quick``; the entry count is reported as ``readdir_entries``) through
  ``readdir`` pages of 1,000 entries with attributes;
- ``create_per_s_clients``: 1, 4 and 16 client PROCESSES creating at once,
  each in its own directory, the same number of files each (total creates /
  wall time), and ``create_scaling_4`` / ``create_scaling_16``: the 4- and
  16-client aggregate over one client's (issue 10: on PostgreSQL the
  aggregate must grow with clients; SQLite admits one writer at a time);
  ``cpu_busy_clients``: the fraction of the machine's ``cpus`` busy during
  each (clients and database server together: at 1.0 more clients cannot
  add throughput on this machine, whatever the database does);
  ``create_per_s_4clients`` repeats the 4-client figure;
- baseline, same run, same settings: raw single-row INSERT transactions per
  second (sqlite3 with the engine's pragmas; psycopg BEGIN/INSERT/COMMIT),
  and ``create_vs_baseline`` = create_per_s / that;
- ``small_files_per_s``: N files (300; 2,000 without ``quick``) created,
  written with 4 KiB and closed, one after the other, through a real FUSE
  mount (``shinglefs mount --foreground`` in a child process, one emulated
  SMR drive in ``workdir``) whose metadata is this backend, with the URL's
  default ``synchronous=normal``; ``small_files_per_s_sync_full`` the same
  with ``?synchronous=full`` (every commit flushed before it returns).
  Target (issue 10): >= 500 per client on PostgreSQL. A machine without FUSE
  reports ``small_files_error`` instead.

PostgreSQL: the benchmark creates (and drops) its own databases on the server
of ``meta_url``, so the role needs CREATEDB. Without ``meta_url`` it starts a
private durable server (``testbed.pgcluster``, fsync on) when PostgreSQL is
installed, and reports ``postgresql_error`` when it is not; ``pg_source``
says which.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import sqlite3
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from shinglefs.meta import open_meta
from shinglefs.meta import schema as S
from shinglefs.meta.api import FIRST_COOKIE, ROOT_INO, MetaStore, SliceRef
from shinglefs.meta.backend import PAGE_SIZE, Tx
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.errors import MetaUnavailable, MetaURLError
from shinglefs.meta.pgerrors import pg_unavailable

REPEATS = 3
CLIENTS = 4
CLIENT_COUNTS = (1, 4, 16)
TARGET_CREATE_PER_S = 5000
TARGET_PG_SMALL_FILES_PER_S = 500
SMALL_FILE = 4096


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else float("inf")


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@contextlib.contextmanager
def _pg_admin(url: str) -> Iterator[Any]:
    """An autocommit connection to the server of ``url`` for CREATE/DROP DATABASE;
    connection failures become the engine's one-line MetaUnavailable."""
    import psycopg

    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        raise pg_unavailable(url, exc) from None
    try:
        yield conn
    except psycopg.Error as exc:
        raise MetaUnavailable(
            f"benchmark database management on {url} failed: {exc}",
            hint="the role in the --meta URL needs CREATEDB",
        ) from None
    finally:
        conn.close()


class _Databases:
    """Fresh databases for one backend: sqlite files in workdir, or new
    PostgreSQL databases on the server of the given URL (dropped at the end)."""

    def __init__(self, backend: str, workdir: Path, pg_url: str | None) -> None:
        self.backend = backend
        self.workdir = workdir
        self.pg_url = pg_url
        self.made: list[str] = []

    def new(self) -> str:
        n = len(self.made)
        if self.backend == "sqlite":
            path = self.workdir / f"bench-meta-{os.getpid()}-{n}.db"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            url = f"sqlite3://{path}"
        else:
            assert self.pg_url is not None
            name = f"shinglefs_bench_{os.getpid()}_{n}"
            with _pg_admin(self.pg_url) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
                conn.execute(f'CREATE DATABASE "{name}"')
            p = urlsplit(self.pg_url)
            url = urlunsplit((p.scheme, p.netloc, f"/{name}", p.query, ""))
        self.made.append(url)
        return url

    def cleanup(self) -> None:
        for url in self.made:
            if self.backend == "sqlite":
                path = urlsplit(url).path
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
            else:
                assert self.pg_url is not None
                name = urlsplit(url).path.lstrip("/")
                with _pg_admin(self.pg_url) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _fresh(url: str) -> MetaStore:
    store = open_meta(url)
    store.format("bench", str(uuid.uuid4()))
    return store


def _namespace_ops(url: str, n: int) -> dict[str, float]:
    store = _fresh(url)
    src = store.mkdir(ROOT_INO, b"src", 0o755).ino
    dst = store.mkdir(ROOT_INO, b"dst", 0o755).ino
    names = [b"file-%07d" % i for i in range(n)]
    inos: list[int] = []

    def creates() -> None:
        for name in names:
            inos.append(store.create(src, name, 0o644).ino)

    def stats() -> None:
        for ino in inos:
            store.getattr(ino)

    def lookups() -> None:
        for name in names:
            store.lookup(src, name)

    def renames() -> None:
        for name in names:
            store.rename(src, name, dst, name)

    def unlinks() -> None:
        for name in names:
            store.unlink(dst, name)

    out = {
        "create_per_s": _rate(n, _timed(creates)),
        "stat_per_s": _rate(n, _timed(stats)),
        "lookup_per_s": _rate(n, _timed(lookups)),
        "rename_per_s": _rate(n, _timed(renames)),
        "unlink_per_s": _rate(n, _timed(unlinks)),
    }
    store.close()
    return out


def _snapshot_rate(url: str, n: int) -> float:
    """Files per second a ``snapshot`` copies: a tree of ``n`` files in 10
    directories, each file holding one committed slice (its chunk and
    reference rows, its slice's refcount), copied in one call."""
    store = _fresh(url)
    src = store.mkdir(ROOT_INO, b"corpus", 0o755).ino
    shards = [store.mkdir(src, b"shard-%d" % d, 0o755).ino for d in range(10)]
    for i in range(n):
        ino = store.create(shards[i % 10], b"f-%07d" % i, 0o644).ino
        store.commit_slice(ino, 0, SliceRef(store.next_slice_id(), 0, SMALL_FILE, 0),
                           SMALL_FILE, slice_length=SMALL_FILE)
    started = time.perf_counter()
    store.snapshot(src, ROOT_INO, b"corpus@v1")
    seconds = time.perf_counter() - started
    store.close()
    return _rate(n + 11, seconds)


def _populate(store: SqlMetaStore, parent: int, n: int) -> None:
    """Fill ``parent`` with ``n`` empty files in one bulk transaction (faster
    than n creates; the listing, not the filling, is measured)."""
    # Reserve a contiguous id range past any local batch.
    last = store.backend.run(lambda tx: tx.one(S.ALLOC_IDS, (n, "inode")), "autocommit")[0]
    base = last - n
    now = time.time_ns()

    def txn(tx: Tx) -> None:
        for i in range(n):
            ino = base + i
            tx.run(S.INS_DENTRY, (parent, b"entry-%07d" % i, ino, FIRST_COOKIE + i))
            tx.run(
                S.INS_INODE,
                (ino, 0o100644, 0, 0, 1, 0, now, now, now, 0, 1, 0, parent, FIRST_COOKIE, None, None, None),
            )  # fmt: skip
        tx.run("UPDATE inodes SET next_cookie = ? WHERE ino = ?", (FIRST_COOKIE + n, parent))
        tx.run(S.ADD_COUNTERS, (0, n, 0))

    store.backend.run(txn, "write")


def _readdir(url: str, n: int) -> float:
    store = _fresh(url)
    assert isinstance(store, SqlMetaStore)
    big = store.mkdir(ROOT_INO, b"big", 0o755).ino
    _populate(store, big, n)

    def listing() -> None:
        cookie, count = 0, 0
        while batch := store.readdir(big, cookie, 1000):
            count += len(batch)
            cookie = batch[-1].cookie
        if count != n:
            raise AssertionError(f"listed {count} of {n} entries")

    seconds = _timed(listing)
    store.close()
    return round(seconds, 4)


def _client(url: str, index: int, n: int, barrier: Any, out: Any) -> None:
    store = open_meta(url)
    parent = store.mkdir(ROOT_INO, b"client-%d" % index, 0o755).ino
    barrier.wait()
    t0 = time.perf_counter()
    for i in range(n):
        store.create(parent, b"f-%07d" % i, 0o644)
    out.put((index, time.perf_counter() - t0))
    store.close()


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far (/proc/stat; zeros elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _concurrent_creates(url: str, clients: int, n_per_client: int) -> tuple[float, float]:
    """Creates/s of ``clients`` processes creating ``n_per_client`` files each at
    once (from the barrier to the last one done), and the fraction of the
    machine's CPU busy meanwhile (every process: clients, database server)."""
    _fresh(url).close()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(clients + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_client, args=(url, i, n_per_client, barrier, out))
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    barrier.wait(timeout=300)
    busy0, total0 = cpu_ticks()
    t0 = time.perf_counter()
    for _ in procs:
        out.get(timeout=900)
    wall = time.perf_counter() - t0
    busy1, total1 = cpu_ticks()
    for p in procs:
        p.join(60)
    busy = (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
    return _rate(clients * n_per_client, wall), busy


def _client_scaling(dbs: _Databases, n_per_client: int, repeats: int) -> dict[str, Any]:
    """``create_per_s_clients`` and the scaling figures (module docstring)."""
    rates: dict[str, float] = {}
    busy: dict[str, float] = {}
    for k in CLIENT_COUNTS:
        runs = [_concurrent_creates(dbs.new(), k, n_per_client) for _ in range(repeats)]
        rates[str(k)] = _median([r for r, _ in runs])
        busy[str(k)] = round(statistics.median(b for _, b in runs), 3)
    one = rates["1"]
    return {
        "create_per_s_clients": rates,
        "cpu_busy_clients": busy,
        "cpus": os.cpu_count(),
        "create_files_per_client": n_per_client,
        "create_scaling_4": round(rates["4"] / one, 3) if one else None,
        "create_scaling_16": round(rates["16"] / one, 3) if one else None,
        "create_per_s_4clients": rates["4"],
    }


def _sqlite_baseline(workdir: Path, n: int) -> float:
    path = workdir / f"bench-raw-{os.getpid()}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, name BLOB NOT NULL)")

    def inserts() -> None:
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (k, name) VALUES (?, ?)", (i, b"file-%07d" % i))
            conn.execute("COMMIT")

    rate = _rate(n, _timed(inserts))
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return rate


def _pg_baseline(url: str, n: int) -> float:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE raw_baseline (k BIGINT PRIMARY KEY, name BYTEA NOT NULL)")

        def inserts() -> None:
            for i in range(n):
                conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
                conn.execute(
                    "INSERT INTO raw_baseline (k, name) VALUES (%s, %s)", (i, b"file-%07d" % i)
                )
                conn.execute("COMMIT")

        return _rate(n, _timed(inserts))


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def _with_query(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


def _small_files(url: str, workdir: Path, n: int) -> float:
    """Files/s of create + 4 KiB write + close through a fresh mount on ``url``."""
    from shinglefs.fuse.harness import GiB, MountedFileSystem, default_drives

    base = workdir / f"bench-meta-mount-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    data = base / "data"
    data.mkdir(parents=True)
    drives = default_drives(data, smr_drives=1, smr_bytes=4 * GiB, conventional_bytes=0)
    fs = MountedFileSystem(data, base / "mnt", meta_url=url, drives=drives)
    try:
        fs.format()
        fs.start()
        directory = fs.mountpoint / "small"
        directory.mkdir()
        payload = b"s" * SMALL_FILE

        def files() -> None:
            for i in range(n):
                fd = os.open(directory / f"f{i:06d}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
                try:
                    os.write(fd, payload)
                finally:
                    os.close(fd)

        return _rate(n, _timed(files))
    finally:
        fs.stop()
        shutil.rmtree(base, ignore_errors=True)


def _small_files_figures(dbs: _Databases, n: int, repeats: int) -> dict[str, Any]:
    """``small_files_per_s`` (default synchronous=normal) and ``..._sync_full``,
    medians of ``repeats`` fresh file systems each, the modes alternated."""
    runs: dict[str, list[float]] = {"small_files_per_s": [], "small_files_per_s_sync_full": []}
    try:
        for _ in range(repeats):
            runs["small_files_per_s"].append(_small_files(dbs.new(), dbs.workdir, n))
            full = _with_query(dbs.new(), "synchronous=full")
            runs["small_files_per_s_sync_full"].append(_small_files(full, dbs.workdir, n))
    except RuntimeError as exc:  # the mount did not come up (no FUSE here): say so
        return {"small_files_error": str(exc).splitlines()[0]}
    out: dict[str, Any] = {key: _median(values) for key, values in runs.items()}
    out.update({f"{key}_runs": values for key, values in runs.items()})
    out["small_files"] = n
    return out


def _bench_backend(
    backend: str, workdir: Path, pg_url: str | None, n: int, n_readdir: int, repeats: int,
    n_small: int,
) -> dict[str, Any]:
    dbs = _Databases(backend, workdir, pg_url)
    try:
        runs = [_namespace_ops(dbs.new(), n) for _ in range(repeats)]
        result: dict[str, Any] = {key: _median([r[key] for r in runs]) for key in runs[0]}
        result["create_per_s_runs"] = [r["create_per_s"] for r in runs]
        result["readdir_100k_s"] = round(
            statistics.median(_readdir(dbs.new(), n_readdir) for _ in range(repeats)), 4
        )
        result["readdir_entries"] = n_readdir
        result["snapshot_files_per_s"] = _median([_snapshot_rate(dbs.new(), n)
                                                  for _ in range(repeats)])
        result["snapshot_vs_create"] = round(
            result["snapshot_files_per_s"] / result["create_per_s"], 2)
        result.update(_client_scaling(dbs, max(100, n // CLIENT_COUNTS[-1]), repeats))
        probe = open_meta(dbs.new())
        result["durability"] = probe.durability
        probe.close()
        if backend == "sqlite":
            base = [_sqlite_baseline(workdir, n) for _ in range(repeats)]
            result["baseline"] = "raw sqlite3 single-row INSERT transactions/s, same pragmas"
        else:
            base = [_pg_baseline(dbs.new(), n) for _ in range(repeats)]
            result["baseline"] = "raw psycopg BEGIN SERIALIZABLE/INSERT/COMMIT transactions/s"
        result["baseline_txn_per_s"] = _median(base)
        result["create_vs_baseline"] = round(
            result["create_per_s"] / result["baseline_txn_per_s"], 3
        )
        result.update(_small_files_figures(dbs, n_small, repeats))
        return result
    finally:
        dbs.cleanup()


def run(quick: bool, workdir: Path, meta_url: str | None = None, **_: Any) -> dict[str, Any]:
    """Benchmark SQLite (always) and PostgreSQL (``meta_url``'s server, else a
    private one when PostgreSQL is installed)."""
    if meta_url is not None and not urlsplit(meta_url).scheme.startswith("postgres"):
        raise MetaURLError(
            f"--meta {meta_url!r} is not a PostgreSQL URL",
            hint="SQLite is always measured; --meta takes postgresql://user@host:port/db",
        )
    if meta_url is not None:
        with _pg_admin(meta_url):  # fail now, before minutes of SQLite runs
            pass
    n = 2000 if quick else 20_000
    n_readdir = 10_000 if quick else 100_000
    n_small = 300 if quick else 2000
    repeats = REPEATS
    out: dict[str, Any] = {
        "quick": quick,
        "files_per_run": n,
        "repeats": repeats,
        "clients": list(CLIENT_COUNTS),
        "target_create_per_s": TARGET_CREATE_PER_S,
    }
    out["sqlite"] = _bench_backend("sqlite", workdir, None, n, n_readdir, repeats, n_small)
    out["meets_target"] = out["sqlite"]["create_per_s"] >= TARGET_CREATE_PER_S
    with contextlib.ExitStack() as stack:
        source = "--meta"
        if meta_url is None:
            from shinglefs.testbed.pgcluster import PgClusterError, private_cluster

            try:
                cluster = stack.enter_context(
                    private_cluster("shinglefs-bench-meta-pg-", durable=True))
            except PgClusterError as exc:  # no PostgreSQL here: SQLite's figures stand
                out["postgresql_error"] = str(exc).splitlines()[0]
                return out
            meta_url = cluster.url()
            source = "private PostgreSQL (fsync on)"
        pg_n = max(500, n // 4)
        out["postgresql"] = _bench_backend(
            "postgresql", workdir, meta_url, pg_n, n_readdir, repeats, n_small
        )
        out["postgresql"]["files_per_run"] = pg_n
        out["postgresql"]["pg_source"] = source
        # bench report reads ``targets`` (field -> at least this).
        out["targets"] = {"postgresql.small_files_per_s": TARGET_PG_SMALL_FILES_PER_S,
                          "postgresql.create_scaling_16": 1.0}
    return out
