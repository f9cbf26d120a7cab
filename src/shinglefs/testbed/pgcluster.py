"""A private PostgreSQL cluster for one test session or one benchmark run.

``PgCluster.start(base_dir)`` runs ``initdb`` into ``base_dir`` and starts the
server with ``pg_ctl -w`` on a free TCP port of 127.0.0.1 and a unix socket in
the same directory; ``new_database()`` creates an empty database and returns
its ``postgresql://`` URL; ``stop()`` shuts the server down (``-m immediate``:
the data is thrown away anyway). ``start(..., listen=["10.213.7.1/24"])`` also
listens on those interface addresses and trusts clients of their networks
(the test hosts of ``testbed.netns``); ``url(db, host=...)`` names one.

PostgreSQL refuses to run as root, so as root every server-side command runs
through ``runuser -u postgres --`` and ``base_dir`` is handed to that user.
The binaries are found in ``/usr/lib/postgresql/<newest>/bin`` (or on PATH).
Nothing is skipped: a missing installation or a server that cannot start raises
``PgClusterError`` with the server log's tail, so the tests fail loudly.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

PG_ROOT = Path("/usr/lib/postgresql")
SYSTEM_USER = "postgres"


class PgClusterError(RuntimeError):
    """The private cluster could not be created or started."""


def find_bindir() -> Path:
    """The newest installed PostgreSQL bin directory holding initdb and pg_ctl."""
    candidates = []
    if PG_ROOT.is_dir():
        for child in PG_ROOT.iterdir():
            if (child / "bin" / "initdb").exists() and child.name.split(".")[0].isdigit():
                candidates.append((int(child.name.split(".")[0]), child / "bin"))
    if candidates:
        return max(candidates)[1]
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise PgClusterError(
        "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb, no initdb on PATH); "
        "install it with scripts/setup.sh (apt-get install postgresql)"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgCluster:
    """A running private cluster. Use ``start``; call ``stop`` when done."""

    def __init__(self, base_dir: Path, bindir: Path, port: int, user: str) -> None:
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.socket_dir = base_dir / "sock"
        self.log_file = base_dir / "server.log"
        self.bindir = bindir
        self.port = port
        self.user = user
        self._counter = itertools.count(1)
        self._prefix = f"t{os.getpid()}"

    # -- life cycle ----------------------------------------------------------------------

    @staticmethod
    def _as_server_user() -> list[str]:
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                raise PgClusterError("running as root but `runuser` is missing")
            return ["runuser", "-u", SYSTEM_USER, "--"]
        return []

    @classmethod
    def start(cls, base_dir: Path, port: int | None = None, *, durable: bool = False,
              listen: Sequence[str] = ()) -> PgCluster:
        """initdb + start. ``durable=False`` (tests) turns fsync off; True keeps
        the server's durable defaults (fsync, synchronous_commit) for benchmarks.
        ``listen``: interfaces (``ADDRESS/PREFIX``) to listen on besides 127.0.0.1,
        each network trusted in pg_hba.conf as 127.0.0.1 is."""
        interfaces = [ipaddress.ip_interface(i) for i in listen]
        bindir = find_bindir()
        base_dir.mkdir(parents=True, exist_ok=True)
        wrap = cls._as_server_user()
        user = SYSTEM_USER if wrap else (os.environ.get("USER") or "postgres")
        if wrap:
            try:
                shutil.chown(base_dir, SYSTEM_USER, SYSTEM_USER)
            except (LookupError, PermissionError) as exc:
                raise PgClusterError(
                    f"cannot hand {base_dir} to user {SYSTEM_USER}: {exc}"
                ) from exc
            # The server user must be able to reach base_dir through its parents.
            for parent in base_dir.parents:
                if parent == Path("/"):
                    break
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o001)
        cluster = cls(base_dir, bindir, port or free_port(), user)
        cluster.socket_dir.mkdir(exist_ok=True)
        if wrap:
            shutil.chown(cluster.socket_dir, SYSTEM_USER, SYSTEM_USER)
        cluster._server(
            [
                str(bindir / "initdb"),
                "-D", str(cluster.data_dir),
                "-U", user,
                "-A", "trust",
                "-E", "UTF8",
                "--no-sync",
                "--locale=C",
            ],
            what="initdb",
        )  # fmt: skip
        if interfaces:
            with open(cluster.data_dir / "pg_hba.conf", "a") as hba:
                for interface in interfaces:
                    hba.write(f"host all all {interface.network} trust\n")
        addresses = ",".join(["127.0.0.1", *(str(i.ip) for i in interfaces)])
        options = (
            f"-c listen_addresses={addresses} -c port={cluster.port} "
            f"-c unix_socket_directories={cluster.socket_dir} "
            + ("" if durable else "-c fsync=off -c synchronous_commit=off -c full_page_writes=off ")
            + "-c max_connections=200 -c shared_buffers=128MB -c max_locks_per_transaction=256"
        )
        cluster._server(
            [
                str(bindir / "pg_ctl"),
                "-D", str(cluster.data_dir),
                "-l", str(cluster.log_file),
                "-o", options,
                "-w", "-t", "60",
                "start",
            ],
            what="pg_ctl start",
        )  # fmt: skip
        return cluster

    def _server(self, argv: list[str], what: str) -> None:
        try:
            proc = subprocess.run(
                [*self._as_server_user(), *argv],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=str(self.base_dir),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PgClusterError(f"{what} failed: {exc}") from exc
        if proc.returncode != 0:
            tail = ""
            if self.log_file.exists():
                tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-20:])
            raise PgClusterError(
                f"{what} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{tail}"
            )

    def stop(self) -> None:
        """Stop the server (immediate mode). Idempotent."""
        if not (self.data_dir / "postmaster.pid").exists():
            return
        self._server(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
            what="pg_ctl stop",
        )

    # -- databases -------------------------------------------------------------------------

    def url(self, database: str = "postgres", host: str = "127.0.0.1") -> str:
        return f"postgresql://{self.user}@{host}:{self.port}/{database}"

    def new_database(self, name: str | None = None) -> str:
        """Create an empty database (from template0) and return its URL.

        PostgreSQL >= 15 copies the template's files (STRATEGY FILE_COPY):
        ~50 ms against ~370 ms for the default WAL_LOG strategy here."""
        import psycopg

        if name is None:
            name = f"{self._prefix}_{next(self._counter)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            strategy = " STRATEGY FILE_COPY" if conn.info.server_version >= 150000 else ""
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0{strategy}')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop a database made by ``new_database`` (terminating its connections)."""
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def private_cluster(prefix: str = "shinglefs-pgcluster-", listen: Sequence[str] = (), *,
                    durable: bool = False) -> Iterator[PgCluster]:
    """A private cluster for one test session or benchmark run, removed afterwards
    (``durable``: see ``PgCluster.start``).

    Its data lives in a fresh directory of /var/tmp, outside pytest's basetemp
    (concurrent pytest sessions prune each other's numbered temp dirs, and the
    server's data must outlive that). ``PgClusterError`` when it cannot start
    (tests/support/pgcluster.py turns that into a failed test, never a skip)."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    try:
        cluster = PgCluster.start(base, listen=list(listen), durable=durable)
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
