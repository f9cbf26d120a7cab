"""Fixtures of the storage-server tests.

``meta_url`` and ``any_meta_url`` are file systems on storage servers
(``format --servers``, no drives of their own); a module that needs another
format (test_server_process: one emulated drive) overrides them by name.
``any_backend_url`` is the empty metadata database under ``any_meta_url``, on
SQLite and on PostgreSQL (a database of the module's private ``pg_cluster``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.test_server_process import Server
from tests.support.pgcluster import PgCluster, private_cluster

from shinglefs.client.filesystem import format_filesystem
from shinglefs.meta import open_meta
from shinglefs.meta.api import MetaStore

MiB = 1024 * 1024


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    """Servers a test starts (``Server`` subprocesses), killed at its end if still running."""
    started: list[Server] = []
    yield started
    for server in started:
        server.kill()


@pytest.fixture
def meta_url(tmp_path: Path) -> str:
    """A file system on storage servers (``format --servers``): no drives of its own."""
    url = f"sqlite3://{tmp_path / 'meta.db'}"
    format_filesystem(url, [], servers=True, chunk_size=16 * MiB)
    return url


@pytest.fixture
def meta(meta_url: str) -> Iterator[MetaStore]:
    store = open_meta(meta_url)
    yield store
    store.close()


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PgCluster]:
    """A private PostgreSQL cluster, one per test module that asks for it."""
    with private_cluster("shinglefs-server-pg-") as cluster:
        yield cluster


@pytest.fixture(params=[pytest.param("sqlite", id="sqlite"),
                        pytest.param("postgresql", id="postgresql",
                                     marks=pytest.mark.postgres)])
def any_backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty metadata database on each backend (SQLite in ``tmp_path``; PostgreSQL)."""
    if request.param == "sqlite":
        return f"sqlite3://{tmp_path / 'meta.db'}"
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    return cluster.new_database()


@pytest.fixture
def any_meta_url(any_backend_url: str) -> str:
    """A file system on storage servers, its metadata on each backend."""
    format_filesystem(any_backend_url, [], servers=True, chunk_size=16 * MiB)
    return any_backend_url
