"""A mount whose metadata lives in PostgreSQL (namespace calls leave the event loop)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.pgcluster import PgCluster

from shinglefs.fuse.harness import MountedFileSystem, default_drives, drop_caches

pytestmark = [pytest.mark.fuse, pytest.mark.postgres]

GiB = 1024**3


@pytest.fixture
def pg_mount(tmp_path: Path) -> Iterator[MountedFileSystem]:
    # Outside pytest's basetemp, which concurrent pytest sessions re-chmod and prune.
    base = Path(tempfile.mkdtemp(prefix="shinglefs-fuse-pg-", dir="/var/tmp"))
    cluster = PgCluster.start(base)
    try:
        data = tmp_path / "data"
        data.mkdir()
        fs = MountedFileSystem(data, tmp_path / "mnt", meta_url=cluster.new_database(),
                               drives=default_drives(data, smr_drives=1, smr_bytes=4 * GiB,
                                                     conventional_bytes=0))
        fs.format()
        fs.start()
        try:
            yield fs
        finally:
            assert fs.stop() == 0, fs.log_text()
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_files_and_namespace_on_a_postgresql_backed_mount(pg_mount: MountedFileSystem) -> None:
    root = pg_mount.mountpoint
    (root / "d").mkdir()
    data = os.urandom(3 * 1024 * 1024)
    (root / "d" / "f").write_bytes(data)
    os.rename(root / "d" / "f", root / "d" / "g")
    os.symlink("g", root / "d" / "link")
    os.setxattr(root / "d" / "g", "user.k", b"v")
    for i in range(50):
        (root / "d" / f"s{i}").write_bytes(b"x" * i)
    drop_caches()
    assert (root / "d" / "link").read_bytes() == data
    assert os.getxattr(root / "d" / "g", "user.k") == b"v"
    assert sorted(os.listdir(root / "d")) == sorted(["g", "link"] + [f"s{i}" for i in range(50)])
    assert all((root / "d" / f"s{i}").stat().st_size == i for i in range(50))


def _threaded(fs: MountedFileSystem) -> dict[str, int]:
    """Requests per operation the mount ran in worker threads so far."""
    import json

    report = json.loads(os.getxattr(fs.mountpoint, "user.shinglefs.status"))
    return {op: int(v.get("threaded", 0)) for op, v in report["fuse_ops"].items()}


def test_namespace_requests_leave_the_loop_only_when_others_wait(
        pg_mount: MountedFileSystem) -> None:
    """Alone, a request runs on the event loop (no thread hop); while other
    requests wait, namespace requests go to worker threads (operations.py)."""
    import threading

    root = pg_mount.mountpoint
    (root / "seq").mkdir()
    before = _threaded(pg_mount)
    for i in range(20):  # one process, one request at a time
        (root / "seq" / f"f{i}").write_bytes(b"x" * 4096)
    after = _threaded(pg_mount)
    for op in ("create", "lookup", "flush"):
        assert after.get(op, 0) == before.get(op, 0), op

    (root / "par").mkdir()
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for i in range(40):
                (root / "par" / f"w{k}-{i}").write_bytes(b"y" * 4096)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    busy = _threaded(pg_mount)
    assert sum(busy.get(op, 0) - after.get(op, 0) for op in ("create", "lookup")) > 0
    assert len(os.listdir(root / "par")) == 8 * 40
