"""Fixtures shared by every layer's tests.

``shinglefs_mount`` / ``mnt``: one real FUSE mount (a child process) shared by
the session, used by tests/fuse and tests/workloads.

Each test gets a fresh directory on the mount (``mnt``) and a local directory
(``local``) on the same disk for differential checks. The mount is checked to
be alive after every test, so a test that breaks it fails by name.

``descriptor_guard`` (autouse, session): the run fails if this process ends
it holding many more open descriptors than it began with (a store, node,
drive, connection or pipe a test or fixture never closed).
"""

from __future__ import annotations

import collections
import gc
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from shinglefs.fuse.harness import MountedFileSystem


def _fuse_usable() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


# Descriptors the run's process may gain from its start to its end. A run that
# closes what it opens ends within a few dozen of where it began (the imports'
# and the interpreter's own, a kept log file); a leak of one drive per test
# (three descriptors) trips it within ~70 tests. The bound sits well below
# 1024, where select() stops working (a leak once broke every PostgreSQL
# transaction of the full run that way), and far below the usual ulimit.
DESCRIPTOR_GROWTH_BOUND = 200


def _open_descriptors() -> dict[int, str]:
    """This process's open descriptors and what each names (``/proc/self/fd``)."""
    out: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return out


@pytest.fixture(scope="session", autouse=True)
def descriptor_guard() -> Iterator[None]:
    """Fail the run when it leaks descriptors (torn down last: after every
    other session fixture, so a mount or cluster the session holds is closed)."""
    before = _open_descriptors()
    yield
    gc.collect()  # an unreachable file object closes itself: not a leak that lasts
    after = _open_descriptors()
    grown = len(after) - len(before)
    if grown > DESCRIPTOR_GROWTH_BOUND:
        new = collections.Counter(
            re.sub(r"\d+", "N", os.path.basename(target) or target)
            for fd, target in after.items() if before.get(fd) != target)
        top = ", ".join(f"{n} x {what}" for what, n in new.most_common(8))
        pytest.fail(f"the run leaked descriptors: {len(before)} open at its start, "
                    f"{len(after)} at its end (bound +{DESCRIPTOR_GROWTH_BOUND}); "
                    f"new ones: {top}", pytrace=False)


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
