"""Fixtures shared by every layer's tests.

``shinglefs_mount`` / ``mnt``: one real FUSE mount (a child process) shared by
the session, used by tests/fuse and tests/workloads.

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


# The mount tests are the product's main contract: on a machine without FUSE
# they fail rather than skip, unless the runner says so explicitly.
ALLOW_NO_FUSE = os.environ.get("SHINGLEFS_ALLOW_NO_FUSE") == "1"


@pytest.fixture(scope="session")
def shinglefs_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MountedFileSystem]:
    if not _fuse_usable():
        message = "needs /dev/fuse and fusermount3 (apt-get install fuse3)"
        if ALLOW_NO_FUSE:
            pytest.skip(message)
        pytest.fail(message + "; set SHINGLEFS_ALLOW_NO_FUSE=1 to skip the mount tests")
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
