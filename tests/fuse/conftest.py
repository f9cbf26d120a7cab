"""Fixtures of the FUSE tests: one real mount (a child process) shared by the session.

Each test gets a fresh directory on the mount (``mnt``) and a local directory
(``local``) on the same disk for differential checks. The mount is checked to
be alive after every test, so a test that breaks it fails by name.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from shinglefs.fuse.harness import MountedFileSystem


def _fuse_usable() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


@pytest.fixture(scope="session")
def shinglefs_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MountedFileSystem]:
    if not _fuse_usable():
        pytest.skip("needs /dev/fuse and fusermount3")
    base = tmp_path_factory.mktemp("fusefs")
    fs = MountedFileSystem(base / "data", base / "mnt")
    fs.format()
    fs.start()
    try:
        yield fs
    finally:
        code = fs.stop()
        assert code == 0, f"the mount process exited with {code}:\n{fs.log_text()}"


@pytest.fixture
def mnt(shinglefs_mount: MountedFileSystem, request: pytest.FixtureRequest) -> Iterator[Path]:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:80]
    path = shinglefs_mount.mountpoint / name
    path.mkdir()
    yield path
    assert os.path.ismount(shinglefs_mount.mountpoint), (
        f"the mount died during {request.node.name}:\n{shinglefs_mount.log_text()}"
    )
