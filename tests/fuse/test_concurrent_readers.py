"""Eight readers of eight files at once through one mount, cold, read bit-exact
(issue 10: an epoch read by several DataLoader workers).

Correctness only: the speed of the same workload is ``read_scaling_8`` in
``shinglefs bench mount``. The mount's read cache is made small, so the
readers' read-ahead is more than it holds: the windows shrink to share it,
queued runs are claimed by readers and extents are evicted under them.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shinglefs.fuse.harness import MountedFileSystem, drop_caches

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
READERS = 8
FILE_BYTES = 16 * MiB
CACHE_MIB = 16


@pytest.fixture
def small_cache_fs(tmp_path: Path) -> Iterator[MountedFileSystem]:
    with MountedFileSystem.with_read_cache(tmp_path, CACHE_MIB) as fs:
        yield fs


def contents(i: int) -> bytes:
    """File ``i``: random bytes of its own (a file read in another's place shows)."""
    return np.random.default_rng(1000 + i).integers(0, 256, FILE_BYTES, dtype=np.uint8).tobytes()


def read_whole(path: Path, block: int) -> bytes:
    out = bytearray()
    view = memoryview(bytearray(block))
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            out += view[:n]
    return bytes(out)


def test_eight_cold_readers_of_eight_files_read_bit_exact(
        small_cache_fs: MountedFileSystem) -> None:
    root = small_cache_fs.mountpoint / "epoch"
    root.mkdir()
    digests = []
    for i in range(READERS):
        data = contents(i)
        (root / f"shard{i}").write_bytes(data)
        digests.append(hashlib.sha256(data).hexdigest())
    small_cache_fs.stop()
    small_cache_fs.start()  # a fresh daemon: its read cache is empty
    drop_caches()  # and the kernel's too, where we may (root)

    read: dict[int, str] = {}
    errors: list[BaseException] = []
    gate = threading.Barrier(READERS)

    def reader(i: int) -> None:
        try:
            gate.wait()
            # Unaligned reads on odd readers: the kernel's requests differ too.
            data = read_whole(root / f"shard{i}", MiB if i % 2 == 0 else 300 * 1024 + 4096)
            read[i] = hashlib.sha256(data).hexdigest()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert os.path.ismount(small_cache_fs.mountpoint), small_cache_fs.log_text()
    for i in range(READERS):
        assert read[i] == digests[i], f"shard{i} read back wrong"
