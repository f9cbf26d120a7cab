"""Per-operation request counts and latencies (``OpStats``), served as ``fuse_ops``
in the root's status xattr of a real mount."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyfuse3
import pytest
from tests.fuse.opskit import Request, call, handlers

from shinglefs.client.config import ClientConfig
from shinglefs.fuse.harness import MountedFileSystem
from shinglefs.fuse.operations import STATUS_XATTR, OpStats, ShingleOperations

GiB = 1024**3
KiB = 1024


# ---------------------------------------------------------------- the counter alone
def test_op_stats_snapshot_counts_and_averages_in_microseconds() -> None:
    stats = OpStats()
    assert stats.snapshot() == {}
    stats.record("write", 1_000)
    stats.record("write", 3_000)
    stats.record("flush", 500)
    stats.record("write", 2_000, threaded=True)
    snap = stats.snapshot()
    assert list(snap) == ["flush", "write"]  # sorted by name
    assert snap["write"] == {"count": 3, "mean_us": 2.0, "max_us": 3.0, "threaded": 1}
    assert snap["flush"] == {"count": 1, "mean_us": 0.5, "max_us": 0.5, "threaded": 0}
    assert json.loads(json.dumps(snap)) == snap  # what the status xattr serves


def test_op_stats_snapshot_is_a_copy_and_rounds_to_a_tenth() -> None:
    stats = OpStats()
    stats.record("read", 1_234)
    stats.record("read", 5_678)
    first = stats.snapshot()
    assert first["read"] == {"count": 2, "mean_us": 3.5, "max_us": 5.7, "threaded": 0}
    stats.record("read", 0)
    assert first["read"]["count"] == 2  # a snapshot does not change later
    assert stats.snapshot()["read"] == {"count": 3, "mean_us": 2.3, "max_us": 5.7, "threaded": 0}


# ---------------------------------------------------------------- on a real mount
def fuse_ops(mountpoint: Path) -> dict[str, dict[str, float]]:
    report = json.loads(os.getxattr(mountpoint, STATUS_XATTR.decode()))
    ops = report["fuse_ops"]
    assert isinstance(ops, dict)
    return ops


def count(ops: dict[str, dict[str, float]], op: str) -> int:
    return int(ops.get(op, {}).get("count", 0))


@pytest.mark.fuse
def test_the_status_xattr_counts_the_requests_of_the_mount(
    shinglefs_mount: MountedFileSystem, mnt: Path
) -> None:
    before = fuse_ops(shinglefs_mount.mountpoint)
    files = 6
    for i in range(files):
        path = mnt / f"f{i}.json"
        with open(path, "wb") as f:  # create, write, flush, release
            f.write(b"x" * (100 + i))
    for i in range(files):
        assert (mnt / f"f{i}.json").read_bytes() == b"x" * (100 + i)
    after = fuse_ops(shinglefs_mount.mountpoint)

    for op in ("create", "write", "flush", "release"):
        assert count(after, op) - count(before, op) >= files, (op, before.get(op), after.get(op))
    assert count(after, "getxattr") > count(before, "getxattr")  # the first status read
    for op, entry in after.items():
        assert set(entry) == {"count", "mean_us", "max_us", "threaded"}, op
        assert entry["count"] >= 1
        assert 0 <= entry["mean_us"] <= entry["max_us"], (op, entry)
    # Counts only grow.
    assert all(count(after, op) >= count(before, op) for op in before)


# ---------------------------------------------------------------- one request, one record
@pytest.fixture
def small_budget_ops(tmp_path: Path) -> Iterator[ShingleOperations]:
    """Handlers (no kernel) over a real VFS whose writes often need the slow path:
    a 64 KiB write budget, so that a waiting writer spills another file's bytes."""
    config = ClientConfig(total_buffer_bytes=64 * KiB)
    with handlers(tmp_path, config) as operations:
        yield operations


def test_each_request_is_counted_once_even_when_it_falls_back_to_a_thread(
    small_budget_ops: ShingleOperations,
) -> None:
    ops = small_budget_ops
    ctx = Request()
    flags = os.O_CREAT | os.O_RDWR
    info_a, _ = call(ops.create, pyfuse3.ROOT_INODE, b"a", 0o644, flags, ctx)
    info_b, _ = call(ops.create, pyfuse3.ROOT_INODE, b"b", 0o644, flags, ctx)
    assert call(ops.write, info_a.fh, 0, b"a" * (60 * KiB)) == 60 * KiB  # fits the budget
    assert call(ops.write, info_b.fh, 0, b"b" * (8 * KiB)) == 8 * KiB  # waits for budget
    call(ops.flush, info_a.fh)  # its bytes were spilled as a piece: a wait, in a thread
    call(ops.release, info_a.fh)
    call(ops.release, info_b.fh)
    reader = call(ops.open, ops.vfs.lookup(pyfuse3.ROOT_INODE, b"b").ino, os.O_RDONLY, ctx)
    assert bytes(call(ops.read, reader.fh, 0, 100 * KiB)) == b"b" * (8 * KiB)  # not cached yet
    call(ops.release, reader.fh)
    snap = ops.op_stats.snapshot()
    fh = ops.vfs.open(ops.vfs.lookup(pyfuse3.ROOT_INODE, b"a").ino, os.O_RDONLY)
    assert ops.vfs.read(fh, 0, 100 * KiB) == b"a" * (60 * KiB)
    ops.vfs.release(fh)
    counts = {op: count(snap, op) for op in ("create", "open", "write", "read", "flush",
                                             "release")}
    assert counts == {"create": 2, "open": 1, "write": 2, "read": 1, "flush": 1, "release": 3}
    # The write that waited for budget, the flush of a spilled slice and the uncached read
    # each ran in a worker thread; the write into the buffer did not.
    assert {op: snap[op]["threaded"] for op in ("write", "read", "flush")} == {
        "write": 1, "read": 1, "flush": 1}
