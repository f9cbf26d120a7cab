"""Fixtures of the storage-server tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.test_server_process import Server

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
