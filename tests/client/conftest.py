"""Fixtures: a real file system on real SQLite files and emulated SMR drives on sparse files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fsfixtures import FsFactory

from shinglefs.client.api import ShingleFS
from shinglefs.client.vfs import VFS


@pytest.fixture
def fs_factory(tmp_path: Path) -> Iterator[FsFactory]:
    factory = FsFactory(tmp_path)
    yield factory
    factory.close_all()


@pytest.fixture
def vfs(fs_factory: FsFactory) -> VFS:
    return fs_factory.vfs()


@pytest.fixture
def pyfs(vfs: VFS) -> ShingleFS:
    return ShingleFS(vfs)
